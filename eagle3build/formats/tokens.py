"""The tokens file format (``data/{train,eval}.tokens.safetensors``), written by ``prepare_data``.

One safetensors file: ``input_ids`` int32 [sum T_i], ``loss_mask`` uint8 [sum T_i],
``offsets`` int64 [n+1] (sample i is ``[offsets[i], offsets[i+1])``), ``sample_ids`` uint8
[bytes]: the UTF-8 bytes of the JSON list of the n sample ids; metadata ``schema``
(``TOKENS_SCHEMA``). The ids are a tensor, not metadata: safetensors caps the JSON header at
100 MB, which ids in the header filled at about 1.8 M samples (schema ``eagle3build.tokens/1``
kept them there; ``read_tokens`` still reads such files). Read by ``capture_hidden_states``,
``build_vocab_map``, ``vllm.capture`` and the compat report's capture probe.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..atomic import atomic_path
from .conversation_files import DataError

TOKENS_SCHEMA = "eagle3build.tokens/2"
OLD_SCHEMAS = ("eagle3build.tokens/1",)  # read too: sample ids in the header's metadata


def write_tokens(path: str | os.PathLike, samples: list[tuple[str, np.ndarray, np.ndarray]]) -> None:
    """Write samples ``(id, input_ids int32 [T_i], loss_mask uint8 [T_i])`` as one safetensors file.

    Tensors: ``input_ids`` int32 [sum T_i], ``loss_mask`` uint8 [sum T_i], ``offsets``
    int64 [n+1] (sample i is ``[offsets[i], offsets[i+1])``), ``sample_ids`` uint8 (the JSON list
    of ids, UTF-8; outside the header, whose size safetensors caps). Metadata: ``schema``. Equal
    samples give equal bytes (the header's keys sorted). Written to a temporary and renamed.
    """
    from safetensors.numpy import save_file

    lengths = [len(s[1]) for s in samples]
    offsets = np.zeros(len(samples) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tensors = {
        "input_ids": np.concatenate([s[1] for s in samples]) if samples else np.zeros(0, np.int32),
        "loss_mask": np.concatenate([s[2] for s in samples]) if samples else np.zeros(0, np.uint8),
        "offsets": offsets,
        "sample_ids": np.frombuffer(json.dumps([s[0] for s in samples]).encode("utf-8"), dtype=np.uint8),
    }
    meta = {"schema": TOKENS_SCHEMA}
    with atomic_path(path) as tmp:
        # save_file streams the tensors to the file; save() returned the whole file as one bytes
        # object, which splicing the sorted header into copied again: for a 500 MB file (1e8 tokens)
        # the peak above the samples was 1.7 GB, with save_file and the header sorted in place 0.24 GB.
        save_file(tensors, str(tmp), metadata=meta)
        _sort_header(tmp)


def _sort_header(path: Path) -> None:
    """Rewrite a safetensors file's JSON header in place with its keys sorted, padded with spaces
    to the length it had (the tensors' offsets are relative to the header's end, so they stay).

    safetensors' writer keeps the metadata in a Rust HashMap (safetensors/src/tensor.rs) and
    writes its keys in a random order: equal tokens would be other bytes, and Snakemake's
    checksum of a small input (< 1 MB) would replan the shards after a rerun that changed
    nothing. The same header with its keys sorted, padded to the same length as safetensors
    pads it, gives equal bytes for equal tokens.
    """
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.dumps(json.loads(f.read(n)), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        if len(header) <= n:
            f.seek(8)
            f.write(header + b" " * (n - len(header)))


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
    """Read a file written by ``write_tokens`` (schema ``TOKENS_SCHEMA``, or an older one of
    ``OLD_SCHEMAS``, whose sample ids are in the header's metadata).

    Raises:
        DataError: not a tokens file of these schemas, or its ids do not match its offsets.
    """
    from safetensors import safe_open
    from safetensors.numpy import load_file

    with safe_open(os.fspath(path), framework="np") as f:
        meta = f.metadata() or {}
    schema = meta.get("schema")
    if schema != TOKENS_SCHEMA and schema not in OLD_SCHEMAS:
        raise DataError(f"{path}: schema {schema!r}, expected {TOKENS_SCHEMA!r}")
    t = load_file(os.fspath(path))
    ids = json.loads(t.pop("sample_ids").tobytes().decode("utf-8")) if schema == TOKENS_SCHEMA \
        else json.loads(meta["sample_ids"])
    if len(ids) != len(t["offsets"]) - 1:
        raise DataError(f"{path}: {len(ids)} sample ids for {len(t['offsets']) - 1} samples")
    return TokenFile(t["input_ids"], t["loss_mask"], t["offsets"], ids)
