"""Job hosts: a process per Snakemake run, stage settings and GPU set that loads what a stage's jobs share once (a
capture host: the target) and runs the jobs that come to it, one after another (``contract.HOSTED``; issue 70: each
capture job loaded the target again, most of a run's capture time for a small target).

Each job stays one Snakemake job, with its own params, log, benchmark and staleness: ``snakemake -n`` plans one
capture job per missing or stale shard, as before. The adapter (``job.main``) makes the job's settings object, then
``run_job`` leases an idle host of the job's key (``lease``) or starts one on the GPUs it takes (``start``), sends it
the settings and its stderr (the job's log, passed as a file descriptor: the host writes the job's lines there) and
waits for the answer; the host calls the stage's entry with what it loaded (``Hosted.load``) and answers with the
entry's result or error. The job's resources (``gpu``, ``threads``, ``mem_mb``) are the host's use while it serves
the job. Its outputs are written as every writer here writes them: a temporary name, then a rename.

Why not Snakemake's own features (9.27.1, read in its source and tried on a two-rule Snakefile):

- a service job (``service()`` output) runs beside its consumers in one group, but its output always counts as
  missing, so a planned service plans every consumer again ("Input files updated by another job"): one stale shard
  would recapture every up-to-date shard of its group. A ``script:`` service is never stopped either (its process is
  not in ``snakemake.shell``'s table, which the group's ``terminate`` reads): the run hangs when its consumers end.
  A group's resources are the sum of all its jobs, started at once; and a new input changes the recorded input set
  of every shard a build made before (Snakemake's ``input`` trigger), planning them all again;
- ``group:`` jobs are ignored under local execution (``Rule.group``), and grouped jobs are processes of their own;
- one job writing several shards is planned whole when any of them is stale, and cannot tell which are (an
  ``update()`` output is kept, but is then the job's to judge).

A host's key (``host_spec``) is everything its loaded state depends on: the stage's ``Hosted.spec`` of the job's
settings (capture: the target folder and fingerprint, backend, compute dtype, device, the vllm engine's layout and
context), the job's threads and GPU count, this checkout's code and Python, and the job's Snakemake process
(``owner_process``): hosts are never shared between runs. It lives in ``hosts_dir()`` (beside the GPU locks, this
user's alone: a Unix socket ``<key>-<token>.sock``, a lease file ``.lease``, its spec ``.spec`` and ``.json``, its pid
and log); a job
leases it with a non-blocking ``flock`` on the lease file, so one host serves one job at a time, and several jobs at
once (several GPUs) start several hosts. Its own log, ``host-<token>.log``, lies beside the log of the job that
started it.

A host ends (removing its files; its process group, a vLLM engine's processes included, with it) when idle and:

- its Snakemake process is gone (the run ended, or was killed: then the job it was serving is gone too);
- ``linger_s()`` seconds passed since its last job (``EAGLE3BUILD_JOB_HOST_LINGER_S``, default 60: the next shard
  job starts well within that; a run with longer work between its shards pays a load again);
- a job that wants its GPUs asks (``gpu_slots.ask_holders``: training starts the moment capture is done);
- a job failed in it (the next job starts a fresh one: a CUDA error can leave a process unusable).

A job killed while it is served is seen by the entry (``alive``: the connection closed) between batches and before
its rename: its temporary is dropped, and the host serves the next. A job told to stop (SIGTERM: a stop from outside,
workflow/stop.py) half-closes its connection, which the host sees the same way; it keeps waiting for the answer, so a
shard renamed into place by then is answered and kept, not captured again. ``EAGLE3BUILD_JOB_HOST=0`` runs each job in its
own process instead (the route before issue 70), as does a machine whose ``/proc`` cannot name the Snakemake process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib
import json
import logging
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import gpu_slots
from .joblog import FORMAT, log_to_fd

log = logging.getLogger("eagle3build.workflow.host")  # also where run as __main__

ENV_SWITCH = "EAGLE3BUILD_JOB_HOST"  # "0": each job runs in its own process
ENV_LINGER = "EAGLE3BUILD_JOB_HOST_LINGER_S"
LINGER_S = 60.0
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "fish"})
POLL_S = 0.2
_SOCKET_NAME = "/0123456789abcdef-01234567.sock"  # a socket's name in hosts_dir()


def hosts_dir() -> Path:
    """Where this user's hosts are found: ``job-hosts-<uid>/`` in the GPU lock folder (``gpu_slots.default_lock_dir``),
    of this machine (Unix sockets); made readable by this user alone (a host's spec holds the job's environment, and
    its socket runs what it is sent)."""
    return gpu_slots.default_lock_dir() / f"job-hosts-{os.getuid()}"


def owner_process() -> tuple[int, int] | None:
    """The Snakemake process this job runs under: the nearest ancestor that is not a shell (Snakemake runs a script
    job through ``sh -c``), as ``(pid, start time in clock ticks)``, so a reused pid is told apart. None where
    ``/proc`` cannot tell (not Linux)."""
    pid = os.getppid()
    for _ in range(16):
        st = _proc_stat(pid)
        if st is None:
            return None
        if st[0] not in SHELLS:
            return pid, st[2]
        pid = st[1]
    return None


def routed(stage: str) -> bool:
    """Whether a job of ``stage`` runs in a host: a ``contract.HOSTED`` stage, not ``EAGLE3BUILD_JOB_HOST=0``,
    ``hosts_dir()`` short enough for a Unix socket's path (108 bytes on Linux), and its Snakemake process known."""
    from .contract import HOSTED

    return (stage in HOSTED and os.environ.get(ENV_SWITCH, "1") != "0"
            and len(str(hosts_dir()) + _SOCKET_NAME) < 108 and owner_process() is not None)


