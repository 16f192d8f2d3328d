"""Job hosts (eagle3build/workflow/host.py, issue 70): the capture jobs of a Snakemake run hand their shards to one
process that loads the target once. Here on the tiny target, without Snakemake: the test process stands for the run's
Snakemake process (``owner_process``), so each host ends with this session at the latest. Each host costs ~6 s here
(Python, torch and the target): the tests past the first of them are marked slow. The reduced build's one
load through Snakemake is tests/test_e2e.py's ``test_capture_loads_the_target_once``; the vllm backend's one engine
for two shards, tests/test_vllm_capture.py's ``test_two_shards_through_one_vllm_host``."""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from eagle3build.capture import capture_hidden_states as cap
from eagle3build.data import prepare_data as pd
from eagle3build.formats.shards import ShardReader
from eagle3build.workflow import contract, gpu_slots, host, job

STAGE = "capture_hidden_states"
LENGTHS = [12, 30, 7, 19, 25, 40, 9, 33]


@pytest.fixture
def lock_dir(monkeypatch):
    """A GPU lock folder of its own (short: a Unix socket's path holds 107 bytes), hosts ending 3 s after their last
    job, this test process as their Snakemake process."""
    d = Path(tempfile.mkdtemp(prefix="e3h-", dir="/tmp"))
    monkeypatch.setenv("EAGLE3BUILD_GPU_LOCK_DIR", str(d))
    monkeypatch.setenv(host.ENV_LINGER, "3")
    me = (os.getpid(), host._proc_stat(os.getpid())[2])
    monkeypatch.setattr(host, "owner_process", lambda: me)
    yield d
    for f in host.hosts_dir().glob("*.json"):  # a host a failed test left: ended now, not at the session's end
        try:
            os.kill(json.loads(f.read_text())["pid"], 9)
        except (OSError, ValueError, KeyError):
            pass


@pytest.fixture
def tokens(tmp_path):
    rng = np.random.default_rng(0)
    samples = [(f"s{i}", rng.integers(0, 49152, n).astype(np.int32), (rng.random(n) > 0.5).astype(np.uint8))
               for i, n in enumerate(LENGTHS)]
    pd.write_tokens(tmp_path / "train.safetensors", samples)
    return tmp_path / "train.safetensors"


def settings(target, tokens, out, start=0, count=4, **kw):
    fields = dict(target_dir=target, tokens_path=tokens, out_path=out, start=start, count=count, aux_layer_ids=[1, 3, 4],
                  target_fingerprint="fp-tiny", split="train", compute_dtype="auto", tokens_per_batch=64)
    return cap.CaptureSettings(**{**fields, **kw})


def sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def host_files(lock_dir) -> list[str]:
    return sorted(p.suffix for p in host.hosts_dir().iterdir() if p.suffix != ".log")


