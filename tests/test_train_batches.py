"""Training batches from fp8 shards dequantised on the trainer's device (issue 65): the packed rows
(``shards.pack_fp8``) give the host path's tensors bit for bit, shifted (EAGLE-3) or not (DFlash), padding included;
rows stay unpacked where packing would change them (noise) or where there is nothing to pack (bf16 shards)."""
from __future__ import annotations

import pytest
import torch

from eagle3build.formats.shards import (
    ShardMeta,
    ShardReader,
    dequantize_fp8,
    pack_fp8,
    quantize_fp8,
    unpack_fp8,
    write_shard,
)
from eagle3build.train.train_data import MODEL_KEYS, Batches, BatchLayout

H, A = 16, 3  # hidden size, aux layers


def _shard(path, dtype: str, n: int = 9, seed: int = 0) -> str:
    g = torch.Generator().manual_seed(seed)
    lengths = [int(x) for x in torch.randint(5, 40, (n,), generator=g)]
    hs = [torch.randn(t, A * H, generator=g) * 3 for t in lengths]
    hs[0][2] = 0  # an all-zero row: its scale is stored as 1
    last = [torch.randn(t, H, generator=g) for t in lengths]
    ids = [torch.randint(0, 100, (t,), generator=g) for t in lengths]
    mask = [torch.ones(t, dtype=torch.uint8) for t in lengths]
    write_shard(path, ShardMeta("fp", [1, 2, 3], dtype, H, [f"s{i}" for i in range(n)], "train"), hs, last, ids, mask,
                fsync=False)
    return str(path)


def test_pack_and_unpack_give_the_dequantised_values_bit_for_bit():
    x = torch.randn(11, A * H) * 5
    q, scale = quantize_fp8(x, A)
    packed = pack_fp8(q, scale)
    assert packed.dtype == torch.uint8 and packed.shape == (11, A * H + 4 * A)
    for dtype in (torch.float32, torch.bfloat16):
        want = dequantize_fp8(q, scale).to(dtype)
        assert torch.equal(unpack_fp8(packed, A, dtype), want)
        assert torch.equal(unpack_fp8(packed[None, 2:7], A, dtype)[0], want[2:7])  # rows sliced, leading dims
    assert not unpack_fp8(torch.zeros(1, 4, A * H + 4 * A, dtype=torch.uint8), A, torch.bfloat16).any()  # padding


@pytest.mark.parametrize("shift", [True, False])
def test_packed_rows_equal_the_host_path_rows(tmp_path, shift):
    paths = [_shard(tmp_path / "a.safetensors", "float8_e4m3fn"), _shard(tmp_path / "b.safetensors", "float8_e4m3fn", 5, 1)]
    host = Batches(paths, BatchLayout(96, H, A, torch.bfloat16, seed=0, noise_std=0.0, world_size=2, shift=shift))
    dev = Batches(paths, BatchLayout(96, H, A, torch.bfloat16, seed=0, noise_std=0.0, world_size=2, shift=shift,
                  dequantize_on_device=True))
    assert dev.packed and not host.packed
    steps = [[list(map(int, ix)) for ix in step] for step in dev.epoch(1)]
    assert steps == [[list(map(int, ix)) for ix in step] for step in host.epoch(1)] and len(steps) >= 2
    for step in steps:
        for ix in step:
            raw = dev.load(ix)
            assert raw["hidden_states"].dtype == torch.uint8  # what crosses to the device: fp8 bytes and scales
            assert raw["hidden_states"].shape == (1, 96, A * H + 4 * A)
            a, b = host.to_device(host.load(ix), "cpu"), dev.to_device(raw, "cpu")
            assert sorted(a) == sorted(b) == sorted(MODEL_KEYS)
            for k in a:
                assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k


def test_rows_stay_unpacked_with_noise_or_without_fp8(tmp_path):
    fp8 = _shard(tmp_path / "a.safetensors", "float8_e4m3fn")
    bf16 = _shard(tmp_path / "b.safetensors", "bfloat16")
    for paths, noise in (([fp8], 0.1), ([bf16], 0.0), ([fp8, bf16], 0.0)):
        layout = BatchLayout(96, H, A, torch.bfloat16, 0, noise_std=noise, dequantize_on_device=True)
        assert not Batches(paths, layout).packed
    with pytest.raises(ValueError, match=r"b\.safetensors: storage bfloat16, not float8_e4m3fn"):
        ShardReader(bf16).packed(0)
