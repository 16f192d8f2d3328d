"""A job's log: Python logging, stdout and stderr (file descriptors 1 and 2) of a process sent to one file, the rule's
``log:`` (``job.setup``), so that output of C extensions and of child processes lands there too; a job host
(``host``) sends them to each job's log while it serves that job."""

from __future__ import annotations

import logging
import os
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_to_file(path: str | os.PathLike) -> logging.Logger:
    """Send logging, stdout and stderr (fd 1 and 2) to ``path`` (appending); return the root logger."""
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        return log_to_fd(fd)
    finally:
        os.close(fd)


def log_to_fd(fd: int) -> logging.Logger:
    """Send logging, stdout and stderr (fd 1 and 2) to the open file ``fd`` (a job's log, which a job host is handed
    with the job's request); return the root logger. ``fd`` stays open."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    logging.basicConfig(level=logging.INFO, format=FORMAT, stream=sys.stderr, force=True)
    logging.captureWarnings(True)
    return logging.getLogger()
