"""The hidden-state shard format (documented in docs/shard-format.md).

One safetensors file holds several samples back to back:

=================================  ======================  ==========================================
tensor                             shape / dtype           meaning
=================================  ======================  ==========================================
``hidden_states``                  [T, A*H] storage dtype  aux hidden states, concatenated in aux-id
                                                           order (speculators' layout)
``verifier_last_hidden_states``    [T, H] storage dtype    output of the last decoder layer, *before*
                                                           the final norm
``input_ids``                      [T] int32               token ids
``loss_mask``                      [T] uint8               1 on assistant tokens
``offsets``                        [n+1] int64             sample i is rows ``offsets[i]:offsets[i+1]``
``hidden_states_scale``            [T, A] float32          fp8 storage only: per token and layer
``verifier_last_hidden_states_scale`` [T, 1] float32       fp8 storage only
=================================  ======================  ==========================================

Metadata (all strings): ``schema``, ``target_fingerprint``, ``aux_layer_ids`` (JSON),
``dtype``, ``hidden_size``, ``sample_ids`` (JSON), ``split``.

Storage ``float8_e4m3fn`` keeps one float32 scale per token and layer (amax / 448, the
largest finite e4m3 value), i.e. ``x ≈ q.float() * scale``: half the bytes of bf16.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from ..atomic import clear_stale_temporaries, fsync_path

SCHEMA = "eagle3build.shard/1"
STORAGE_DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "float8_e4m3fn": torch.float8_e4m3fn,
}
FP8_MAX = 448.0  # largest finite float8_e4m3fn
SAFETENSORS_DTYPES = {
    torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float8_e4m3fn: "F8_E4M3",
    torch.int32: "I32", torch.int64: "I64", torch.uint8: "U8",
}


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
    # The scheme of a quantized target (issue 74; decisions.json's target.quantization.scheme): the states are the
    # served form's. None (and no such key in the file: a dense target's shard keeps its bytes) for a dense target.
    target_quantization: str | None = None

    def to_strings(self) -> dict[str, str]:
        out = {
            "schema": self.schema,
            "target_fingerprint": self.target_fingerprint,
            "aux_layer_ids": json.dumps(self.aux_layer_ids),
            "dtype": self.dtype,
            "hidden_size": str(self.hidden_size),
            "sample_ids": json.dumps(self.sample_ids),
            "split": self.split,
        }
        if self.target_quantization:
            out["target_quantization"] = self.target_quantization
        return out

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
            target_quantization=m.get("target_quantization"),
        )

    @property
    def fp8(self) -> bool:
        return self.dtype == "float8_e4m3fn"


def quantize_fp8(x: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token, per-group fp8: ``x`` [T, G*H] -> (``q`` [T, G*H] float8_e4m3fn, ``scale`` [T, G] float32).

    ``scale = amax / 448`` over each group's H values (1 where a row is all zeros).
    """
    T = x.shape[0]
    xg = x.float().reshape(T, groups, -1)
    scale = xg.abs().amax(-1) / FP8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (xg / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(T, -1), scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of ``quantize_fp8``: [T, G*H] in ``dtype``."""
    T, G = scale.shape
    return (q.float().reshape(T, G, -1) * scale.unsqueeze(-1)).reshape(T, -1).to(dtype)


def pack_fp8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``quantize_fp8``'s output as one uint8 tensor ``[T, G*H + 4*G]``: the fp8 values' bytes, then the float32
    scales' bytes (``q`` [T, G*H] float8_e4m3fn, ``scale`` [T, G] float32). Half a bf16 row's bytes to copy and
    no conversion on the host; ``unpack_fp8`` reverses it on whatever device holds it."""
    return torch.cat([q.view(torch.uint8), scale.contiguous().view(torch.uint8)], dim=-1)


def unpack_fp8(packed: torch.Tensor, groups: int, dtype: torch.dtype) -> torch.Tensor:
    """``pack_fp8``'s rows ``[..., G*H + 4*G]`` (any leading dims, any device) dequantised to ``[..., G*H]`` in
    ``dtype``: ``dequantize_fp8``'s float32 arithmetic, so the values equal ``ShardReader[i]``'s cast to ``dtype``
    bit for bit. An all-zero row (collation's padding) gives zeros."""
    width = packed.shape[-1] - 4 * groups
    q = packed[..., :width].contiguous().view(torch.float8_e4m3fn)
    scale = packed[..., width:].contiguous().view(torch.float32)
    lead = q.shape[:-1]
    return (q.float().reshape(*lead, groups, -1) * scale.unsqueeze(-1)).reshape(*lead, width).to(dtype)


def shard_layout(meta: ShardMeta, num_tokens: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Tensor name -> (dtype, shape) of a shard with ``num_tokens`` rows, in file order."""
    A, H, n = len(meta.aux_layer_ids), meta.hidden_size, len(meta.sample_ids)
    sdt = STORAGE_DTYPES[meta.dtype]
    layout = {
        "hidden_states": (sdt, (num_tokens, A * H)),
        "verifier_last_hidden_states": (sdt, (num_tokens, H)),
    }
    if meta.fp8:
        layout["hidden_states_scale"] = (torch.float32, (num_tokens, A))
        layout["verifier_last_hidden_states_scale"] = (torch.float32, (num_tokens, 1))
    layout.update({
        "input_ids": (torch.int32, (num_tokens,)),
        "loss_mask": (torch.uint8, (num_tokens,)),
        "offsets": (torch.int64, (n + 1,)),
    })
    return layout


class NonFiniteStates(ValueError):
    """Captured states hold NaN or inf: such a shard cannot be trained on and is not stored."""


def _nonfinite(t: torch.Tensor) -> bool:
    """Whether ``t`` (any float dtype, fp8 included) holds a NaN or an inf."""
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        t = t.float()  # isfinite has no fp8 kernel
    return not bool(torch.isfinite(t).all())


class ShardFileWriter:
    """Write a shard's rows in any order, as they are computed, straight into the final file layout.

    safetensors' own writer takes whole tensors, so a shard could only be written after
    its last batch — disk time that cannot overlap the GPU's work. The format is a
    little-endian u64 header length, a JSON header (name -> dtype, shape, byte range of
    the data buffer; ``__metadata__``) padded with spaces to 8 bytes, then the tensors'
    bytes back to back (https://github.com/huggingface/safetensors, "Format"). Knowing
    every sample's length in advance, the header is written first and each batch's rows
    land at their offsets with ``pwrite``. The file lives under a temporary name until
    ``close()``, which renames it into place; the result is read back with safetensors
    itself in the tests.

    Every sample's states are checked for NaN/inf as they are written; ``close()`` refuses
    the shard (``NonFiniteStates``, naming the sample ids and states) when any were found.
    With ``fsync`` (the default) the file's bytes reach the disk before the rename and the
    rename reaches it after, so a power loss leaves the old file or the new one whole.
    Cost, from an H200 host (page cache 3.36 GB/s, with fsync 1.46 GB/s) and its capture
    rates (bf16 32.4k tok/s x 32.8 kB/tok = 1.06 GB/s of shard; fp8 34.0k x 16.4 kB = 0.56
    GB/s): while the kernel writes back during capture, none, since the disk takes 1.46 GB/s
    and capture makes at most 1.06; if nothing was written back before ``close()`` (a shard
    made faster than the kernel's 30 s dirty-page expiry), the fsync adds the shard's bytes /
    1.46 GB/s, i.e. capture at 1 / (1 + 1.06/1.46) = 0.58x for bf16 (-42%), 0.72x for fp8.
    """

    def __init__(self, path: str | os.PathLike, meta: ShardMeta, lengths: list[int], fsync: bool = True):
        self.fsync = fsync
        self._nonfinite: dict[str, list[str]] = {}  # sample id -> names of states with NaN/inf
        self._lock = threading.Lock()
        self.path = Path(path)
        self.meta = meta
        self.lengths = list(lengths)
        self.row_offsets = [0]
        for n in self.lengths:
            self.row_offsets.append(self.row_offsets[-1] + n)
        T = self.row_offsets[-1]
        self.layout = shard_layout(meta, T)
        header: dict = {"__metadata__": meta.to_strings()}
        self.byte_offsets: dict[str, int] = {}
        self.row_bytes: dict[str, int] = {}
        pos = 0
        for name, (dtype, shape) in self.layout.items():
            nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
            self.byte_offsets[name] = pos
            self.row_bytes[name] = nbytes // shape[0] if shape[0] else 0
            pos += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-(8 + len(raw)) % 8)
        self._data_start = 8 + len(raw)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        clear_stale_temporaries(self.path)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.pwrite(self.fd, struct.pack("<Q", len(raw)) + raw, 0)
        os.ftruncate(self.fd, self._data_start + pos)
        offsets = torch.tensor(self.row_offsets, dtype=torch.int64)
        self._write("offsets", 0, offsets)
        self._done = [False] * len(self.lengths)

    def _write(self, name: str, row: int, t: torch.Tensor) -> None:
        dtype, shape = self.layout[name]
        if t.dtype != dtype or tuple(t.shape[1:]) != tuple(shape[1:]):
            raise ValueError(f"{self.path}: {name} rows of {t.dtype} {tuple(t.shape)}, expected {dtype} [*, {shape[1:]}]")
        buf = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        os.pwrite(self.fd, buf, self._data_start + self.byte_offsets[name] + row * self.row_bytes[name])

    def write_sample(self, i: int, hidden: torch.Tensor, last: torch.Tensor, input_ids: torch.Tensor,
                     loss_mask: torch.Tensor, hidden_scale: torch.Tensor | None = None,
                     last_scale: torch.Tensor | None = None) -> None:
        """Sample ``i``'s rows: ``hidden`` [T_i, A*H], ``last`` [T_i, H] in the storage dtype (plus scales for fp8)."""
        if hidden.shape[0] != self.lengths[i] or last.shape[0] != self.lengths[i] or input_ids.shape[0] != self.lengths[i]:
            raise ValueError(f"{self.path}: sample {self.meta.sample_ids[i]} has {self.lengths[i]} tokens, got "
                             f"{hidden.shape[0]}/{last.shape[0]}/{input_ids.shape[0]} rows")
        bad = [name for name, t in (("hidden_states", hidden), ("verifier_last_hidden_states", last),
                                    ("hidden_states_scale", hidden_scale), ("verifier_last_hidden_states_scale", last_scale))
               if t is not None and _nonfinite(t)]
        if bad:
            with self._lock:
                self._nonfinite[self.meta.sample_ids[i]] = bad
        r = self.row_offsets[i]
        self._write("hidden_states", r, hidden)
        self._write("verifier_last_hidden_states", r, last)
        if self.meta.fp8:
            self._write("hidden_states_scale", r, hidden_scale)
            self._write("verifier_last_hidden_states_scale", r, last_scale)
        self._write("input_ids", r, input_ids.to(torch.int32))
        self._write("loss_mask", r, loss_mask.to(torch.uint8))
        self._done[i] = True

    def close(self) -> None:
        """Check every sample was written with finite states and rename into place (atomic: a
        killed job leaves only the temporary). With ``fsync`` the bytes reach the disk first
        (survives a power cut; costs the disk's write time).

        Raises:
            ValueError: a sample was never written.
            NonFiniteStates: some sample's states hold NaN/inf (the ids and states are named;
                nothing is left on disk).
        """
        missing = [self.meta.sample_ids[i] for i, d in enumerate(self._done) if not d]
        if missing:
            self.abort()
            raise ValueError(f"{self.path}: samples never written: {missing[:5]}")
        if self._nonfinite:
            self.abort()
            bad = sorted(self._nonfinite.items())
            raise NonFiniteStates(
                f"{self.path}: {len(bad)} sample(s) with NaN/inf hidden states, shard refused: "
                + "; ".join(f"{sid} ({', '.join(names)})" for sid, names in bad[:20])
                + (" ..." if len(bad) > 20 else ""))
        if self.fsync:
            os.fsync(self.fd)
        os.close(self.fd)
        os.replace(self.tmp, self.path)
        if self.fsync:
            fsync_path(self.path.parent)

    def abort(self) -> None:
        """Drop the temporary file."""
        try:
            os.close(self.fd)
        except OSError:
            pass
        self.tmp.unlink(missing_ok=True)


def encode_states(hidden: torch.Tensor, last: torch.Tensor, meta: ShardMeta):
    """Cast (or fp8-quantise) one sample's states for storage: ``(hidden, last, hidden_scale, last_scale)``."""
    if meta.fp8:
        hq, hs = quantize_fp8(hidden, len(meta.aux_layer_ids))
        lq, ls = quantize_fp8(last, 1)
        return hq, lq, hs, ls
    sdt = STORAGE_DTYPES[meta.dtype]
    return hidden.to(sdt), last.to(sdt), None, None


def write_shard(
    path: str | os.PathLike,
    meta: ShardMeta,
    hidden_states: list[torch.Tensor],
    last_hidden_states: list[torch.Tensor],
    input_ids: list[torch.Tensor],
    loss_mask: list[torch.Tensor],
    fsync: bool = True,
) -> None:
    """Write one shard atomically from per-sample tensors (``fsync``: see ``ShardFileWriter``).

    Per sample i: ``hidden_states[i]`` [T_i, A*H], ``last_hidden_states[i]`` [T_i, H]
    (cast or quantised to ``meta.dtype``), ``input_ids[i]`` [T_i] int, ``loss_mask[i]`` [T_i].

    Raises:
        ValueError: lengths or widths disagree (nothing is left on disk).
        NonFiniteStates: a sample's states hold NaN/inf (nothing is left on disk).
    """
    n = len(meta.sample_ids)
    if not (len(hidden_states) == len(last_hidden_states) == len(input_ids) == len(loss_mask) == n):
        raise ValueError("write_shard: one entry per sample id is required in every list")
    A, H = len(meta.aux_layer_ids), meta.hidden_size
    for i in range(n):
        T = input_ids[i].shape[0]
        if hidden_states[i].shape != (T, A * H) or last_hidden_states[i].shape != (T, H):
            raise ValueError(
                f"sample {meta.sample_ids[i]}: hidden {tuple(hidden_states[i].shape)} / last "
                f"{tuple(last_hidden_states[i].shape)} do not fit T={T}, A={A}, H={H}"
            )
    w = ShardFileWriter(path, meta, [x.shape[0] for x in input_ids], fsync=fsync)
    try:
        for i in range(n):
            h, last, hs, ls = encode_states(hidden_states[i], last_hidden_states[i], meta)
            w.write_sample(i, h, last, input_ids[i], loss_mask[i], hs, ls)
    except BaseException:
        w.abort()
        raise
    w.close()


class ShardReader:
    """Random access to the samples of one shard without loading the whole file.

    ``reader[i]`` -> dict with ``hidden_states`` [T, A*H], ``verifier_last_hidden_states``
    [T, H] (storage dtype; fp8 shards are dequantised to float32), ``input_ids`` [T]
    int64, ``loss_mask`` [T] bool — the per-sample layout speculators' data pipeline expects.
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
        hidden = self._f.get_slice("hidden_states")[a:b]
        last = self._f.get_slice("verifier_last_hidden_states")[a:b]
        if self.meta.fp8:
            hidden = dequantize_fp8(hidden, self._f.get_slice("hidden_states_scale")[a:b])
            last = dequantize_fp8(last, self._f.get_slice("verifier_last_hidden_states_scale")[a:b])
        return self._sample(a, b, hidden, last)

    def packed(self, i: int) -> dict[str, torch.Tensor]:
        """Sample ``i`` of an fp8 shard as stored: ``reader[i]``'s keys, but each of the states a uint8 tensor
        ``[T, G*H + 4*G]`` holding its fp8 values and its float32 scales (``pack_fp8``), for a reader that
        dequantises where it computes (``unpack_fp8`` gives ``reader[i]``'s values bit for bit). Rows stay rows,
        so a row-wise transform of the sample (speculators' ``shift_batch``) moves each scale with its states.

        Raises:
            ValueError: the shard is not fp8.
        """
        if not self.meta.fp8:
            raise ValueError(f"{self.path}: storage {self.meta.dtype}, not float8_e4m3fn: nothing to keep packed")
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        hidden = pack_fp8(self._f.get_slice("hidden_states")[a:b], self._f.get_slice("hidden_states_scale")[a:b])
        last = pack_fp8(self._f.get_slice("verifier_last_hidden_states")[a:b],
                        self._f.get_slice("verifier_last_hidden_states_scale")[a:b])
        return self._sample(a, b, hidden, last)

    def _sample(self, a: int, b: int, hidden: torch.Tensor, last: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            "hidden_states": hidden,
            "verifier_last_hidden_states": last,
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


def bytes_per_token(meta: ShardMeta, with_tokens: bool = False) -> int:
    """Hidden-state bytes one token takes in a shard of this kind (states and fp8 scales);
    ``with_tokens`` adds its id and mask byte (5 bytes)."""
    skip = {"offsets"} | (set() if with_tokens else {"input_ids", "loss_mask"})
    layout = shard_layout(meta, 1)
    return sum(torch.Size(s).numel() * torch.empty((), dtype=d).element_size() for k, (d, s) in layout.items() if k not in skip)
