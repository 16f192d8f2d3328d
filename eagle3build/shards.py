"""The hidden-state shard format (documented in docs/shard-format.md).

One safetensors file holds several samples back to back:

=============================  =========================  ==========================================
tensor                         shape / dtype              meaning
=============================  =========================  ==========================================
``hidden_states``              [T, A*H] storage dtype     aux hidden states, concatenated in aux-id
                                                          order (speculators' layout)
``verifier_last_hidden_states`` [T, H] storage dtype      output of the last decoder layer, *before*
                                                          the final norm
``input_ids``                  [T] int32                  token ids
``loss_mask``                  [T] uint8                  1 on assistant tokens
``offsets``                    [n+1] int64                sample i is rows ``offsets[i]:offsets[i+1]``
=============================  =========================  ==========================================

Metadata (all strings): ``schema``, ``target_fingerprint``, ``aux_layer_ids`` (JSON),
``dtype``, ``hidden_size``, ``sample_ids`` (JSON), ``split``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from .atomic import atomic_path

SCHEMA = "eagle3build.shard/1"
STORAGE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class ShardMismatch(ValueError):
    """A shard was made for another target, other aux layers, or another schema."""


@dataclass
class ShardMeta:
    """What a shard says about itself."""

    target_fingerprint: str
    aux_layer_ids: list[int]
    dtype: str
    hidden_size: int
    sample_ids: list[str]
    split: str
    schema: str = SCHEMA

    def to_strings(self) -> dict[str, str]:
        return {
            "schema": self.schema,
            "target_fingerprint": self.target_fingerprint,
            "aux_layer_ids": json.dumps(self.aux_layer_ids),
            "dtype": self.dtype,
            "hidden_size": str(self.hidden_size),
            "sample_ids": json.dumps(self.sample_ids),
            "split": self.split,
        }

    @classmethod
    def from_strings(cls, path: str, m: dict[str, str] | None) -> ShardMeta:
        m = m or {}
        if m.get("schema") != SCHEMA:
            raise ShardMismatch(f"{path}: shard schema {m.get('schema')!r}, this version reads {SCHEMA!r}")
        return cls(
            target_fingerprint=m["target_fingerprint"],
            aux_layer_ids=json.loads(m["aux_layer_ids"]),
            dtype=m["dtype"],
            hidden_size=int(m["hidden_size"]),
            sample_ids=json.loads(m["sample_ids"]),
            split=m["split"],
            schema=m["schema"],
        )


def write_shard(
    path: str | os.PathLike,
    meta: ShardMeta,
    hidden_states: list[torch.Tensor],
    last_hidden_states: list[torch.Tensor],
    input_ids: list[torch.Tensor],
    loss_mask: list[torch.Tensor],
) -> None:
    """Write one shard atomically from per-sample tensors.

    Per sample i: ``hidden_states[i]`` [T_i, A*H], ``last_hidden_states[i]`` [T_i, H]
    (cast to ``meta.dtype``), ``input_ids[i]`` [T_i] int, ``loss_mask[i]`` [T_i].

    Raises:
        ValueError: lengths or widths disagree.
    """
    from safetensors.torch import save_file

    dtype = STORAGE_DTYPES[meta.dtype]
    n = len(meta.sample_ids)
    if not (len(hidden_states) == len(last_hidden_states) == len(input_ids) == len(loss_mask) == n):
        raise ValueError("write_shard: one entry per sample id is required in every list")
    A = len(meta.aux_layer_ids)
    for i in range(n):
        T = input_ids[i].shape[0]
        if hidden_states[i].shape != (T, A * meta.hidden_size) or last_hidden_states[i].shape != (T, meta.hidden_size):
            raise ValueError(
                f"sample {meta.sample_ids[i]}: hidden {tuple(hidden_states[i].shape)} / last "
                f"{tuple(last_hidden_states[i].shape)} do not fit T={T}, A={A}, H={meta.hidden_size}"
            )
    lengths = torch.tensor([x.shape[0] for x in input_ids], dtype=torch.int64)
    offsets = torch.zeros(n + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    H = meta.hidden_size
    tensors = {
        "hidden_states": torch.cat(hidden_states).to(dtype) if n else torch.zeros(0, A * H, dtype=dtype),
        "verifier_last_hidden_states": torch.cat(last_hidden_states).to(dtype) if n else torch.zeros(0, H, dtype=dtype),
        "input_ids": torch.cat(input_ids).to(torch.int32) if n else torch.zeros(0, dtype=torch.int32),
        "loss_mask": torch.cat(loss_mask).to(torch.uint8) if n else torch.zeros(0, dtype=torch.uint8),
        "offsets": offsets,
    }
    with atomic_path(path) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=meta.to_strings())


class ShardReader:
    """Random access to the samples of one shard without loading the whole file.

    ``reader[i]`` -> dict with ``hidden_states`` [T, A*H], ``verifier_last_hidden_states``
    [T, H] (storage dtype), ``input_ids`` [T] int64, ``loss_mask`` [T] bool — the
    per-sample layout speculators' data pipeline expects.
    """

    def __init__(self, path: str | os.PathLike):
        from safetensors import safe_open

        self.path = os.fspath(path)
        self._f = safe_open(self.path, framework="pt")
        self.meta = ShardMeta.from_strings(self.path, self._f.metadata())
        self.offsets = self._f.get_tensor("offsets")

    def __len__(self) -> int:
        return len(self.meta.sample_ids)

    def length(self, i: int) -> int:
        return int(self.offsets[i + 1] - self.offsets[i])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return {
            "hidden_states": self._f.get_slice("hidden_states")[a:b],
            "verifier_last_hidden_states": self._f.get_slice("verifier_last_hidden_states")[a:b],
            "input_ids": self._f.get_slice("input_ids")[a:b].to(torch.int64),
            "loss_mask": self._f.get_slice("loss_mask")[a:b].to(torch.bool),
        }


def check_meta(path: str, meta: ShardMeta, target_fingerprint: str, aux_layer_ids: list[int]) -> None:
    """Refuse a shard made for another target or other aux layers.

    Raises:
        ShardMismatch: naming the shard's value and the expected one.
    """
    if meta.target_fingerprint != target_fingerprint:
        raise ShardMismatch(
            f"{path}: target fingerprint {meta.target_fingerprint} but this run's target is {target_fingerprint}"
        )
    if list(meta.aux_layer_ids) != list(aux_layer_ids):
        raise ShardMismatch(f"{path}: aux_layer_ids {meta.aux_layer_ids} but this run uses {list(aux_layer_ids)}")
