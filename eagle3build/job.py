"""Set-up shared by the workflow's scripts: one log file per job, offline mode, thread count.

``setup(snakemake)`` points Python logging *and* the process's stdout/stderr file
descriptors at the rule's log, so output of C extensions and of child processes (vLLM's
engine core) lands there too. Takes the ``snakemake`` object duck-typed; nothing here
imports Snakemake.
"""

from __future__ import annotations

import logging
import os
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
_GPU_ALLOCATION = None  # this job's GPU slots, held for the life of the process


def log_to_file(path: str | os.PathLike) -> logging.Logger:
    """Send logging, stdout and stderr (fd 1 and 2) to ``path`` (appending); return the root logger."""
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    logging.basicConfig(level=logging.INFO, format=FORMAT, stream=sys.stderr, force=True)
    logging.captureWarnings(True)
    return logging.getLogger()


def setup(smk) -> logging.Logger:
    """Log to ``smk.log[0]``; set HF offline mode when setting ``target.offline`` (``smk.params.settings``,
    the job's ``contract.StageSettings``) is true; use ``smk.threads`` torch threads; for a job with
    ``resources.gpu > 0``, take that many GPUs no concurrent job holds and export them as
    ``CUDA_VISIBLE_DEVICES`` (``gpu_slots``), held until the process exits; log the installed versions of
    the packages that shape the stage's output (its contract's ``packages``), as the job's environment
    holds them."""
    log = log_to_file(smk.log[0])
    from . import gpu_slots

    n_gpu = int(getattr(smk.resources, "gpu", 0) or 0)
    global _GPU_ALLOCATION
    _GPU_ALLOCATION = gpu_slots.claim_for_job(n_gpu)
    if _GPU_ALLOCATION is not None:
        log.info("CUDA_VISIBLE_DEVICES=%s", _GPU_ALLOCATION.cuda_visible_devices)
    offline = smk.params.settings["target.offline"]
    if offline:
        for var in OFFLINE_VARS:
            os.environ[var] = "1"  # inherited by child processes (the vLLM engine) too
    from .contract import CONTRACTS
    from .staleness import package_versions

    contract = CONTRACTS.get(getattr(smk, "rule", None))
    if contract is not None and contract.packages:  # what this job's environment holds (docs/staleness.md)
        log.info("packages that shape this stage's output: %s", package_versions(contract.packages))
    import torch

    torch.set_num_threads(max(1, int(smk.threads)))
    log.info("job %s: %d thread(s), offline=%s", getattr(smk, "rule", "?"), smk.threads, offline)
    return log
