"""capture_hidden_states + shards: hook capture equals the model's own hidden states; shard round trip."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from eagle3build import capture_hidden_states as cap
from eagle3build import prepare_data as pd
from eagle3build.shards import ShardMeta, ShardMismatch, ShardReader, check_meta, write_shard
from eagle3build.target import find_decoder_layers, load_model


def test_hooks_match_output_hidden_states_and_final_norm(tiny_target):
    model = load_model(tiny_target, torch.float32)
    ids = torch.randint(0, 49152, (1, 20))
    c = cap.HookCapture(model, [2, 3, 4])
    aux, last = c.capture(ids, torch.ones_like(ids))
    c.remove()
    with torch.no_grad():
        ref = model(ids, output_hidden_states=True)
    assert aux.shape == (1, 20, 3 * 64) and last.shape == (1, 20, 64)
    # hidden_states[k] is the input of layer k (k < N); fp32 on CPU: exact up to rounding.
    torch.testing.assert_close(aux, torch.cat([ref.hidden_states[i] for i in (2, 3, 4)], -1), rtol=0, atol=1e-5)
    # The stored last state is *before* the final norm: norm(last) gives the model's final
    # hidden state, and the lm_head over it gives the model's own logits.
    torch.testing.assert_close(model.model.norm(last), ref.hidden_states[-1], rtol=0, atol=1e-5)
    torch.testing.assert_close(model.lm_head(model.model.norm(last)), ref.logits, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(last, ref.hidden_states[-1])


def test_padded_batch_equals_one_at_a_time(tiny_target):
    model = load_model(tiny_target, torch.float32)
    c = cap.HookCapture(model, [2, 3, 4])
    a = torch.randint(0, 49152, (1, 17))
    b = torch.randint(0, 49152, (1, 9))
    single = [c.capture(x, torch.ones_like(x)) for x in (a, b)]
    ids = torch.zeros(2, 17, dtype=torch.long)
    att = torch.zeros(2, 17, dtype=torch.long)
    ids[0], att[0] = a[0], 1
    ids[1, :9], att[1, :9] = b[0], 1
    aux, last = c.capture(ids, att)
    torch.testing.assert_close(aux[0], single[0][0][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(aux[1, :9], single[1][0][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(last[1, :9], single[1][1][0], rtol=0, atol=1e-5)


def test_plan_batches_respects_budget():
    lengths = [5, 100, 7, 50, 50, 3]
    batches = cap.plan_batches(lengths, 120)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 120


def test_decoder_layers_found_from_module_tree(tiny_target):
    model = load_model(tiny_target, torch.float32)
    stack = find_decoder_layers(model, 6)
    assert stack.path == "model.layers" and len(stack.layers) == 6 and stack.owner is model.model


def test_capture_shard_roundtrip_and_meta_check(tmp_path, tiny_target):
    rng = np.random.default_rng(0)
    samples = [(f"s{i}", rng.integers(0, 49152, n).astype(np.int32), (rng.random(n) > 0.5).astype(np.uint8))
               for i, n in enumerate([12, 30, 7, 19, 25])]
    tokens = tmp_path / "train.safetensors"
    pd.write_tokens(tokens, samples)
    out = tmp_path / "shard-00000.safetensors"
    summary = cap.capture_shard(tiny_target, tokens, out, start=1, count=3, aux_layer_ids=[1, 3, 4],
                                target_fingerprint="abc", split="train", tokens_per_batch=64)
    assert summary["samples"] == 3 and summary["tokens"] == 30 + 7 + 19
    r = ShardReader(out)
    assert r.meta.sample_ids == ["s1", "s2", "s3"] and r.meta.aux_layer_ids == [1, 3, 4] and r.meta.dtype == "bfloat16"
    s = r[1]
    assert s["hidden_states"].shape == (7, 3 * 64) and s["hidden_states"].dtype == torch.bfloat16
    assert s["verifier_last_hidden_states"].shape == (7, 64)
    assert s["input_ids"].tolist() == samples[2][1].tolist()
    assert s["loss_mask"].tolist() == samples[2][2].astype(bool).tolist()
    # Same states as capturing that sample alone in fp32, within bf16 storage rounding (2^-8 relative).
    model = load_model(tiny_target, torch.float32)
    c = cap.HookCapture(model, [1, 3, 4])
    ids = torch.from_numpy(samples[2][1].astype(np.int64))[None]
    aux, last = c.capture(ids, torch.ones_like(ids))
    torch.testing.assert_close(s["hidden_states"].float(), aux[0], rtol=2**-7, atol=1e-2)
    check_meta(str(out), r.meta, "abc", [1, 3, 4])
    with pytest.raises(ShardMismatch, match="fingerprint abc but this run's target is zzz"):
        check_meta(str(out), r.meta, "zzz", [1, 3, 4])
    with pytest.raises(ShardMismatch, match=r"aux_layer_ids \[1, 3, 4\] but this run uses \[2, 3, 4\]"):
        check_meta(str(out), r.meta, "abc", [2, 3, 4])


def test_write_shard_rejects_wrong_width(tmp_path):
    meta = ShardMeta("fp", [1, 2], "bfloat16", 8, ["a"], "train")
    with pytest.raises(ValueError, match="do not fit"):
        write_shard(tmp_path / "s.safetensors", meta, [torch.zeros(4, 8)], [torch.zeros(4, 8)],
                    [torch.zeros(4, dtype=torch.long)], [torch.zeros(4)])
    assert not (tmp_path / "s.safetensors").exists()
