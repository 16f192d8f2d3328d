"""capture_hidden_states + shards: hook capture equals the model's own hidden states; shard round trip."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from eagle3build.capture import capture_hidden_states as cap
from eagle3build.data import prepare_data as pd
from eagle3build.formats.shards import ShardMeta, ShardMismatch, ShardReader, check_meta, write_shard
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
    summary = cap.capture_shard(cap.CaptureSettings(target_dir=tiny_target, tokens_path=tokens, out_path=out, start=1,
                                                    count=3, aux_layer_ids=[1, 3, 4], target_fingerprint="abc",
                                                    split="train", compute_dtype="auto", tokens_per_batch=64))
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


def test_fp8_storage_roundtrip(tmp_path):
    torch.manual_seed(0)
    meta = ShardMeta("fp", [1, 2, 3], "float8_e4m3fn", 16, ["a", "b"], "train")
    hs = [torch.randn(5, 48) * 7, torch.randn(3, 48) * 0.01]
    last = [torch.randn(5, 16) * 30, torch.randn(3, 16)]
    write_shard(tmp_path / "s.safetensors", meta, hs, last, [torch.arange(5), torch.arange(3)], [torch.ones(5), torch.zeros(3)])
    r = ShardReader(tmp_path / "s.safetensors")
    for i in range(2):
        s = r[i]
        # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 of each token-and-layer's amax
        amax = hs[i].reshape(hs[i].shape[0], 3, 16).abs().amax(-1, keepdim=True)
        err = (s["hidden_states"].reshape(-1, 3, 16) - hs[i].reshape(-1, 3, 16)).abs()
        assert (err <= amax * 2**-4 + 1e-12).all()
        torch.testing.assert_close(s["verifier_last_hidden_states"], last[i], rtol=2**-4, atol=last[i].abs().max().item() * 2**-4)
    from eagle3build.formats.shards import bytes_per_token

    bf16 = ShardMeta("fp", [1, 2, 3], "bfloat16", 4096, ["a"], "train")
    fp8 = ShardMeta("fp", [1, 2, 3], "float8_e4m3fn", 4096, ["a"], "train")
    assert bytes_per_token(bf16) == 8 * 4096 and bytes_per_token(fp8) == 4 * 4096 + 4 * 4
    assert bytes_per_token(bf16, with_tokens=True) == 8 * 4096 + 5


def test_streaming_writer_is_read_by_safetensors_in_any_order(tmp_path):
    from safetensors.torch import load_file

    from eagle3build.formats.shards import ShardFileWriter

    meta = ShardMeta("fp", [0, 1], "bfloat16", 4, ["x", "y", "z"], "eval")
    lengths = [2, 3, 1]
    w = ShardFileWriter(tmp_path / "s.safetensors", meta, lengths)
    rows = {i: torch.arange(n * 8, dtype=torch.float32).reshape(n, 8) + 100 * i for i, n in enumerate(lengths)}
    for i in (2, 0, 1):  # out of order, as batches sorted by length finish
        w.write_sample(i, rows[i].bfloat16(), rows[i][:, :4].bfloat16(), torch.full((lengths[i],), i), torch.ones(lengths[i]))
    assert not (tmp_path / "s.safetensors").exists()  # only the temporary exists until close()
    w.close()
    t = load_file(tmp_path / "s.safetensors")
    assert t["offsets"].tolist() == [0, 2, 5, 6]
    assert torch.equal(t["hidden_states"].float(), torch.cat([rows[0], rows[1], rows[2]]))
    assert t["input_ids"].tolist() == [0, 0, 1, 1, 1, 2] and t["input_ids"].dtype == torch.int32


def test_unfinished_shard_is_never_accepted(tmp_path):
    from eagle3build.formats.shards import ShardFileWriter

    meta = ShardMeta("fp", [0], "bfloat16", 4, ["x", "y"], "train")
    w = ShardFileWriter(tmp_path / "s.safetensors", meta, [2, 2])
    w.write_sample(0, torch.zeros(2, 4).bfloat16(), torch.zeros(2, 4).bfloat16(), torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match=r"samples never written: \['y'\]"):
        w.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_nonfinite_states_are_refused_naming_samples(tmp_path, dtype):
    """A NaN in one sample's aux states and an inf in another's last state: the shard is refused,
    the message names both sample ids and which state, and nothing is left on disk."""
    from eagle3build.formats.shards import NonFiniteStates

    meta = ShardMeta("fp", [1, 2], dtype, 8, ["ok-0", "nan-1", "inf-2", "ok-3"], "train")
    hs = [torch.randn(3, 16) for _ in range(4)]
    last = [torch.randn(3, 8) for _ in range(4)]
    hs[1][2, 5] = float("nan")
    last[2][0, 0] = float("inf")
    args = ([torch.arange(3)] * 4, [torch.ones(3)] * 4)
    with pytest.raises(NonFiniteStates) as e:
        write_shard(tmp_path / "s.safetensors", meta, hs, last, *args)
    msg = str(e.value)
    assert "2 sample(s)" in msg and "nan-1 (hidden_states" in msg and "inf-2 (" in msg and "verifier_last" in msg
    assert "ok-0" not in msg and "ok-3" not in msg
    assert list(tmp_path.iterdir()) == []
    hs[1][2, 5], last[2][0, 0] = 0.0, 0.0  # finite again: written
    write_shard(tmp_path / "s.safetensors", meta, hs, last, *args)
    assert len(ShardReader(tmp_path / "s.safetensors")) == 4


def test_shard_is_fsynced_before_rename_by_default(tmp_path, monkeypatch):
    """The file's bytes are fsynced before the rename onto the real name, and the directory after it."""
    import os as os_

    events = []
    real_fsync, real_replace = os_.fsync, os_.replace
    monkeypatch.setattr(os_, "fsync", lambda fd: (events.append(("fsync", os_.readlink(f"/proc/self/fd/{fd}"))),
                                                  real_fsync(fd))[1])
    monkeypatch.setattr(os_, "replace", lambda a, b: (events.append(("replace", str(b))), real_replace(a, b))[1])
    meta = ShardMeta("fp", [0], "bfloat16", 4, ["x"], "train")
    out = tmp_path / "s.safetensors"
    write_shard(out, meta, [torch.zeros(2, 4)], [torch.zeros(2, 4)], [torch.zeros(2, dtype=torch.long)], [torch.ones(2)])
    assert [e[0] for e in events] == ["fsync", "replace", "fsync"]
    assert ".s.safetensors.tmp-" in events[0][1] and events[1][1] == str(out) and events[2][1] == str(tmp_path)
    events.clear()
    write_shard(out, meta, [torch.zeros(2, 4)], [torch.zeros(2, 4)], [torch.zeros(2, dtype=torch.long)], [torch.ones(2)],
                fsync=False)
    assert events == [("replace", str(out))]


