"""Distributed data parallel helpers: rank queries, device per rank, DDP wrapping, torchrun launch.

A private module of the train subpackage (it imports no stage module): the stage that trains passes its own entry
point (``module`` for :func:`launch`, ``fn`` for :func:`main`).

One process per GPU under ``torchrun`` (``torch.distributed.run``), NCCL between GPUs and
gloo on CPU, as speculators' ``train/distributed.py`` sets up a process group for its
``Trainer``; the gradient all-reduce is torch's ``DistributedDataParallel``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

log = logging.getLogger(__name__)


def dist_info() -> tuple[bool, int, int]:
    """``(distributed, rank, world_size)`` of this process: ``(False, 0, 1)`` outside an
    initialised ``torch.distributed`` process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return True, dist.get_rank(), dist.get_world_size()
    return False, 0, 1


def resolve_device(device: str, distributed: bool) -> str:
    """The torch device this process computes on.

    ``auto`` is ``cuda`` when a GPU is visible, else ``cpu``. Under torchrun, ``cuda``
    becomes ``cuda:<LOCAL_RANK>`` (one GPU per process) and is made the current device.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and distributed:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    return device


def wrap(model: torch.nn.Module, device: str) -> torch.nn.Module:
    """``model`` under ``DistributedDataParallel`` (gradients all-reduced across ranks in
    ``backward``); the process group must be initialised."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if device.startswith("cuda") else None)


def launch(module: str, kwargs: dict, nproc: int) -> None:
    """Run ``python -m <module> KWARGS.json`` on ``nproc`` processes with torchrun (standalone,
    one node); ``module`` calls :func:`main` with its entry point, which gets ``**kwargs``.

    ``kwargs`` must be JSON-serialisable; it travels through a temporary file, removed afterwards.

    SIGTERM to this process while the ranks run (a stop from outside: eagle3build/workflow/stop.py tells each job's own
    process) is passed to torchrun, which passes it to the ranks (``torch.distributed.elastic``: its workers get the
    signal it got), and the ranks are waited for: each stops after the step in flight, rank 0 saving the state
    (``trainer.save_on_term``; a rank whose peer stopped a step earlier fails in the next all-reduce, and the last
    periodic state stands), and no rank outlives the job.

    Raises:
        RuntimeError: a rank failed (its traceback is in the log above), or SIGTERM stopped them (said so).
    """
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(kwargs, f)
    try:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", module, f.name]
        log.info("launching %s", " ".join(cmd))
        with subprocess.Popen(cmd) as proc, _term_passed_to(proc) as told:
            try:
                rc = proc.wait()
            except BaseException:  # as subprocess.run does (Ctrl-C, an error here)
                proc.kill()
                raise
    finally:
        os.unlink(f.name)
    if rc != 0 and told:
        raise RuntimeError(f"SIGTERM, passed to the ranks: distributed training stopped (exit {rc}); the ranks' output "
                           "above says where its state was saved, and the same job run again resumes from it")
    if rc != 0:
        raise RuntimeError(f"distributed training failed (exit {rc}); see the ranks' output above")


@contextlib.contextmanager
def _term_passed_to(proc: subprocess.Popen) -> Iterator[list[int]]:
    """While the block runs (on the main thread), SIGTERM to this process is sent on to ``proc``; yields the signals
    passed (empty: none). The handler before it is put back."""
    told: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield told
        return

    def on_term(signum: int, frame: object) -> None:
        told.append(signum)
        proc.send_signal(signal.SIGTERM)

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        yield told
    finally:
        signal.signal(signal.SIGTERM, before)


def run_rank(fn: Callable[..., object], kwargs: dict) -> None:
    """One torchrun rank: initialise the process group (NCCL when CUDA is visible and
    ``kwargs["device"]`` is not ``cpu``, else gloo), call ``fn(**kwargs)``, wait for every rank,
    and tear the group down (also on error)."""
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() and kwargs.get("device", "auto") != "cpu" else "gloo"
    dist.init_process_group(backend)
    try:
        fn(**kwargs)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(fn: Callable[..., object], module: str) -> None:
    """``__main__`` of a module that :func:`launch` starts: read ``sys.argv[1]`` (the kwargs
    JSON), log with the rank in each line, and :func:`run_rank` ``fn``.

    Raises:
        SystemExit: not exactly one argument.
    """
    if len(sys.argv) != 2:
        sys.exit(f"usage: torchrun ... -m {module} KWARGS.json")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s rank" + os.environ.get("RANK", "?")
                        + " %(name)s: %(message)s")
    run_rank(fn, json.loads(Path(sys.argv[1]).read_text()))
