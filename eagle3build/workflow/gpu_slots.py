"""Disjoint GPUs for concurrent jobs on one machine.

Snakemake's ``gpu`` resource only counts: with ``--resources gpu=8`` two 4-GPU jobs may
run at once, but both see all eight cards (Snakemake docs, "Resources": resources are counters). Each job
therefore takes its own GPUs here, before CUDA is initialised: one lock file per GPU,
held with ``flock`` for the life of the process. The kernel drops the locks when the
process ends, however it ends, so a crashed job never leaks its GPUs.

Taking several locks is serialised by one allocator lock, so two jobs never hold half
of what each needs while waiting for the other.

A process may hold GPUs beyond the job that took them: a capture host (eagle3build/capture/host.py) keeps the
target loaded between the shard jobs it serves. It names itself beside each GPU lock it holds
(``register_holder``: ``gpu-<id>.holder``, its socket's path), and a claimant that finds such a GPU taken asks it to
give the GPU up (``ask_holders``: a ``release`` message); a holder that serves no job at that moment exits at once,
so the GPU is taken by a job again within a poll. The messages are ``send_message``/``recv_message``'s: a 4-byte length
and a JSON body, with file descriptors beside it where the sender passes any (``socket.send_fds``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


def default_lock_dir() -> Path:
    """``$EAGLE3BUILD_GPU_LOCK_DIR`` or ``/tmp/eagle3build-gpu-locks`` (shared by every job of the machine)."""
    return Path(os.environ.get("EAGLE3BUILD_GPU_LOCK_DIR", "/tmp/eagle3build-gpu-locks"))


def visible_gpus(num_gpus: int | None = None) -> list[str]:
    """GPU ids this process may hand out: ``CUDA_VISIBLE_DEVICES`` when set (e.g. by SLURM), else
    ``range(num_gpus)``, else every GPU torch sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and env.strip():
        ids = [x.strip() for x in env.split(",") if x.strip()]
        return ids[:num_gpus] if num_gpus else ids
    if num_gpus is None:
        import torch

        num_gpus = torch.cuda.device_count()
    return [str(i) for i in range(num_gpus)]


@dataclass
class Allocation:
    """GPUs held by this process; ``cuda_visible_devices`` is the value to export."""

    gpus: list[str]
    _fds: list[int] = field(default_factory=list, repr=False)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.gpus)

    @property
    def fds(self) -> list[int]:
        """The lock files' descriptors: a child process given them (``pass_fds``) holds the GPUs after this one
        lets go of its own copies (``release``): a flock belongs to the open file, not to the process."""
        return list(self._fds)

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)  # closing the descriptor drops its flock
        self._fds.clear()

    def __enter__(self) -> Allocation:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(n: int, num_gpus: int | None = None, lock_dir: str | os.PathLike | None = None,
            timeout: float | None = None, poll: float = 0.5) -> Allocation:
    """Take ``n`` GPUs no other live process holds; wait while fewer are free (``try_acquire`` every ``poll``
    seconds, each try asking the idle holders of taken GPUs to give them up).

    Args:
        n: GPUs wanted.
        num_gpus: size of the pool (default: see ``visible_gpus``).
        lock_dir: where the lock files live (default ``default_lock_dir()``).
        timeout: seconds to wait before giving up (None: wait forever).
        poll: seconds between attempts (jittered).

    Raises:
        ValueError: ``n`` exceeds the pool (the job could never start).
        TimeoutError: ``timeout`` passed with fewer than ``n`` GPUs free.
    """
    pool = visible_gpus(num_gpus)
    d = Path(lock_dir or default_lock_dir())
    deadline = None if timeout is None else time.monotonic() + timeout
    waited = False
    while True:
        alloc = try_acquire(n, pool, d)
        if alloc is not None:
            return alloc
        if not waited:
            log.info("GPU slots: %d wanted, fewer free in %s; waiting", n, pool)
            waited = True
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{n} GPU(s) not free within {timeout} s (pool {pool}, locks in {d})")
        time.sleep(poll * (0.5 + random.random()))


