"""The tokens file format (``data/{train,eval}.tokens.safetensors``), written by ``prepare_data``.

One safetensors file: ``input_ids`` int32 [sum T_i], ``loss_mask`` uint8 [sum T_i],
``offsets`` int64 [n+1] (sample i is ``[offsets[i], offsets[i+1])``); metadata ``schema``
(``TOKENS_SCHEMA``) and ``sample_ids`` (JSON list). Read by ``capture_hidden_states``,
``build_vocab_map``, ``vllm_capture`` and the compat report's capture probe.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .atomic import atomic_path
from .conversations import DataError

TOKENS_SCHEMA = "eagle3build.tokens/1"


def write_tokens(path: str | os.PathLike, samples: list[tuple[str, np.ndarray, np.ndarray]]) -> None:
    """Write samples ``(id, input_ids int32 [T_i], loss_mask uint8 [T_i])`` as one safetensors file.

    Tensors: ``input_ids`` int32 [sum T_i], ``loss_mask`` uint8 [sum T_i], ``offsets``
    int64 [n+1] (sample i is ``[offsets[i], offsets[i+1])``). Metadata: ``schema``,
    ``sample_ids`` (JSON list). Equal samples give equal bytes (the header's keys sorted).
    """
    from safetensors.numpy import save

    lengths = [len(s[1]) for s in samples]
    offsets = np.zeros(len(samples) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tensors = {
        "input_ids": np.concatenate([s[1] for s in samples]) if samples else np.zeros(0, np.int32),
        "loss_mask": np.concatenate([s[2] for s in samples]) if samples else np.zeros(0, np.uint8),
        "offsets": offsets,
    }
    meta = {"schema": TOKENS_SCHEMA, "sample_ids": json.dumps([s[0] for s in samples])}
    raw = save(tensors, metadata=meta)
    # safetensors' writer keeps the metadata in a Rust HashMap (safetensors/src/tensor.rs) and
    # writes its keys in a random order: equal tokens would be other bytes, and Snakemake's
    # checksum of a small input (< 1 MB) would replan the shards after a rerun that changed
    # nothing. The same header with its keys sorted, padded to the same length as
    # safetensors pads it, gives equal bytes for equal tokens.
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.dumps(json.loads(raw[8:8 + n]), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    if len(header) <= n:
        raw = raw[:8] + header + b" " * (n - len(header)) + raw[8 + n:]
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(raw)


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
