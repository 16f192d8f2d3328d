"""Atomic writes: every artifact is written to a temporary sibling, then renamed.

A job killed at any moment leaves either the previous file or no file, never a
half-written one that Snakemake or the next stage would accept. ``os.replace`` is
atomic on POSIX when source and destination are on the same filesystem, which a
sibling path guarantees. The temporary's bytes are ``fsync``ed before the rename and
the directory after it, so a power loss also leaves the old file or the new one whole
(``rename(2)`` alone orders nothing on disk).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _tmp_sibling(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def clear_stale_temporaries(path: str | os.PathLike) -> None:
    """Remove ``.NAME.tmp-PID`` siblings of ``path`` that a killed writer left behind.

    Snakemake runs one job per output at a time (it locks the working directory), so a
    temporary of ``path`` that exists before this writer starts belongs to a dead one.
    """
    path = Path(path)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):
        _remove(stale)


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file or a directory (a directory: its entries, e.g. a rename done in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    """fsync a file, or every file and directory under a directory."""
    if path.is_dir():
        for sub in sorted(path.rglob("*")):
            if not sub.is_symlink():
                fsync_path(sub)
    fsync_path(path)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, fsync: bool = True) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` on success.

    Works for files and directories. On an exception the temporary is removed and
    ``path`` is left untouched. With ``fsync`` the temporary (every file of a directory)
    reaches the disk before the rename, and the parent directory after it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clear_stale_temporaries(path)
    tmp = _tmp_sibling(path)
    try:
        yield tmp
        if fsync and tmp.exists():
            _fsync_tree(tmp)
        if path.is_dir() and tmp.is_dir():
            # os.replace cannot overwrite a non-empty directory.
            shutil.rmtree(path)
        os.replace(tmp, path)
        if fsync:
            fsync_path(path.parent)
    finally:
        _remove(tmp)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists() or p.is_symlink():
        p.unlink()


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
