"""Training: exact resume after SIGKILL, resume on fewer ranks than saved (one process, or fewer gloo processes), and
DDP over two gloo processes equal to one process on the same global batch."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def test_sigterm_saves_the_state_after_the_step_in_flight_and_the_rerun_resumes_bit_identical(
        tiny_shards, tiny_target, tmp_path, monkeypatch):
    """A real SIGTERM to this process mid-epoch (a device call's deadline, a cluster's time limit) with no periodic save
    due (checkpoint_every 1000): the step in flight finishes, the state after it is saved, the run stops with
    ``TrainingStopped`` naming the step and the state's folder; run again, it resumes from that step and ends with the
    uninterrupted run's weights and step count (issue 65: nothing lost at a call boundary)."""
    from eagle3build.train import trainer

    d, _, _ = tiny_shards
    ref = tmp_path / "ref"
    r = td.train(**kwargs(d, tiny_target, ref, checkpoint_every=1000, noise_std=0.0))
    out = tmp_path / "cut"
    step, calls = trainer.train_step, []

    def term_at_third(t, rows, speed):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives mid-step: the handler only sets t.stop
        return step(t, rows, speed)

    monkeypatch.setattr(trainer, "train_step", term_at_third)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(trainer.TrainingStopped, match=r"after step 3 of \d+ is saved in .*cut\.state"):
        td.train(**kwargs(d, tiny_target, out, checkpoint_every=1000, noise_std=0.0))
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back
    assert not out.exists() and torch.load(tmp_path / "cut.state/state.pt", weights_only=True)["step"] == 3
    monkeypatch.setattr(trainer, "train_step", step)
    m = td.train(**kwargs(d, tiny_target, out, checkpoint_every=1000, noise_std=0.0))
    assert m["resumed_from_step"] == 3 and m["steps"] == r["steps"]
    a, b = weights(ref), weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


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
        from eagle3build.draft import vocab_map as vm

        d, _, _ = tiny_shards
        d2t, t2d, _ = vm.load(d / "d2t.npy", d / "t2d.npy", d / "vocab.json")
        torch.manual_seed(0)
        _INIT.update(td.build_model(str(tiny_target), [1, 3, 4], d2t, t2d, 3, "eagle3.1", "cpu",
                                    trust_remote_code=False).state_dict())
    return _INIT[k]


class Crash(Exception):
    """Stands for a job killed right after it saved its state."""


def crash_after_save(monkeypatch, step: int) -> None:
    """Make training raise ``Crash`` right after it saved the state of step ``step`` (the state stays, as after a
    SIGKILL; in this process, so no interpreter start and no model import per run)."""
    from eagle3build.train.train_state import TrainState

    save = TrainState.save

    def save_then_crash(self, state_dir, key):
        save(self, state_dir, key)
        if self.step >= step:
            raise Crash(self.step)

    monkeypatch.setattr(TrainState, "save", save_then_crash)


def test_run_saved_on_two_ranks_resumes_on_one(tiny_shards, tiny_target, tmp_path, monkeypatch, caplog):
    """Issue 38.8: a run saved on 2 ranks and restarted on 1 (8 GPUs re-queued on 4) neither starts over nor deletes
    its state: it resumes with its world size, the one process computing both ranks' rows, and ends bit-identical
    (CPU) to the run never interrupted on 2. Before: a warning, a fresh run on 1, the state overwritten."""
    d, _, _ = tiny_shards
    ref = tmp_path / "ref"
    r = td.train(**kwargs(d, tiny_target, ref, world_size=2, checkpoint_every=0))
    assert r["steps"] == 8  # 2 steps an epoch on 2 ranks (4 on 1), 4 epochs
    out = tmp_path / "ck"
    state = tmp_path / "ck.state" / "state.pt"
    with monkeypatch.context() as m:
        crash_after_save(m, 3)
        with pytest.raises(Crash):
            td.train(**kwargs(d, tiny_target, out, world_size=2))
    saved = torch.load(state, weights_only=True)
    assert (saved["world"], saved["step"]) == (2, 3) and not out.exists()
    with caplog.at_level("WARNING"):
        m = td.train(**kwargs(d, tiny_target, out, world_size=1))
    assert f"resuming {state} (step 3) with its world size 2 on 1 process(es), each computing the rows of 2 ranks" \
        in caplog.text
    assert m["resumed_from_step"] == 3 and m["steps"] == r["steps"]
    assert json.loads((out / "train_meta.json").read_text())["world_size"] == 2
    assert [h["loss"] for h in m["train_history"]] == [h["loss"] for h in r["train_history"]]
    a, b = weights(ref), weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not state.exists()  # removed once the run wrote its checkpoint