def try_acquire(n: int, pool: list[str], lock_dir: str | os.PathLike | None = None,
                ask: bool = True) -> Allocation | None:
    """One try of ``acquire``: ``n`` GPUs of ``pool`` (GPU ids) no other live process holds, or None. Where fewer
    are free and ``ask``, the holders registered beside the taken ones (``register_holder``) are asked to give them up
    (``ask_holders``): a holder serving no job exits, and a later try gets its GPUs.

    Raises:
        ValueError: ``n`` exceeds the pool.
    """
    if n > len(pool):
        raise ValueError(f"job wants {n} GPU(s) but this machine's pool has {len(pool)}: {pool}")
    d = Path(lock_dir or default_lock_dir())
    d.mkdir(parents=True, exist_ok=True)
    taken: list[str] = []
    with _locked(d / "allocator.lock"):
        got: list[tuple[str, int]] = []
        for gpu in pool:
            fd = os.open(d / f"gpu-{gpu}.lock", os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                taken.append(gpu)
                continue
            got.append((gpu, fd))
            if len(got) == n:
                break
        if len(got) == n:
            alloc = Allocation([g for g, _ in got], [fd for _, fd in got])
            log.info("GPU slots: took %s of %s (pid %d)", alloc.gpus, pool, os.getpid())
            return alloc
        for _, fd in got:
            os.close(fd)
    if ask:
        ask_holders(taken, d)
    return None


def register_holder(gpus: list[str], address: str, lock_dir: str | os.PathLike | None = None) -> None:
    """Name ``address`` (the Unix socket path of a process that holds ``gpus`` between jobs) beside each GPU's lock,
    for ``ask_holders``. The holder must hold the GPUs' locks (a descriptor from ``Allocation.fds``)."""
    from ..atomic import write_text

    d = Path(lock_dir or default_lock_dir())
    for gpu in gpus:
        write_text(d / f"gpu-{gpu}.holder", address)


def unregister_holder(gpus: list[str], address: str, lock_dir: str | os.PathLike | None = None) -> None:
    """Remove ``register_holder``'s names of ``address`` (another holder's, written since, stays)."""
    d = Path(lock_dir or default_lock_dir())
    for gpu in gpus:
        f = d / f"gpu-{gpu}.holder"
        try:
            if f.read_text() == address:
                f.unlink()
        except OSError:
            pass


def ask_holders(gpus: list[str], lock_dir: str | os.PathLike | None = None, timeout: float = 1.0) -> list[str]:
    """Ask the registered holder of each of ``gpus`` (``register_holder``) to give its GPUs up; return the GPUs whose
    holder said it does (it exits, and the kernel drops its locks). A holder serving a job says no, or does not answer
    within ``timeout`` seconds (it answers between jobs); a gone holder's name is skipped."""
    d = Path(lock_dir or default_lock_dir())
    released, asked = [], set()
    for gpu in gpus:
        try:
            address = (d / f"gpu-{gpu}.holder").read_text()
        except OSError:
            continue
        if address in asked:
            continue
        asked.add(address)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(address)
                send_message(s, {"op": "release"})
                reply, _ = recv_message(s)
        except (OSError, ValueError, EOFError):
            continue
        if reply.get("released"):
            log.info("GPU slots: the idle holder %s gave up GPU %s", address, gpu)
            released.append(gpu)
    return released


def send_message(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    """Send ``message`` (JSON) on ``sock``: its length (4 bytes, little-endian), then the body; ``fds``: file
    descriptors passed beside the length (``socket.send_fds``, SCM_RIGHTS), for ``recv_message``."""
    body = json.dumps(message).encode()
    head = struct.pack("<I", len(body))
    if fds:
        socket.send_fds(sock, [head], list(fds))
    else:
        sock.sendall(head)
    sock.sendall(body)


def recv_message(sock: socket.socket) -> tuple[dict, list[int]]:
    """One ``send_message`` message from ``sock``: ``(message, file descriptors passed with it)``.

    Raises:
        EOFError: the peer closed the connection before a whole message.
        ValueError: the body is not JSON.
    """
    head, fds, _, _ = socket.recv_fds(sock, 4, 4)
    while len(head) < 4:
        more = sock.recv(4 - len(head))
        if not more:
            raise EOFError("connection closed")
        head += more
    (n,) = struct.unpack("<I", head)
    body = b""
    while len(body) < n:
        more = sock.recv(n - len(body))
        if not more:
            raise EOFError("connection closed")
        body += more
    return json.loads(body), list(fds)


class _locked:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        os.close(self.fd)


def claim_for_job(n: int, num_gpus: int | None = None) -> Allocation | None:
    """For a job about to use ``n`` GPUs: take them and export ``CUDA_VISIBLE_DEVICES``.

    Call before CUDA is initialised. The GPUs stay held until the process exits.
    Returns None when ``n`` is 0 (a CPU job).
    """
    if n <= 0:
        return None
    alloc = acquire(n, num_gpus)
    os.environ["CUDA_VISIBLE_DEVICES"] = alloc.cuda_visible_devices
    return alloc
