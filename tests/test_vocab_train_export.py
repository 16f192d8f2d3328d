"""build_vocab_map, train_draft and export_head on a tiny random target with real captured shards."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from eagle3build.draft import vocab_map as vm
from eagle3build.formats.artifacts import minimal_decisions
from eagle3build.serve import export_head as ex
from eagle3build.train import build_vocab_map as bv
from eagle3build.train import train_draft as td

AUX = [1, 3, 4]


@pytest.fixture(scope="module")
def workdir(tiny_shards):
    return tiny_shards


def test_vocab_map_from_assistant_tokens(workdir):
    d, samples, info = workdir
    d2t, t2d, loaded = vm.load(d / "d2t.npy", d / "t2d.npy", d / "vocab.json")
    assert d2t.dtype == torch.int64 and d2t.shape == (256,) and t2d.dtype == torch.bool and t2d.shape == (49152,)
    assert int(t2d.sum()) == 256
    seen = {int(t) for _, ids, m in samples[:8] for t in ids[m == 1]}
    selected = set((torch.arange(256) + d2t).tolist())
    assert seen <= selected  # fewer distinct tokens than the draft size: all of them are in
    assert info["coverage"] == 1.0 and loaded["fingerprint"] == info["fingerprint"]
    freq = bv.count_assistant_tokens(d / "train.safetensors")
    assert sum(freq.values()) == sum(int(m.sum()) for _, _, m in samples[:8])
    assert bv.vocab_fingerprint(freq, 256) != bv.vocab_fingerprint(freq, 512)


def test_inconsistent_map_is_refused():
    d2t = torch.tensor([1, 1, 1])
    t2d = torch.zeros(8, dtype=torch.bool)
    t2d[[1, 2, 4]] = True  # d2t says 1, 2, 3
    with pytest.raises(ValueError, match="disagree on 2 target ids"):
        vm.check_consistent(d2t, t2d)


@pytest.fixture(scope="module")
def trained(workdir, tiny_target):
    """The tiny target's head trained 12 epochs on the fixture's shards: ``(checkpoint dir, metrics)``. The export
    tests use it whatever ran before them (they skipped when run without the training test first)."""
    d, _, _ = workdir
    out = d / "checkpoint"
    m = td.train(target_dir=str(tiny_target), train_shards=[str(d / "train-shard.safetensors")],
                 eval_shards=[str(d / "eval-shard.safetensors")], d2t_path=str(d / "d2t.npy"),
                 t2d_path=str(d / "t2d.npy"), vocab_json=str(d / "vocab.json"),
                 decisions_json=str(d / "decisions.json"), out_dir=str(out), epochs=12, lr=3e-3, total_seq_len=256,
                 ttt_steps=3, seed=0, device="cpu")
    return out, m


def test_train_loss_falls_and_checkpoint_is_written(workdir, trained):
    _, _, info = workdir
    out, m = trained
    losses = [h["loss"] for h in m["train_history"]]
    assert m["steps"] == len(losses) >= 12
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3])
    ev = m["final_eval"]
    assert len(ev["full_acc_per_step"]) == 3 and 1.0 <= ev["simulated_acceptance_length"] <= 4.0
    for f in ("config.json", "model.safetensors", "train_meta.json", "metrics.json", "curves.png"):
        assert (out / f).stat().st_size > 0
    meta = json.loads((out / "train_meta.json").read_text())
    assert meta["vocab_fingerprint"] == info["fingerprint"] and meta["aux_layer_ids"] == AUX
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("fc.weight").shape == (64, 3 * 64)


def test_trainer_refuses_foreign_shards(workdir, tiny_target, tmp_path):
    d, _, _ = workdir
    (tmp_path / "decisions.json").write_text(json.dumps(minimal_decisions("other", AUX, 49152)))
    with pytest.raises(Exception, match="fingerprint fp-tiny but this run's target is other"):
        td.train(target_dir=str(tiny_target), train_shards=[str(d / "train-shard.safetensors")], eval_shards=[],
                 d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"), vocab_json=str(d / "vocab.json"),
                 decisions_json=str(tmp_path / "decisions.json"), out_dir=str(tmp_path / "ck"), device="cpu")


def test_export_head(workdir, trained, tiny_target):
    d, _, info = workdir
    ck, _ = trained
    head = d / "head"
    # vLLM's CPU attention has no kernel for the tiny target's head_dim 16; the e2e test has vLLM load a real head.
    ex.export(ex.ExportSettings(checkpoint_dir=ck, d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"),
                                vocab_json=str(d / "vocab.json"), out_dir=head, served_name="org/tiny-llama",
                                target_dir=str(tiny_target), vllm_load_check="never"))
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["architectures"] == ["Eagle3DraftModel"]
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "org/tiny-llama"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == AUX and cfg["draft_vocab_size"] == 256
    assert cfg["norm_before_fc"] is True and cfg["norm_output"] is True  # eagle3.1 default
    assert str(tiny_target) not in (head / "config.json").read_text()
    with safe_open(str(head / "model.safetensors"), "pt") as f:
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
        assert f.get_tensor("lm_head.weight").shape == (256, 64) and f.get_tensor("lm_head.weight").dtype == torch.bfloat16
        # the tiny target: hidden 64, 4 heads of 16 (2 KV), MLP 128, vocab 49,152; draft vocab 256; 3 aux layers
        assert {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()} == {
            "fc.weight": (64, 192), "input_norm.weight": (192,), "norm.weight": (64,), "lm_head.weight": (256, 64),
            "d2t": (256,), "t2d": (49152,), "embed_tokens.weight": (49152, 64),
            "layers.0.self_attn.q_proj.weight": (64, 128), "layers.0.self_attn.k_proj.weight": (32, 128),
            "layers.0.self_attn.v_proj.weight": (32, 128), "layers.0.self_attn.o_proj.weight": (64, 64),
            "layers.0.mlp.gate_proj.weight": (128, 64), "layers.0.mlp.up_proj.weight": (128, 64),
            "layers.0.mlp.down_proj.weight": (64, 128), "layers.0.input_layernorm.weight": (64,),
            "layers.0.hidden_norm.weight": (64,), "layers.0.post_attention_layernorm.weight": (64,)}


def test_export_leaves_the_load_check_to_the_plans_benchmark(workdir, trained, tiny_target, tmp_path):
    """``auto`` with the same plan benchmarking the head (issue 65): no engine is started (vLLM cannot serve the tiny
    target's head_dim 16 on this CPU: the check would fail the export, as the next test shows) and head_meta.json says
    why, against its schema."""
    from eagle3build.formats.artifacts import validate

    d, _, _ = workdir
    ck, _ = trained
    meta = ex.export(ex.ExportSettings(checkpoint_dir=ck, d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"),
                                       vocab_json=str(d / "vocab.json"), out_dir=tmp_path / "head",
                                       served_name="org/tiny", target_dir=str(tiny_target), vllm_load_check="auto",
                                       benchmarked_by="results/r/benchmark.json"))
    want = {"skipped": "the same plan's benchmark (results/r/benchmark.json) loads this head in vLLM"}
    assert meta["vllm_load_check"] == want
    written = json.loads((tmp_path / "head/head_meta.json").read_text())
    assert written["vllm_load_check"] == want
    validate(written, "head_meta", "head_meta.json")


def test_export_refuses_other_vocab_map(workdir, trained, tiny_target, tmp_path):
    d, _, info = workdir
    ck, _ = trained
    other = bv.build(d / "train.safetensors", 49152, 300, tmp_path / "d2t.npy", tmp_path / "t2d.npy", tmp_path / "v.json")
    with pytest.raises(ex.ExportError, match=f"fingerprint {other['fingerprint']}.*trained with {info['fingerprint']}"):
        ex.export(ex.ExportSettings(checkpoint_dir=ck, d2t_path=str(tmp_path / "d2t.npy"),
                                    t2d_path=str(tmp_path / "t2d.npy"), vocab_json=str(tmp_path / "v.json"),
                                    out_dir=tmp_path / "head", served_name="org/tiny", target_dir=str(tiny_target)))
    assert not (tmp_path / "head").exists()


@pytest.mark.vllm
def test_export_fails_and_leaves_nothing_when_vllm_cannot_serve_the_head(workdir, trained, tiny_target, tmp_path):
    """The tiny target's head_dim 16 has no vLLM CPU attention kernel: the load check must fail the export."""
    pytest.importorskip("vllm")
    d, _, _ = workdir
    ck, _ = trained
    with pytest.raises(ex.ExportError, match="vLLM cannot serve"):
        ex.export(ex.ExportSettings(checkpoint_dir=ck, d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"),
                                    vocab_json=str(d / "vocab.json"), out_dir=tmp_path / "head", served_name="org/tiny",
                                    target_dir=str(tiny_target), vllm_load_check="always"))
    assert not (tmp_path / "head").exists()


@pytest.mark.parametrize("rule", ["best_simulated_tau", "last"])
def test_select_keeps_the_epoch_with_the_best_simulated_tau(workdir, tiny_target, monkeypatch, rule):
    """Evaluation made to report simulated tau 2.5, 3.0, 1.5 for epochs 0-2 (loss falling all along): the
    checkpoint holds epoch 1's weights under best_simulated_tau, epoch 2's under last, and metrics say which."""
    d, _, _ = workdir
    taus, seen = iter([2.5, 3.0, 1.5]), []

    def fake_evaluate(model, batches, device, call_kwargs, ttt_steps, target=None, cudagraphs=False):
        seen.append({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad})
        return {"loss": 1.0, "simulated_acceptance_length": next(taus)}

    monkeypatch.setattr(td, "evaluate", fake_evaluate)
    out = d / f"select-{rule}"
    m = td.train(target_dir=str(tiny_target), train_shards=[str(d / "train-shard.safetensors")],
                 eval_shards=[str(d / "eval-shard.safetensors")], d2t_path=str(d / "d2t.npy"),
                 t2d_path=str(d / "t2d.npy"), vocab_json=str(d / "vocab.json"),
                 decisions_json=str(d / "decisions.json"), out_dir=str(out), epochs=3, lr=3e-3, total_seq_len=256,
                 ttt_steps=3, seed=0, device="cpu", select=rule)
    want = 1 if rule == "best_simulated_tau" else 2
    assert m["selection"] == {"rule": rule, "epoch": want, "simulated_acceptance_length": [2.5, 3.0, 1.5][want],
                              "last_epoch": 2, "last_simulated_acceptance_length": 1.5}
    assert json.loads((out / "metrics.json").read_text())["selection"]["epoch"] == want
    written = load_file(str(out / "model.safetensors"))
    assert not torch.equal(seen[1]["fc.weight"], seen[2]["fc.weight"])  # the epochs differ
    for name, value in seen[want].items():
        assert torch.equal(written[name], value), name


def test_summarise_known_counts():
    """speculators' summed metrics of a made-up eval: 10 positions; the draft's first token right at 8, its
    first two at 5, all three at 2 (full accuracy: the whole chain so far right). Loss per position, accuracy
    per step and simulated tau = 1 + 0.8 + 0.5 + 0.2 = 2.5 (chain acceptance, EAGLE-3 paper)."""
    from eagle3build.train.train_metrics import summarise

    acc = {"loss_sum": 30.0, "loss_total": 10.0}
    for k, (full, cond) in enumerate(((8, 8), (5, 5 / 8 * 10), (2, 2 / 5 * 10))):
        acc.update({f"loss_{k}_sum": float(k + 1) * 10, f"loss_{k}_total": 10.0, f"full_acc_{k}_sum": float(full),
                    f"full_acc_{k}_total": 10.0, f"cond_acc_{k}_sum": float(cond), f"cond_acc_{k}_total": 10.0})
    s = summarise(acc, 3)
    assert s["loss"] == 3.0 and s["loss_per_step"] == [1.0, 2.0, 3.0]
    assert s["full_acc_per_step"] == [0.8, 0.5, 0.2] and s["cond_acc_per_step"] == pytest.approx([0.8, 0.625, 0.4])
    assert s["simulated_acceptance_length"] == pytest.approx(2.5)
    assert summarise({"loss_sum": 0.0, "loss_total": 0.0}, 3)["simulated_acceptance_length"] == 1.0  # nothing drafted