def test_state_on_fewer_ranks_than_processes_is_refused_and_kept(tiny_shards, tiny_target, tmp_path):
    """Issue 38.8: a state saved on 1 rank, met by 2 processes (1 GPU re-queued on 2: a process would have no row),
    is refused naming both sizes, the file and what to do, and kept byte for byte; a state saved before states
    recorded their world size is recognised by its key. Fabricated states (no run needed)."""
    from eagle3build.train.train_state import ResumeAcrossWorldSizes, resume_world, state_key

    settings = {"lr": 1e-3, "shards": [["a.safetensors", 10]]}
    d = tmp_path / "ck.state"
    d.mkdir()
    f = d / "state.pt"
    torch.save({"key": state_key({**settings, "world": 1}), "key_any_world": state_key({**settings, "world": None}),
                "world": 1, "step": 7}, f)
    before = f.read_bytes()
    with pytest.raises(ResumeAcrossWorldSizes) as e:
        resume_world(d, settings, 2, 2)
    assert str(e.value).startswith(f"{f}: saved at step 7 by this run on world size 1 ")
    assert "this run has 2 processes" in str(e.value) and "run on at most 1 GPUs (resources.train.gpu)" in str(e.value)
    assert f"delete {d} to start over on 2" in str(e.value)
    assert f.read_bytes() == before
    assert resume_world(d, settings, 2, 1) == 1  # one process resumes it
    assert resume_world(d, {**settings, "lr": 2e-3}, 2, 2) == 2  # another run's state: not this run's to resume
    torch.save({"key": state_key({**settings, "world": 8}), "step": 7}, f)  # saved before "world" was recorded
    assert resume_world(d, settings, 4, 4) == 8
    with pytest.raises(ResumeAcrossWorldSizes, match="world size 8 .* this run has 16 processes"):
        resume_world(d, settings, 16, 16)


@pytest.mark.slow
def test_run_saved_on_three_ranks_resumes_on_two_gloo_processes(tiny_shards, tiny_target, tmp_path, monkeypatch):
    """Issue 38.8 under DDP: a run saved on 3 ranks resumes on 2 processes (rows 0 and 2 on one, row 1 on the other:
    uneven, one all-reduce each per step) and ends equal, within float noise, to the run never interrupted."""
    d, _, _ = tiny_shards
    ref = tmp_path / "ref"
    r = td.train(**kwargs(d, tiny_target, ref, world_size=3, checkpoint_every=0, select="last"))
    assert r["steps"] == 4  # 1 step an epoch on 3 ranks
    out = tmp_path / "ck"
    with monkeypatch.context() as m:
        crash_after_save(m, 2)
        with pytest.raises(Crash):
            td.train(**kwargs(d, tiny_target, out, world_size=3, select="last"))
    td.launch(kwargs(d, tiny_target, out, select="last"), nproc=2)
    m2 = json.loads((out / "metrics.json").read_text())
    assert m2["resumed_from_step"] == 2 and m2["steps"] == 4
    assert json.loads((out / "train_meta.json").read_text())["world_size"] == 3
    a, b = weights(ref), weights(out)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


LAUNCH = ("import json, sys; from eagle3build.train.train_draft import launch; "
          "launch(json.loads(sys.argv[1]), nproc=2)")


@pytest.mark.slow
def test_sigterm_to_a_launching_job_reaches_its_ranks_and_leaves_no_process(tiny_shards, tiny_target, tmp_path):
    """Issue 71: SIGTERM to the process that launched a run on two gloo ranks (what a stop from outside sends a training
    job's own process: workflow/stop.py) is passed to torchrun and its ranks; they stop, the launch fails saying so, no
    rank outlives it, and the run resumes from a saved state to its full step count."""
    d, _, _ = tiny_shards
    out, state = tmp_path / "ck", tmp_path / "ck.state" / "state.pt"
    kw = kwargs(d, tiny_target, out, epochs=30, checkpoint_every=2, select="last")
    mark = f"i71-{os.getpid()}-{time.monotonic_ns()}"  # in every process of the launch: torchrun's ranks, in
    env = dict(os.environ, OMP_NUM_THREADS="1", EAGLE3BUILD_TEST_LAUNCH=mark)  # sessions of their own, inherit it
    p = subprocess.Popen([sys.executable, "-c", LAUNCH, json.dumps(kw)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 600
    while True:
        assert p.poll() is None and time.time() < deadline, p.stdout.read()[-3000:]
        try:
            if torch.load(state, weights_only=True)["step"] >= 2:
                break
        except Exception:  # noqa: BLE001 - not there yet, or racing its atomic rename
            pass
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    text = p.communicate(timeout=300)[0]
    assert p.returncode == 1 and "RuntimeError: SIGTERM, passed to the ranks: distributed training stopped" in text, \
        text[-3000:]
    assert not out.exists()
    assert _marked(mark) == [], "a rank or torchrun outlived the launch"
    saved = torch.load(state, weights_only=True)["step"]
    assert saved >= 2
    td.launch(kwargs(d, tiny_target, out, epochs=30, checkpoint_every=2, select="last"), nproc=2)
    m = json.loads((out / "metrics.json").read_text())
    assert m["resumed_from_step"] == saved and m["steps"] == 60  # 2 steps an epoch on 2 ranks, 30 epochs


def _marked(mark: str) -> list[int]:
    """The processes whose environment holds ``EAGLE3BUILD_TEST_LAUNCH=mark``."""
    out = []
    for e in os.scandir("/proc"):
        if e.name.isdigit():
            try:
                environ = Path(f"/proc/{e.name}/environ").read_bytes().split(b"\0")
            except OSError:  # gone, or not ours
                continue
            if f"EAGLE3BUILD_TEST_LAUNCH={mark}".encode() in environ:
                out.append(int(e.name))
    return out