def linger_s() -> float:
    """Seconds an idle host waits for its next job (``EAGLE3BUILD_JOB_HOST_LINGER_S``, default ``LINGER_S``)."""
    return float(os.environ.get(ENV_LINGER, LINGER_S))


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """``(command name, parent pid, start time in clock ticks)`` of process ``pid`` (Linux ``/proc/<pid>/stat``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat[stat.rindex(")") + 2:].split()
    return stat[stat.index("(") + 1:stat.rindex(")")], int(rest[1]), int(rest[19])


def process_alive(owner: tuple[int, int]) -> bool:
    """Whether process ``owner`` (``owner_process``'s pair) still runs (a zombie counts as gone)."""
    st = _proc_stat(owner[0])
    if st is None or st[2] != owner[1]:
        return False
    try:
        return Path(f"/proc/{owner[0]}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _attribute(name: str) -> Any:
    module, attribute = name.split(":")
    return getattr(importlib.import_module(module), attribute)


def _hooks(stage: str) -> tuple[Any, Any, Any, Any]:
    """The stage's entry, settings class and ``Hosted`` functions (``spec``, ``load``), imported."""
    from .contract import CONTRACTS, HOSTED

    c = CONTRACTS[stage]
    module = c.entry.split(":")[0]
    return (_attribute(c.entry), _attribute(c.settings), _attribute(f"{module}:{HOSTED[stage].spec}"),
            _attribute(f"{module}:{HOSTED[stage].load}"))


def _code_stamp() -> str:
    """This checkout's package code: each module's path, size and modification time (a file edited during a run
    starts fresh hosts)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(str(root).encode())
    for f in sorted(root.rglob("*.py")):
        st = f.stat()
        h.update(f"{f.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def host_spec(stage: str, settings: Any, threads: int, gpus: int, owner: tuple[int, int]) -> dict:
    """A host for the job of ``stage`` with ``settings`` (its settings object), ``threads`` and ``gpus``: the stage's
    ``Hosted.spec`` of the settings (``state``; its ``env`` apart) and the rest of the key (module docstring); the
    key, ``spec["key"]``, is 16 hex characters of their SHA-256."""
    state = dict(_hooks(stage)[2](settings))
    env = state.pop("env", None)
    spec = {"stage": stage, "state": state, "threads": int(threads), "gpus": int(gpus), "owner": list(owner),
            "code": _code_stamp(), "python": sys.executable, "pool": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "offline": os.environ.get("HF_HUB_OFFLINE")}
    spec["key"] = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    spec["env"] = env
    return spec


def run_job(stage: str, settings: Any, threads: int, gpus: int) -> Any:
    """Run the job of ``stage`` with ``settings`` (its settings object) in a host of its Snakemake run (``lease`` an
    idle one, else ``start`` one on ``gpus`` GPUs taken for it); return the entry's result (a mapping gets ``host``:
    the host's pid, its load seconds and the jobs it has served).

    SIGTERM while the host works (a stop from outside: workflow/stop.py) asks it to drop the job's output
    (``_term_drops_the_job``): the job then fails with ``JobStopped``, or, where the output was renamed into place
    already, gets its answer and succeeds (its Snakemake keeps the output).

    Raises:
        the entry's error (as its type where that is a built-in exception, else a RuntimeError naming it);
        RuntimeError where the host ends before it answers (its log named);
        JobStopped: SIGTERM came, and the host dropped the output.
    """
    spec = host_spec(stage, settings, threads, gpus, owner_process())
    conn, lease_fd, info = _lease_or_start(spec)
    try:
        log.info("job host pid %s takes this job (%s; its log: %s)", info["pid"],
                 "started by this job" if info["started"] else "already loaded", info["log"])
        fields = {k: (os.fspath(v) if isinstance(v, os.PathLike) else v)
                  for k, v in dataclasses.asdict(settings).items()}
        with _term_drops_the_job(conn) as stopped:
            try:
                gpu_slots.send_message(conn, {"op": "run", "settings": fields}, fds=[2])
                reply, _ = gpu_slots.recv_message(conn)
            except (EOFError, OSError) as e:
                if stopped:
                    raise JobStopped(f"SIGTERM: job host pid {info['pid']} dropped this job's output before its "
                                     "rename; the next run makes it") from None
                raise RuntimeError(f"job host pid {info['pid']} ended before it answered ({e}); its log: "
                                   f"{info['log']}") from None
    finally:
        conn.close()
        os.close(lease_fd)
    if "error" in reply:
        import builtins

        kind = getattr(builtins, reply["error"], None)
        if isinstance(kind, type) and issubclass(kind, Exception):
            raise kind(reply["message"])
        raise RuntimeError(f"{reply['error']}: {reply['message']}")
    return reply["ok"]


class JobStopped(RuntimeError):
    """A hosted job told to stop (SIGTERM) before its output was renamed into place: the host dropped its temporary."""


@contextlib.contextmanager
def _term_drops_the_job(conn: socket.socket) -> Iterator[list[int]]:
    """While the job waits for its host's answer on ``conn``, SIGTERM half-closes the connection (the job's side):
    the entry sees the job gone (``alive``, ``_peer_open``) between batches and before its rename, drops the
    temporary and answers nothing; an entry done by then answers as always, on the side still open. Yields the
    signals seen (empty: none). A second SIGTERM ends the job at once. Only on the main thread (signal handlers
    live there); the previous handler is put back."""
    seen: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def on_term(signum: int, frame: Any) -> None:
        if seen:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        seen.append(signum)
        try:
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the host closed it first

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGTERM, before)


def _lease_or_start(spec: dict) -> tuple[socket.socket, int, dict]:
    """An idle host of ``spec["key"]`` leased, or one started on GPUs taken for it (where ``spec["gpus"]``):
    ``(connection, lease descriptor, {"pid", "log", "started"})``. Waits while the GPUs are held by busy processes."""
    d = hosts_dir()
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    pool = gpu_slots.visible_gpus() if spec["gpus"] else []
    waited = False
    while True:
        got = lease(d, spec["key"])
        if got is not None:
            return got
        alloc = gpu_slots.try_acquire(spec["gpus"], pool) if spec["gpus"] else None
        if alloc is not None or not spec["gpus"]:
            return start(d, spec, alloc)
        if not waited:
            log.info("job host: %d GPU(s) wanted, fewer free in %s; waiting", spec["gpus"], pool)
            waited = True
        time.sleep(0.5)


def lease(d: Path, key: str) -> tuple[socket.socket, int, dict] | None:
    """An idle host of ``key`` in ``d``: its lease taken (``flock``, non-blocking) and a connection to it, with its
    ``{"pid", "log", "started": False}``; None where every host of ``key`` is busy or there is none. A host found
    dead (its socket refuses) has its files removed."""
    for lease_path in sorted(d.glob(f"{key}-*.lease")):
        try:
            fd = os.open(lease_path, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        base = str(lease_path)[: -len(".lease")]
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(base + ".sock")
            info = json.loads(Path(base + ".json").read_text())
        except (OSError, ValueError):
            conn.close()
            for suffix in (".sock", ".lease", ".json", ".spec"):  # a host killed without its own clean-up
                Path(base + suffix).unlink(missing_ok=True)
            os.close(fd)
            continue
        return conn, fd, {"pid": info["pid"], "log": info["log"], "started": False}
    return None


def start(d: Path, spec: dict, alloc: gpu_slots.Allocation | None) -> tuple[socket.socket, int, dict]:
    """Start a host for ``spec`` on ``alloc``'s GPUs (it holds their locks from then on), its lease taken by this
    job first; wait until it has loaded and listens: ``(connection, lease descriptor, {"pid", "log", "started"})``.

    Raises:
        RuntimeError: the host exited before it listened (its exit status, its log's last line and path).
    """
    token = secrets.token_hex(4)
    base = d / f"{spec['key']}-{token}"
    lease_fd = os.open(f"{base}.lease", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lease_fd, fcntl.LOCK_EX)
    log_path = _host_log_path(token)
    full = {**spec, "socket": f"{base}.sock", "lease": f"{base}.lease", "info": f"{base}.json", "log": log_path,
            "gpus_held": alloc.gpus if alloc else [], "linger_s": linger_s()}
    fd = os.open(f"{base}.spec", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(full, f)
    env = dict(spec["env"] or os.environ)
    pkg_root = str(Path(__file__).resolve().parents[2])  # where the package is not installed (a checkout)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([pkg_root] if pkg_root not in paths else []))
    env["PYTHONUNBUFFERED"] = "1"
    if alloc is not None:
        env["CUDA_VISIBLE_DEVICES"] = alloc.cuda_visible_devices
    with open(log_path, "a") as out:
        # process_group=0: the host leads a group of its own, which a vLLM engine's processes join (it kills the
        # group when it ends); Ctrl-C and a kill of the run's group reach the jobs, and the host sees them go.
        proc = subprocess.Popen([sys.executable, "-m", "eagle3build.workflow.host", f"{base}.spec"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                pass_fds=alloc.fds if alloc else (), process_group=0)
    if alloc is not None:
        alloc.release()  # the host's copies of the lock descriptors hold the GPUs now
    while proc.poll() is None:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(f"{base}.sock")
            return conn, lease_fd, {"pid": proc.pid, "log": log_path, "started": True}
        except OSError:
            conn.close()
            time.sleep(POLL_S)
    os.close(lease_fd)
    for suffix in (".sock", ".lease", ".json", ".spec"):
        Path(f"{base}{suffix}").unlink(missing_ok=True)
    lines = Path(log_path).read_text(errors="replace").strip().splitlines() or ["(no output)"]
    raise RuntimeError(f"job host exited with status {proc.returncode} before it listened: {lines[-1]}; its log: "
                       f"{log_path}")


def _host_log_path(token: str) -> str:
    """``host-<token>.log`` beside this job's log (its stderr, ``job.setup``), else in ``hosts_dir()``."""
    try:
        job_log = Path(os.readlink("/proc/self/fd/2"))
    except OSError:
        job_log = None
    folder = job_log.parent if job_log is not None and job_log.is_file() else hosts_dir()
    return str(folder / f"host-{token}.log")


class Host:
    """A host's process (``python -m eagle3build.workflow.host SPEC``): the stage's state loaded once
    (``Hosted.load``), then one job after another on its socket, each the stage's entry with that state, until it
    ends (module docstring)."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.entry, self.settings_cls, _, self.load_fn = _hooks(spec["stage"])
        self.state: dict = {}
        self.served = 0
        self.load_s = 0.0
        self.lease_fd = os.open(spec["lease"], os.O_RDWR)
        self.host_fd = os.dup(2)  # this host's own log, between jobs
        self.ended = ""

    def load(self) -> None:
        sp = self.spec
        log.info("job host pid %d for %s: %s, %d thread(s), GPUs %s; loading once for this run's jobs", os.getpid(),
                 sp["stage"], json.dumps(sp["state"], sort_keys=True), sp["threads"], sp["gpus_held"] or "none")
        t0 = time.perf_counter()
        import torch

        torch.set_num_threads(max(1, sp["threads"]))
        self.state = self.load_fn(sp["state"])
        self.load_s = round(time.perf_counter() - t0, 2)
        log.info("loaded in %.1f s", self.load_s)

    def serve(self) -> None:
        from ..atomic import write_text

        sp = self.spec
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(sp["socket"])
        listener.listen(16)
        write_text(sp["info"], json.dumps({"pid": os.getpid(), "log": sp["log"], "load_s": self.load_s}))
        gpu_slots.register_holder(sp["gpus_held"], sp["socket"])
        owner = tuple(sp["owner"])
        idle_since = time.monotonic()
        while not self.ended:
            ready, _, _ = select.select([listener], [], [], 1.0)
            if ready:
                conn, _ = listener.accept()
                with conn:
                    self._handle(conn)
                idle_since = time.monotonic()
            elif not process_alive(owner) and self._idle():
                self.ended = "its Snakemake process is gone"
            elif time.monotonic() - idle_since > sp["linger_s"] and self._idle():
                self.ended = f"idle for {sp['linger_s']:g} s"
        log.info("job host pid %d ends (%s) after %d job(s)", os.getpid(), self.ended, self.served)

    def _idle(self) -> bool:
        """Whether no job holds the lease; where none does, this host takes it (no job can lease it any more)."""
        try:
            fcntl.flock(self.lease_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        try:
            req, fds = gpu_slots.recv_message(conn)
        except (OSError, ValueError, EOFError):
            return
        conn.settimeout(None)
        try:
            if req.get("op") == "release":
                if self._idle():
                    self.ended = "a job asked for its GPUs"
                gpu_slots.send_message(conn, {"released": bool(self.ended)})
            elif req.get("op") == "run" and fds:
                self._run(conn, req, fds[0])
        except OSError:
            pass  # the asker is gone; nothing to answer
        finally:
            for fd in fds:
                os.close(fd)

    def _run(self, conn: socket.socket, req: dict, job_log: int) -> None:
        s = self.settings_cls(**req["settings"])
        self.served += 1
        alive = lambda: _peer_open(conn)  # noqa: E731
        log.info("job %d: %s", self.served, _summary(req["settings"]))
        log_to_fd(job_log)
        log.info("job host pid %d: loaded once, in %.1f s; this run's job %d through it", os.getpid(), self.load_s,
                 self.served)
        t0 = time.perf_counter()
        reply = None
        try:
            out = self.entry(s, alive=alive, **self.state)
            if isinstance(out, dict):
                out = {**out, "host": {"pid": os.getpid(), "load_s": self.load_s, "jobs_served": self.served}}
            reply = {"ok": out}
        except Exception as e:  # noqa: BLE001 - every error goes back to the job, which fails with it
            if alive():
                log.exception("the traceback of the error below")
                reply = {"error": type(e).__name__, "message": str(e)}
                self.ended = f"job {self.served} failed ({type(e).__name__})"
            else:
                log.warning("the job is gone: %s", e)
        finally:
            log_to_fd(self.host_fd)
        log.info("job %d: %s in %.1f s", self.served, "done" if reply and "ok" in reply else "failed or gone",
                 time.perf_counter() - t0)
        if reply is not None:
            gpu_slots.send_message(conn, reply)

    def close(self) -> None:
        """Remove this host's files and its names beside the GPU locks."""
        sp = self.spec
        gpu_slots.unregister_holder(sp["gpus_held"], sp["socket"])
        for name in (sp["socket"], sp["info"], sp["lease"], sp["lease"][: -len(".lease")] + ".spec"):
            Path(name).unlink(missing_ok=True)


def _summary(fields: dict) -> str:
    """A job's request in the host's log: its output paths."""
    return ", ".join(f"{k} {v}" for k, v in fields.items() if k.startswith("out") and v) or "(no output field)"


def _peer_open(conn: socket.socket) -> bool:
    """Whether the job at the other end of ``conn`` is still there (it sends nothing after its request, so a readable
    connection is a closed one)."""
    ready, _, _ = select.select([conn], [], [], 0)
    if not ready:
        return True
    try:
        return conn.recv(1, socket.MSG_PEEK) != b""
    except OSError:
        return False


def main(argv: list[str]) -> int:
    """``python -m eagle3build.workflow.host SPEC``: load, serve, end (module docstring)."""
    if len(argv) != 2:
        sys.exit("usage: python -m eagle3build.workflow.host SPEC.json")
    logging.basicConfig(level=logging.INFO, format=FORMAT, stream=sys.stderr, force=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a job in progress drops its temporary
    host = Host(json.loads(Path(argv[1]).read_text()))
    try:
        host.load()
        host.serve()
    finally:
        host.close()
        sys.stdout.flush()
        sys.stderr.flush()
        if os.getpgid(0) == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)  # what it started (a vLLM engine's processes), and itself
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