def wait_for(cond, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_the_capture_stage_is_hosted_by_its_own_functions():
    """contract.HOSTED names functions of the stage's module, and its entry takes what the host loads and ``alive``."""
    import inspect

    hosted = contract.HOSTED[STAGE]
    assert callable(getattr(cap, hosted.spec)) and callable(getattr(cap, hosted.load))
    assert contract.entry(STAGE) == "eagle3build.capture.capture_hidden_states:capture_shard"
    assert {"model", "engine", "alive"} <= set(inspect.signature(cap.capture_shard).parameters)
    assert host.routed(STAGE) is True and host.routed("train_draft") is False


def test_two_shards_one_load_and_the_bytes_of_a_capture_in_process(tiny_target, tokens, tmp_path, lock_dir):
    """Two jobs of one run go to one host: one target load, the second job served by the loaded host; each shard is
    byte for byte the one capture_shard writes in the job's own process (the route before issue 70)."""
    a = host.run_job(STAGE, settings(tiny_target, tokens, tmp_path / "a.safetensors"), 2, 0)
    b = host.run_job(STAGE, settings(tiny_target, tokens, tmp_path / "b.safetensors", start=4), 2, 0)
    assert a["host"]["pid"] == b["host"]["pid"] and (a["host"]["jobs_served"], b["host"]["jobs_served"]) == (1, 2)
    assert (a["samples"], b["samples"], a["tokens"]) == (4, 4, sum(LENGTHS[:4]))
    torch.set_num_threads(2)
    cap.capture_shard(settings(tiny_target, tokens, tmp_path / "a0.safetensors"))
    cap.capture_shard(settings(tiny_target, tokens, tmp_path / "b0.safetensors", start=4))
    assert sha(tmp_path / "a.safetensors") == sha(tmp_path / "a0.safetensors")
    assert sha(tmp_path / "b.safetensors") == sha(tmp_path / "b0.safetensors")
    assert ShardReader(tmp_path / "b.safetensors").meta.sample_ids == ["s4", "s5", "s6", "s7"]
    (log,) = host.hosts_dir().glob("host-*.log")  # this process's stderr is no file: beside the sockets
    text = log.read_text()
    assert len(re.findall(r"target loaded in [\d.]+ s", text)) == 1 and "job 2: done" in text
    wait_for(lambda: "ends (idle for 3 s) after 2 job(s)" in log.read_text())
    wait_for(lambda: host_files(lock_dir) == [])  # socket, lease, spec and pid file removed


@pytest.mark.slow  # a host or more started (~6 s each on 2 cores)
def test_other_threads_or_settings_start_another_host(tiny_target, tokens, tmp_path, lock_dir):
    a = host.run_job(STAGE, settings(tiny_target, tokens, tmp_path / "a.safetensors"), 2, 0)
    b = host.run_job(STAGE, settings(tiny_target, tokens, tmp_path / "b.safetensors"), 1, 0)
    c = host.run_job(STAGE, settings(tiny_target, tokens, tmp_path / "c.safetensors", target_fingerprint="other"), 1, 0)
    assert len({a["host"]["pid"], b["host"]["pid"], c["host"]["pid"]}) == 3


CLIENT = """
import json, os, socket, sys
from eagle3build.workflow import gpu_slots, host
d, key, fields = host.hosts_dir(), sys.argv[1], json.loads(sys.argv[2])
conn, lease_fd, info = host.lease(d, key)
gpu_slots.send_message(conn, {"op": "run", "settings": fields}, fds=[2])
os._exit(0)  # gone before the answer, as a killed job
"""


@pytest.mark.slow  # a host or more started (~6 s each on 2 cores)
def test_a_job_gone_before_its_answer_leaves_no_shard(tiny_target, tokens, tmp_path, lock_dir):
    """A job that goes away while its shard is captured (killed) leaves neither shard nor temporary: the host drops
    it before the rename, and serves the next job."""
    first = host.run_job(STAGE, settings(tiny_target, tokens, tmp_path / "a.safetensors"), 2, 0)
    s = settings(tiny_target, tokens, tmp_path / "gone.safetensors", start=2)
    spec = host.host_spec(STAGE, s, 2, 0, host.owner_process())
    fields = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in s.__dict__.items()}
    p = subprocess.run([sys.executable, "-c", CLIENT, spec["key"], json.dumps(fields)], env=dict(os.environ),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    (log,) = host.hosts_dir().glob("host-*.log")
    wait_for(lambda: "job 2: failed or gone" in log.read_text())
    assert not list(tmp_path.glob("*gone*")) and not list(tmp_path.glob(".gone*"))
    nxt = host.run_job(STAGE, settings(tiny_target, tokens, tmp_path / "b.safetensors"), 2, 0)
    assert nxt["host"]["pid"] == first["host"]["pid"] and nxt["host"]["jobs_served"] == 3


@pytest.mark.slow  # a host or more started (~6 s each on 2 cores)
def test_a_failed_job_fails_with_its_error_and_ends_its_host(tiny_target, tokens, tmp_path, lock_dir):
    with pytest.raises(IndexError, match="shard wants samples from 50, but the split has only 8"):
        host.run_job(STAGE, settings(tiny_target, tokens, tmp_path / "x.safetensors", start=50), 2, 0)
    wait_for(lambda: host_files(lock_dir) == [])
    ok = host.run_job(STAGE, settings(tiny_target, tokens, tmp_path / "a.safetensors"), 2, 0)
    assert ok["host"]["jobs_served"] == 1  # a fresh host


@pytest.mark.slow  # a host or more started (~6 s each on 2 cores)
def test_an_idle_holder_gives_its_gpus_up_when_asked(tiny_target, tokens, tmp_path, lock_dir):
    """A host named beside a GPU's lock (gpu_slots.register_holder) ends when a claimant asks while it is idle."""
    a = host.run_job(STAGE, settings(tiny_target, tokens, tmp_path / "a.safetensors"), 2, 0)
    (sock,) = host.hosts_dir().glob("*.sock")
    gpu_slots.register_holder(["7"], str(sock), lock_dir)
    assert gpu_slots.ask_holders(["7"], lock_dir) == ["7"]
    wait_for(lambda: host_files(lock_dir) == [])
    (log,) = host.hosts_dir().glob("host-*.log")
    assert f"job host pid {a['host']['pid']} ends (a job asked for its GPUs) after 1 job(s)" in log.read_text()


@pytest.mark.slow  # a host or more started (~6 s each on 2 cores)
def test_a_host_ends_with_its_snakemake_process(tiny_target, tokens, tmp_path, lock_dir, monkeypatch):
    monkeypatch.setenv(host.ENV_LINGER, "600")
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    monkeypatch.setattr(host, "owner_process", lambda: (owner.pid, host._proc_stat(owner.pid)[2]))
    host.run_job(STAGE, settings(tiny_target, tokens, tmp_path / "a.safetensors"), 2, 0)
    assert host_files(lock_dir) == [".json", ".lease", ".sock", ".spec"]
    owner.kill()
    owner.wait()
    wait_for(lambda: host_files(lock_dir) == [])
    (log,) = host.hosts_dir().glob("host-*.log")
    assert "ends (its Snakemake process is gone) after 1 job(s)" in log.read_text()


HOLDER = """
import os, sys, time
from eagle3build.workflow import gpu_slots
a = gpu_slots.acquire(1, num_gpus=1, lock_dir=sys.argv[1])
child = os.fork()
if child == 0:  # the child keeps the parent's lock descriptors, as a host started with pass_fds
    time.sleep(float(sys.argv[2]))
    os._exit(0)
a.release()  # the parent lets go of its own copies
print(child, flush=True)
"""


def test_a_lock_passed_to_a_child_stays_held_after_the_parent_lets_go(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), "2"], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip().isdigit() and p.wait(timeout=60) == 0  # the parent let go and exited
    assert gpu_slots.try_acquire(1, ["0"], tmp_path, ask=False) is None  # the child holds GPU 0
    with gpu_slots.acquire(1, num_gpus=1, lock_dir=tmp_path, timeout=30, poll=0.05) as a:  # once it exits
        assert a.gpus == ["0"]