def test_atomic_json_is_fsynced_before_rename(tmp_path, monkeypatch):
    import os as os_

    from eagle3build.atomic import write_json

    events = []
    real_fsync, real_replace = os_.fsync, os_.replace
    monkeypatch.setattr(os_, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os_, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    write_json(tmp_path / "a.json", {"x": 1})
    assert events == ["fsync", "replace", "fsync"] and (tmp_path / "a.json").read_text() == '{\n  "x": 1\n}\n'


@pytest.mark.parametrize("family", ["deepseek_v3_moe", "llava_wrapper"])
def test_capture_moe_and_multimodal_targets(tmp_path, family):
    """Tiny random MoE and multimodal-wrapper targets: hooks equal the text model's own hidden states."""
    from transformers import (
        CLIPVisionConfig,
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    torch.manual_seed(0)
    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, vocab_size=500,
                 max_position_embeddings=128)
    if family == "deepseek_v3_moe":
        model = DeepseekV3ForCausalLM(DeepseekV3Config(**small, num_key_value_heads=4, moe_intermediate_size=32,
                                                       n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                                                       first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                                                       qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                                       n_group=2, topk_group=1)).eval()
        text = model.model
    else:
        model = LlavaForConditionalGeneration(LlavaConfig(
            text_config=LlamaConfig(**small, num_key_value_heads=2).to_dict(),
            vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                                           image_size=32, patch_size=8).to_dict())).eval()
        text = model.model.language_model
    c = cap.HookCapture(model, [1, 3, 4])
    assert c.stack.owner is text
    ids = torch.randint(0, 500, (2, 11))
    att = torch.ones_like(ids)
    att[1, 7:] = 0
    aux, last = c.capture(ids, att)
    with torch.no_grad():
        ref = text(input_ids=ids[:1], output_hidden_states=True).hidden_states
    torch.testing.assert_close(aux[0], torch.cat([ref[i][0] for i in (1, 3, 4)], -1), rtol=0, atol=1e-5)
    torch.testing.assert_close(text.norm(last[:1]), ref[-1], rtol=0, atol=1e-5)
    with torch.no_grad():
        ref1 = text(input_ids=ids[1:, :7], output_hidden_states=True).hidden_states
    torch.testing.assert_close(aux[1, :7], torch.cat([ref1[i][0] for i in (1, 3, 4)], -1), rtol=0, atol=1e-5)
