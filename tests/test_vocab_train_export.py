"""build_vocab_map, train_draft and export_head on a tiny random target with real captured shards."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from eagle3build import build_vocab_map as bv
from eagle3build import export_head as ex
from eagle3build import train_draft as td
from eagle3build import vocab_map as vm
from eagle3build.artifacts import minimal_decisions

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


def test_train_loss_falls_and_checkpoint_is_written(workdir, tiny_target):
    d, _, info = workdir
    out = d / "checkpoint"
    m = td.train(str(tiny_target), [str(d / "train-shard.safetensors")], [str(d / "eval-shard.safetensors")],
                 str(d / "d2t.npy"), str(d / "t2d.npy"), str(d / "vocab.json"), str(d / "decisions.json"), str(out),
                 epochs=12, lr=3e-3, total_seq_len=256, ttt_steps=3, seed=0, device="cpu")
    losses = [h["loss"] for h in m["train_history"]]
    assert m["steps"] == len(losses) >= 12
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3])
    ev = m["final_eval"]
    assert len(ev["full_acc_per_step"]) == 3 and 1.0 <= ev["simulated_acceptance_length"] <= 4.0
    assert ev["simulated_acceptance_length"] == pytest.approx(1 + sum(ev["full_acc_per_step"]))
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
        td.train(str(tiny_target), [str(d / "train-shard.safetensors")], [], str(d / "d2t.npy"), str(d / "t2d.npy"),
                 str(d / "vocab.json"), str(tmp_path / "decisions.json"), str(tmp_path / "ck"), device="cpu")


def test_export_head(workdir, tiny_target):
    d, _, info = workdir
    ck = d / "checkpoint"
    if not ck.exists():
        pytest.skip("needs the checkpoint of test_train_loss_falls_and_checkpoint_is_written")
    head = d / "head"
    # vLLM's CPU attention has no kernel for the tiny target's head_dim 16; the e2e test has vLLM load a real head.
    ex.export(ck, str(d / "d2t.npy"), str(d / "t2d.npy"), str(d / "vocab.json"), head, "org/tiny-llama", str(tiny_target),
              vllm_load_check="never")
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["architectures"] == ["Eagle3DraftModel"]
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "org/tiny-llama"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == AUX and cfg["draft_vocab_size"] == 256
    assert cfg["norm_before_fc"] is True and cfg["norm_output"] is True  # eagle3.1 default
    assert str(tiny_target) not in (head / "config.json").read_text()
    with safe_open(str(head / "model.safetensors"), "pt") as f:
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
        assert f.get_tensor("lm_head.weight").shape == (256, 64) and f.get_tensor("lm_head.weight").dtype == torch.bfloat16
        assert set(ex.expected_shapes(cfg)) == set(f.keys())


def test_export_refuses_other_vocab_map(workdir, tiny_target, tmp_path):
    d, _, info = workdir
    ck = d / "checkpoint"
    if not ck.exists():
        pytest.skip("needs the checkpoint")
    other = bv.build(d / "train.safetensors", 49152, 300, tmp_path / "d2t.npy", tmp_path / "t2d.npy", tmp_path / "v.json")
    with pytest.raises(ex.ExportError, match=f"fingerprint {other['fingerprint']}.*trained with {info['fingerprint']}"):
        ex.export(ck, str(tmp_path / "d2t.npy"), str(tmp_path / "t2d.npy"), str(tmp_path / "v.json"), tmp_path / "head",
                  "org/tiny", str(tiny_target))
    assert not (tmp_path / "head").exists()


@pytest.mark.vllm
def test_export_fails_and_leaves_nothing_when_vllm_cannot_serve_the_head(workdir, tiny_target, tmp_path):
    """The tiny target's head_dim 16 has no vLLM CPU attention kernel: the load check must fail the export."""
    pytest.importorskip("vllm")
    d, _, _ = workdir
    ck = d / "checkpoint"
    if not ck.exists():
        pytest.skip("needs the checkpoint")
    with pytest.raises(ex.ExportError, match="vLLM cannot serve"):
        ex.export(ck, str(d / "d2t.npy"), str(d / "t2d.npy"), str(d / "vocab.json"), tmp_path / "head", "org/tiny",
                  str(tiny_target), vllm_load_check="always")
    assert not (tmp_path / "head").exists()


@pytest.mark.parametrize("rule", ["best_simulated_tau", "last"])
def test_select_keeps_the_epoch_with_the_best_simulated_tau(workdir, tiny_target, monkeypatch, rule):
    """Evaluation made to report simulated tau 2.5, 3.0, 1.5 for epochs 0-2 (loss falling all along): the
    checkpoint holds epoch 1's weights under best_simulated_tau, epoch 2's under last, and metrics say which."""
    d, _, _ = workdir
    taus, seen = iter([2.5, 3.0, 1.5]), []

    def fake_evaluate(model, batches, device, call_kwargs, ttt_steps):
        seen.append({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad})
        return {"loss": 1.0, "simulated_acceptance_length": next(taus)}

    monkeypatch.setattr(td, "evaluate", fake_evaluate)
    out = d / f"select-{rule}"
    m = td.train(str(tiny_target), [str(d / "train-shard.safetensors")], [str(d / "eval-shard.safetensors")],
                 str(d / "d2t.npy"), str(d / "t2d.npy"), str(d / "vocab.json"), str(d / "decisions.json"), str(out),
                 epochs=3, lr=3e-3, total_seq_len=256, ttt_steps=3, seed=0, device="cpu", select=rule)
    want = 1 if rule == "best_simulated_tau" else 2
    assert m["selection"] == {"rule": rule, "epoch": want, "simulated_acceptance_length": [2.5, 3.0, 1.5][want],
                              "last_epoch": 2, "last_simulated_acceptance_length": 1.5}
    assert json.loads((out / "metrics.json").read_text())["selection"]["epoch"] == want
    written = load_file(str(out / "model.safetensors"))
    assert not torch.equal(seen[1]["fc.weight"], seen[2]["fc.weight"])  # the epochs differ
    for name, value in seen[want].items():
        assert torch.equal(written[name], value), name