def test_messages_carry_json_and_file_descriptors():
    a, b = socket.socketpair()
    with a, b, open(os.devnull, "w") as f:
        gpu_slots.send_message(a, {"op": "run", "x": [1, 2]}, fds=[f.fileno()])
        msg, fds = gpu_slots.recv_message(b)
        assert msg == {"op": "run", "x": [1, 2]} and len(fds) == 1 and os.fstat(fds[0]).st_ino == os.fstat(f.fileno()).st_ino
        os.close(fds[0])
        a.close()
        with pytest.raises(EOFError):
            gpu_slots.recv_message(b)


class Named(dict):
    """A Snakemake ``Namedlist``'s two faces: items and attributes."""

    __getattr__ = dict.__getitem__


def test_the_adapter_routes_a_capture_job_and_takes_no_gpu_for_it(tmp_path, monkeypatch):
    """job.main: a hosted stage's job gets its settings object made as run_stage makes it, and goes to run_job with
    the job's threads and GPUs; job.setup takes no GPU lock for it. EAGLE3BUILD_JOB_HOST=0 routes nothing."""
    import logging

    from test_stage_entries import fake_job

    j = fake_job(STAGE, tmp_path)
    smk = Named(rule=STAGE, threads=3, log=[str(tmp_path / "job.log")], input=j["inputs"], output=j["outputs"],
                wildcards={"split": "eval"}, resources=Named(gpu=2),
                params=Named(**j["params"], settings=j["settings"], version={"output": 1}))
    calls = []
    monkeypatch.setattr(host, "run_job", lambda stage, s, threads, gpus: calls.append((stage, s, threads, gpus)) or 1)
    monkeypatch.setattr(gpu_slots, "claim_for_job", lambda n: pytest.fail("a hosted job took GPUs in setup"))
    monkeypatch.setattr(job, "log_to_file", lambda path: logging.getLogger("test-job"))
    job.setup(smk)
    monkeypatch.setattr(job, "setup", lambda smk: logging.getLogger("test-job"))
    assert job.main(smk) == 1
    ((stage, s, threads, gpus),) = calls
    assert (stage, threads, gpus, s.split, s.start, s.gpus, s.device) == (STAGE, 3, 2, "eval", 64, 2, "cuda")
    monkeypatch.setenv(host.ENV_SWITCH, "0")
    assert host.routed(STAGE) is False
