"""A stop from outside (issue 71, eagle3build/workflow/stop.py): SIGINT or SIGTERM to the Snakemake process alone
reaches the running jobs as SIGTERM and keeps each job that finishes anyway. Here on a Snakefile of three rules (one
job that finishes whatever it is told, one that stops on SIGTERM, one after them), against Snakemake's own handling,
and a hosted job's half of it (host.run_job) against a stand-in host. The reduced build's training stopped and resumed
through Snakemake: tests/test_e2e.py's ``test_a_stop_from_outside_loses_no_training_step``."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from smk import REPO, SNAKEMAKE

from eagle3build.workflow import host, stop

SNAKEFILE = """
import sys
sys.path.insert(0, {repo!r})
from eagle3build.workflow import stop
if {forward}:
    onstart:
        stop.forward_signals(workflow, logger.warning)
rule all:
    input: "later.txt"
rule finishes:  # a job that ends its work whatever it is told (a training past its last step)
    output: "finishes.txt"
    shell: "python finishes.py {{output}}"
rule stops:  # a job that stops on SIGTERM, keeping its state (a training mid-epoch)
    output: "stops.txt"
    shell: "python stops.py {{output}}"
rule later:
    input: "finishes.txt", "stops.txt"
    output: "later.txt"
    shell: "touch {{output}}"
"""
JOBS = {
    # it ends after the signal whatever the load: it waits for the file the test writes once the signal is sent
    "finishes.py": "import os, signal, sys, time\n"
                   "signal.signal(signal.SIGTERM, lambda *a: None)\n"
                   "open('started-f', 'w')\n"
                   "t = time.monotonic()\n"
                   "while not os.path.exists('signalled') and time.monotonic() - t < 60:\n"
                   "    time.sleep(0.05)\n"
                   "time.sleep(1)\n"
                   "open(sys.argv[1], 'w').write('done')\n",
    "stops.py": "import signal, sys, time\n"
                "signal.signal(signal.SIGTERM, lambda *a: (open('state', 'w'), sys.exit(1)))\n"
                "open('started-s', 'w')\n"
                "time.sleep(12)\n"
                "open(sys.argv[1], 'w')\n",
}


def session_processes(sid: int) -> list[int]:
    """The processes of session ``sid`` (a process started with ``start_new_session`` and what it started)."""
    out = []
    for e in os.scandir("/proc"):
        if e.name.isdigit():
            try:
                if os.getsid(int(e.name)) == sid:
                    out.append(int(e.name))
            except OSError:
                pass
    return out


def stopped_run(wd: Path, sig: int, forward: bool) -> tuple[int, float, str]:
    """Snakemake on SNAKEFILE in ``wd``, ``sig`` sent to its process alone once both jobs run:
    ``(its exit status, seconds from the signal to its exit, its output)``."""
    (wd / "Snakefile").write_text(SNAKEFILE.format(repo=str(REPO), forward=forward))
    for name, text in JOBS.items():
        (wd / name).write_text(text)
    log = wd / "log"
    with open(log, "w") as out:
        # SIGINT at its default in Snakemake's process: a test run in the background of a non-interactive shell (the
        # first process of tests/run_suite.sh, `nohup make test &`) ignores it, and a child inherits that, where Python
        # then raises no KeyboardInterrupt for Snakemake's own handling to see
        p = subprocess.Popen([SNAKEMAKE, "--cores", "2", "-d", str(wd), "-s", str(wd / "Snakefile")], stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True, cwd=wd,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not ((wd / "started-f").exists() and (wd / "started-s").exists()):
        assert p.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    t0 = time.monotonic()
    p.send_signal(sig)
    (wd / "signalled").touch()  # the finishing job ends after it (JOBS)
    rc = p.wait(timeout=120)
    took = time.monotonic() - t0
    deadline = time.monotonic() + 10
    while session_processes(p.pid) and time.monotonic() < deadline:  # a job's last exit, reaped by now
        time.sleep(0.1)
    assert session_processes(p.pid) == [], "a process of the run is left"
    return rc, took, log.read_text()


def planned(wd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([SNAKEMAKE, "-n", "--cores", "2", "-d", str(wd), "-s", str(wd / "Snakefile")],
                          capture_output=True, text=True, timeout=120, cwd=wd)


@pytest.mark.slow  # Snakemake started twice, ~10 s on 2 cores
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_snakemake_stops_the_jobs_and_keeps_the_finished_one(tmp_path, sig):
    """With stop.forward_signals: the job that stops on SIGTERM is told (it keeps its state and fails at once, its
    output removed), the one that finishes anyway is kept (no incomplete mark): the next plan is the stopped job and
    what follows it, not the finished one; no lock and no process is left."""
    rc, took, out = stopped_run(tmp_path, sig, forward=True)
    assert rc == 1 and "SIGTERM sent to the running jobs" in out, out
    assert (tmp_path / "state").exists() and not (tmp_path / "stops.txt").exists()
    assert (tmp_path / "finishes.txt").read_text() == "done"
    assert not list(tmp_path.glob(".snakemake/incomplete/*")) and not list(tmp_path.glob(".snakemake/locks/*"))
    assert took < 10  # the finishing job's second after the signal, not the stopping one's 12 s
    p = planned(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rule stops:" in p.stdout and "rule later:" in p.stdout and "rule finishes:" not in p.stdout


@pytest.mark.slow  # ~20 s: the stopping job is told nothing, and runs its 12 s
def test_snakemakes_own_sigint_marks_a_job_finished_after_it_incomplete(tmp_path):
    """Why (docs/staleness.md): without it, Snakemake 9.27's SIGINT lets the jobs run to their end (the stopping one
    too: it is told nothing) and marks the finished one's output incomplete, so the next run would make it again."""
    rc, took, out = stopped_run(tmp_path, signal.SIGINT, forward=False)
    assert rc == 1 and "Terminating processes on user request" in out, out
    assert not (tmp_path / "state").exists()  # never told
    assert (tmp_path / "finishes.txt").read_text() == "done"
    assert list(tmp_path.glob(".snakemake/incomplete/*"))
    p = planned(tmp_path)
    assert p.returncode != 0 and "IncompleteFilesException" in p.stdout + p.stderr


