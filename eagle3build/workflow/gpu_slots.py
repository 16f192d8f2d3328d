"""Disjoint GPUs for concurrent jobs on one machine.

Snakemake's ``gpu`` resource only counts: with ``--resources gpu=8`` two 4-GPU jobs may
run at once, but both see all eight cards (Snakemake docs, "Resources": resources are counters). Each job
therefore takes its own GPUs here, before CUDA is initialised: one lock file per GPU,
held with ``flock`` for the life of the process. The kernel drops the locks when the
process ends, however it ends, so a crashed job never leaks its GPUs.

Taking several locks is serialised by one allocator lock, so two jobs never hold half
of what each needs while waiting for the other.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
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
    """Take ``n`` GPUs no other live process holds; wait while fewer are free.

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
    if n > len(pool):
        raise ValueError(f"job wants {n} GPU(s) but this machine's pool has {len(pool)}: {pool}")
    d = Path(lock_dir or default_lock_dir())
    d.mkdir(parents=True, exist_ok=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    waited = False
    while True:
        with _locked(d / "allocator.lock"):
            got: list[tuple[str, int]] = []
            for gpu in pool:
                fd = os.open(d / f"gpu-{gpu}.lock", os.O_RDWR | os.O_CREAT, 0o666)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
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
        if not waited:
            log.info("GPU slots: %d wanted, fewer free in %s; waiting", n, pool)
            waited = True
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{n} GPU(s) not free within {timeout} s (pool {pool}, locks in {d})")
        time.sleep(poll * (0.5 + random.random()))


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
