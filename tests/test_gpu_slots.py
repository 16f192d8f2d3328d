"""GPU slot allocation: concurrent jobs get disjoint GPUs; a crashed job's GPUs come back."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from eagle3build.workflow import gpu_slots

WORKER = """
import glob, json, os, sys, time
from eagle3build.workflow import gpu_slots
lock_dir, out, n, hold, crash = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
barrier = int(sys.argv[6])
a = gpu_slots.acquire(n, num_gpus=8, lock_dir=lock_dir, poll=0.05)
t0 = time.time()
with open(out, "w") as f:
    json.dump({"pid": os.getpid(), "gpus": a.gpus, "start": t0}, f)
if crash:
    os.kill(os.getpid(), 9)
while len(glob.glob(os.path.join(os.path.dirname(out), "job*.json"))) < barrier and time.time() - t0 < 60:
    time.sleep(0.02)  # held until `barrier` jobs hold theirs: Python's start-up on a loaded machine outlasts a hold
time.sleep(hold)
with open(out, "w") as f:
    json.dump({"pid": os.getpid(), "gpus": a.gpus, "start": t0, "end": time.time()}, f)
"""


def spawn(tmp_path, name, n=2, hold=1.5, crash=False, barrier=0):
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path / "locks"), str(tmp_path / f"{name}.json"),
                             str(n), str(hold), "1" if crash else "0", str(barrier)], env=env)


def test_four_jobs_of_two_gpus_are_disjoint_and_concurrent(tmp_path):
    procs = [spawn(tmp_path, f"job{i}", hold=0.5, barrier=4) for i in range(4)]
    assert all(p.wait(timeout=90) == 0 for p in procs)
    jobs = [json.loads((tmp_path / f"job{i}.json").read_text()) for i in range(4)]
    sets = [set(j["gpus"]) for j in jobs]
    assert all(len(s) == 2 for s in sets)
    assert set().union(*sets) == {str(i) for i in range(8)}  # pairwise disjoint, 8 GPUs in all
    assert max(j["start"] for j in jobs) < min(j["end"] for j in jobs)  # all four held GPUs at once


def test_fifth_job_waits_for_a_release(tmp_path):
    procs = [spawn(tmp_path, f"job{i}", hold=2.0) for i in range(4)]
    # the late job starts once all four hold their GPUs (each writes its file after acquiring): a fixed sleep
    # raced on a loaded 2-core CI machine, where starting four Pythons took longer than 0.5 s
    deadline = time.time() + 60
    while not all((tmp_path / f"job{i}.json").exists() for i in range(4)):
        assert time.time() < deadline, "the four jobs did not all acquire their GPUs within 60 s"
        time.sleep(0.02)
    late = spawn(tmp_path, "late", hold=0.1)
    assert all(p.wait(timeout=60) == 0 for p in procs + [late])
    first_end = min(json.loads((tmp_path / f"job{i}.json").read_text())["end"] for i in range(4))
    assert json.loads((tmp_path / "late.json").read_text())["start"] >= first_end - 0.05


def test_crashed_job_releases_its_gpus(tmp_path):
    p = spawn(tmp_path, "crash", n=8, crash=True)
    assert p.wait(timeout=60) == -signal.SIGKILL
    assert len(json.loads((tmp_path / "crash.json").read_text())["gpus"]) == 8
    with gpu_slots.acquire(8, num_gpus=8, lock_dir=tmp_path / "locks", timeout=5) as a:
        assert sorted(a.gpus, key=int) == [str(i) for i in range(8)]


def test_too_many_and_timeout(tmp_path):
    with pytest.raises(ValueError, match="wants 9 GPU"):
        gpu_slots.acquire(9, num_gpus=8, lock_dir=tmp_path)
    with gpu_slots.acquire(6, num_gpus=8, lock_dir=tmp_path):
        with pytest.raises(TimeoutError, match="3 GPU"):
            gpu_slots.acquire(3, num_gpus=8, lock_dir=tmp_path, timeout=0.3, poll=0.05)


def test_pool_follows_cuda_visible_devices(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert gpu_slots.visible_gpus() == ["4", "5", "6", "7"]
    with gpu_slots.acquire(2, lock_dir=tmp_path) as a:
        assert a.gpus == ["4", "5"] and a.cuda_visible_devices == "4,5"