def _sleeping_children(pid: int) -> list[int]:
    """The children of ``pid`` that run ``sleep`` (forked and exec'd: a child not yet exec'd has its parent's name)."""
    return [int(e.name) for e in os.scandir("/proc")
            if e.name.isdigit() and (stop._stat(int(e.name)) or ("", 0))[:2] == ("sleep", pid)]


def test_job_processes_are_each_jobs_own_process_without_the_shells():
    """A shell's job is one (the shell is not: it would end at once and leave the job), and a job's own process is,
    without what it started (a training's torchrun: the job tells it, train.ddp.launch); a process that leads a group
    of its own (a job host, an engine) is not, nor what runs under it."""
    shell = subprocess.Popen(["bash", "-c", "sleep 30; true"])
    job = subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '30'])"])
    own_group = subprocess.Popen(["bash", "-c", "sleep 30; true"], process_group=0)
    kids, started = [], []
    try:
        deadline = time.monotonic() + 10
        while not ((kids := _sleeping_children(shell.pid)) and (started := _sleeping_children(job.pid))
                   and _sleeping_children(own_group.pid)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        procs = stop.job_processes()
        assert kids[0] in procs and shell.pid not in procs
        assert job.pid in procs and started[0] not in procs
        assert own_group.pid not in procs and not set(_sleeping_children(own_group.pid)) & set(procs)
    finally:
        for pid in kids + started:
            os.kill(pid, signal.SIGKILL)  # the shell's sleep, the job's
        shell.kill()
        job.kill()
        os.killpg(own_group.pid, signal.SIGKILL)
        for p in (shell, job, own_group):
            p.wait()


class StandInHost:
    """A host's socket and files for ``key`` in ``host.hosts_dir()`` (``lease`` finds it) that takes one job, tells
    this process SIGTERM once the job's request came, then sees the job's side half-closed and answers as a host
    whose entry ``finished`` (the shard renamed: ``{"ok": ...}``) or not (the temporary dropped: no answer)."""

    def __init__(self, key: str, finished: bool):
        d = host.hosts_dir()
        d.mkdir(parents=True, exist_ok=True)
        base = d / f"{key}-standin"
        self.base, self.finished, self.saw_half_close = base, finished, False
        (d / f"{base.name}.lease").touch()
        (d / f"{base.name}.json").write_text(json.dumps({"pid": os.getpid(), "log": "standin.log"}))
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(f"{base}.sock")
        self.listener.listen(1)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        from eagle3build.workflow import gpu_slots

        conn, _ = self.listener.accept()
        with conn:
            _, fds = gpu_slots.recv_message(conn)
            for fd in fds:
                os.close(fd)
            os.kill(os.getpid(), signal.SIGTERM)  # the job's process is this one
            conn.settimeout(10)
            self.saw_half_close = conn.recv(1) == b""  # host._peer_open's view: the job is gone
            if self.finished:
                gpu_slots.send_message(conn, {"ok": {"samples": 4}})

    def close(self) -> None:
        self.thread.join(timeout=10)
        self.listener.close()
        for suffix in (".sock", ".lease", ".json"):
            Path(f"{self.base}{suffix}").unlink(missing_ok=True)


@pytest.mark.parametrize("finished", [True, False], ids=["finished", "dropped"])
def test_sigterm_to_a_hosted_job_asks_its_host_and_keeps_a_finished_shard(tmp_path, monkeypatch, finished):
    """SIGTERM while the job waits for its host half-closes the connection: a host that had renamed the shard answers
    and the job succeeds (Snakemake keeps the shard), one that dropped it answers nothing and the job fails with
    JobStopped. The SIGTERM handler before it is put back."""
    from eagle3build.capture import capture_hidden_states as cap

    lock_dir = tempfile.mkdtemp(prefix="e3s-", dir="/tmp")  # short: a Unix socket's path holds 107 bytes
    monkeypatch.setenv("EAGLE3BUILD_GPU_LOCK_DIR", lock_dir)
    me = (os.getpid(), host._proc_stat(os.getpid())[2])
    monkeypatch.setattr(host, "owner_process", lambda: me)
    s = cap.CaptureSettings(target_dir=tmp_path, tokens_path=tmp_path / "t.safetensors", out_path=tmp_path / "s",
                            start=0, count=4, aux_layer_ids=[1], target_fingerprint="fp", split="train",
                            compute_dtype="auto")
    got = []

    def ours(*a):  # where run_job took no SIGTERM itself: the test fails, and no more
        got.append(a)

    before = signal.signal(signal.SIGTERM, ours)
    standin = StandInHost(host.host_spec("capture_hidden_states", s, 2, 0, me)["key"], finished)
    try:
        if finished:
            assert host.run_job("capture_hidden_states", s, 2, 0) == {"samples": 4}
        else:
            with pytest.raises(host.JobStopped, match="SIGTERM: job host pid .* dropped this job's output"):
                host.run_job("capture_hidden_states", s, 2, 0)
    finally:
        standin.close()
        after = signal.signal(signal.SIGTERM, before)
        shutil.rmtree(lock_dir)
    assert standin.saw_half_close and not got and after is ours  # run_job's handler took it, then put ours back


def test_a_host_sees_a_half_closed_job_as_gone():
    """The host's side of it (host._peer_open, what capture's ``alive`` asks): a job that half-closed its connection
    is gone, while the host can still answer it."""
    job, served = socket.socketpair()
    with job, served:
        assert host._peer_open(served)
        job.shutdown(socket.SHUT_WR)
        assert not host._peer_open(served)
        served.sendall(b"ok")
        assert job.recv(2) == b"ok"


FINISHING = """
import os, signal, sys
from eagle3build.workflow.job import finish_or_end
signal.signal(signal.SIGTERM, finish_or_end(sys.argv[1:]))
os.kill(os.getpid(), signal.SIGTERM)
print("went on")
"""


def test_a_job_whose_outputs_are_in_place_ignores_sigterm(tmp_path):
    """job.finish_or_end, every job's SIGTERM handler: a job with each output in place (renamed there: it is about to
    exit 0) goes on, so that Snakemake keeps them; one with an output missing ends at once, as by default."""
    done, missing = tmp_path / "a", tmp_path / "b"
    done.write_text("x")
    p = subprocess.run([sys.executable, "-c", FINISHING, str(done)], capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout) == (0, "went on\n"), p.stderr
    p = subprocess.run([sys.executable, "-c", FINISHING, str(done), str(missing)], capture_output=True, text=True,
                       timeout=60)
    assert (p.returncode, p.stdout) == (-signal.SIGTERM, "")


MAIN = """
import logging, os, signal, sys, types
from eagle3build.workflow import job
out, when = sys.argv[1], sys.argv[2]


class Named(list):  # a Snakemake Namedlist's shape: a list with named items
    def __init__(self, items):
        super().__init__(v for _, v in items)
        self._items = items

    def items(self):
        return iter(self._items)


def entry(settings):
    if when == "written":  # as every writer: a temporary, renamed into place last
        open(out + ".tmp", "w").write("x")
        os.replace(out + ".tmp", out)
    os.kill(os.getpid(), signal.SIGTERM)  # a stop from outside as the job ends, or before it wrote its output
    return "returned"


job.entry_function = lambda rule: entry
job.setup = lambda smk: logging.getLogger("job")
smk = types.SimpleNamespace(rule="plot_benchmark", input=Named([("benchmark", "b.json")]), output=Named([("png", out)]),
                            wildcards=Named([]), params=Named([("settings", {}), ("version", 1)]),
                            resources=Named([]), threads=1, log=[])
print(job.main(smk), flush=True)
os.kill(os.getpid(), signal.SIGTERM)  # after main: ignored to the exit
print("exits", flush=True)
"""


def test_job_main_ends_at_sigterm_until_its_outputs_are_in_place(tmp_path):
    """job.main's SIGTERM handling (finish_or_end, then ignored once the entry returned): SIGTERM to a job whose entry
    has renamed its output into place does not end it (Snakemake keeps a job that exits 0; one ended by a signal is a
    failed one, its outputs removed); SIGTERM to one whose output is missing ends it at once, as by default."""
    out = tmp_path / "b.png"
    p = subprocess.run([sys.executable, "-c", MAIN, str(out), "written"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert (p.returncode, p.stdout) == (0, "returned\nexits\n"), p.stderr
    assert out.read_text() == "x"
    out.unlink()
    p = subprocess.run([sys.executable, "-c", MAIN, str(out), "missing"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert (p.returncode, p.stdout, out.exists()) == (-signal.SIGTERM, "", False), p.stderr
