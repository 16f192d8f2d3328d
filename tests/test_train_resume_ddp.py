"""Training: exact resume after SIGKILL, and DDP over two gloo processes equal to one process on the same global batch."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from eagle3build.train import train_draft as td


def kwargs(d, target, out, **over):
    kw = dict(target_dir=str(target), train_shards=[str(d / "train-shard.safetensors")],
              eval_shards=[str(d / "eval-shard.safetensors")], d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"),
              vocab_json=str(d / "vocab.json"), decisions_json=str(d / "decisions.json"), out_dir=str(out), epochs=4, lr=3e-3,
              total_seq_len=160, ttt_steps=3, seed=0, noise_std=0.05, device="cpu", checkpoint_every=1)
    kw.update(over)
    return kw


TRAIN = ("import json, sys, torch; torch.set_num_threads(1); from eagle3build.train.train_draft import train; "
         "train(**json.loads(sys.argv[1]))")


def run_train(kw, **popen):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-c", TRAIN, json.dumps(kw)], env=env, **popen)


def kill_at_step(p: subprocess.Popen, state, step: int) -> None:
    """SIGKILL the training process ``p`` once its saved state ``state`` (state.pt) holds ``step`` steps."""
    deadline = time.time() + 600
    while time.time() < deadline:
        if state.exists():
            try:
                if torch.load(state, weights_only=True)["step"] >= step:
                    break
            except Exception:  # noqa: BLE001 - racing the atomic rename; try again
                pass
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    assert p.wait(timeout=60) == -signal.SIGKILL


def weights(out):
    return load_file(str(out / "model.safetensors"))


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_identical(tiny_shards, tiny_target, tmp_path):
    d, _, _ = tiny_shards
    ref = tmp_path / "ref"
    assert run_train(kwargs(d, tiny_target, ref)).wait(timeout=600) == 0
    steps = json.loads((ref / "metrics.json").read_text())["steps"]
    assert steps >= 8

    out = tmp_path / "killed"
    state = tmp_path / "killed.state" / "state.pt"
    kill_after = random.Random().randint(2, steps - 2)  # a random step
    kill_at_step(run_train(kwargs(d, tiny_target, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), state,
                 kill_after)
    assert not out.exists() and state.exists()
    killed_at = torch.load(state, weights_only=True)["step"]
    assert 1 <= killed_at < steps

    assert run_train(kwargs(d, tiny_target, out)).wait(timeout=600) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["resumed_from_step"] == killed_at and m["steps"] == steps
    a, b = weights(ref), weights(out)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert not state.exists()  # cleaned up after success


def test_state_of_other_settings_is_not_resumed(tiny_shards, tiny_target, tmp_path):
    d, _, _ = tiny_shards
    out = tmp_path / "ck"
    td.train(**kwargs(d, tiny_target, out, epochs=1, max_steps=2))
    state_dir = tmp_path / "ck.state"
    assert not state_dir.exists()
    # a state saved by a run with other settings is ignored, not resumed
    state_dir.mkdir()
    torch.save({"key": "other-key", "step": 5}, state_dir / "state.pt")
    m = td.train(**kwargs(d, tiny_target, out, epochs=1, max_steps=2))
    assert m["resumed_from_step"] is None and m["steps"] == 2


@pytest.mark.slow
def test_ddp_two_gloo_processes_equal_one_process(tiny_shards, tiny_target, tmp_path):
    d, _, _ = tiny_shards
    one = tmp_path / "one"
    # select=last: the weights after the same steps (a best-epoch choice could tip on float noise between the two)
    td.train(**kwargs(d, tiny_target, one, epochs=2, checkpoint_every=0, world_size=2, select="last"))
    two = tmp_path / "two"
    td.launch(kwargs(d, tiny_target, two, epochs=2, checkpoint_every=0, select="last"), nproc=2)
    m1 = json.loads((one / "metrics.json").read_text())
    m2 = json.loads((two / "metrics.json").read_text())
    assert m1["steps"] == m2["steps"] >= 2
    assert json.loads((two / "train_meta.json").read_text())["world_size"] == 2
    a, b = weights(one), weights(two)
    moved = 0
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
        moved += k.startswith("layers") and not torch.equal(a[k], weights_init(tiny_shards, tiny_target, k))
    assert moved > 0


_INIT: dict = {}


def weights_init(tiny_shards, tiny_target, k):
    """A freshly built model's tensor ``k`` (to show training moved the weights)."""
    if not _INIT:
        from eagle3build import vocab_map as vm

        d, _, _ = tiny_shards
        d2t, t2d, _ = vm.load(d / "d2t.npy", d / "t2d.npy", d / "vocab.json")
        torch.manual_seed(0)
        _INIT.update(td.build_model(str(tiny_target), [1, 3, 4], d2t, t2d, 3, "eagle3.1", "cpu").state_dict())
    return _INIT[k]


def test_state_of_another_world_size_is_refused_and_kept(tiny_shards, tiny_target, tmp_path):
    """Issue 38.8: a run saved on 2 ranks and restarted on 1 neither starts over nor deletes the state: it is
    refused, naming both world sizes, and the state stays for a restart on 2, which resumes it."""
    import pytest

    from eagle3build.train.train_state import ResumeAcrossWorldSizes

    d, _, _ = tiny_shards
    out = tmp_path / "ck"
    state = tmp_path / "ck.state" / "state.pt"
    kill_at_step(run_train(kwargs(d, tiny_target, out, world_size=2), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL), state, 1)
    saved = torch.load(state, weights_only=True)
    assert saved["world"] == 2
    with pytest.raises(ResumeAcrossWorldSizes, match=r"world size 2 .*this run has world size 1") as e:
        td.train(**kwargs(d, tiny_target, out, world_size=1))
    assert str(state) in str(e.value)
    assert torch.load(state, weights_only=True)["step"] == saved["step"] and not out.exists()
    m = td.train(**kwargs(d, tiny_target, out, world_size=2))
    assert m["resumed_from_step"] == saved["step"]
