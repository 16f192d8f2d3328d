"""What the target fingerprint costs (issue 14: "state what it reads and how long it takes for a
600 GB target, measured on a large file here").

``eagle3build.target.fingerprint`` reads every byte of the target's weight files (SHA-256 of
each file, files hashed by a thread pool) once per compat report; planning never computes it.
This script writes a synthetic target of ``--gb`` GB of random weights in ``--files``
safetensors files, drops them from the page cache (``posix_fadvise(DONTNEED)`` after an
``fsync``: no root needed), and times the fingerprint
- cold (read from the disk) with the default workers and with one worker,
- warm (from the page cache: the hashing rate alone) with one worker and with the default,
then extrapolates to a 600 GB target at the cold rate (this disk) and at the warm rate (a
disk at least that fast).

    .venv/bin/python benchmarks/fingerprint_cost.py --gb 8 --files 8   # writes benchmarks/fingerprint_cost.txt
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import struct
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from eagle3build.target import fingerprint  # noqa: E402

CHUNK = 64 << 20


def write_target(path: Path, total_bytes: int, files: int) -> int:
    """config.json and ``files`` safetensors files of random U8 payloads (``total_bytes`` in all); returns bytes written."""
    (path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    written = 0
    for i in range(files):
        n = total_bytes // files
        hdr = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
        hdr += b" " * (-(8 + len(hdr)) % 8)
        with open(path / f"model-{i + 1:05d}-of-{files:05d}.safetensors", "wb") as f:
            f.write(struct.pack("<Q", len(hdr)) + hdr)
            left = n
            while left:
                k = min(CHUNK, left)
                f.write(os.urandom(k))
                left -= k
            f.flush()
            os.fsync(f.fileno())
        written += 8 + len(hdr) + n
    return written


def evict(path: Path) -> None:
    """Drop the files' pages from the page cache (clean pages only: written and fsynced)."""
    for f in path.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(path: Path, workers: int | None) -> tuple[float, str]:
    t = time.perf_counter()
    fp = fingerprint(path, workers=workers)
    return time.perf_counter() - t, fp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=8.0, help="synthetic weights to write (GB, 1e9 bytes)")
    ap.add_argument("--files", type=int, default=8, help="weight files (Kimi-K2.5 ships 64)")
    ap.add_argument("--dir", default=None, help="where to write them (default: the system temp dir)")
    ap.add_argument("--out", default=str(REPO / "benchmarks/fingerprint_cost.txt"))
    args = ap.parse_args()
    default_workers = min(8, os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp)
        nbytes = write_target(path, int(args.gb * 1e9), args.files)
        gb = nbytes / 1e9
        evict(path)
        cold_n, fp = timed(path, None)
        evict(path)
        cold_1, fp1 = timed(path, 1)
        warm_1, fp2 = timed(path, 1)
        warm_n, fp3 = timed(path, None)
        assert fp == fp1 == fp2 == fp3
    rate = {k: gb / v for k, v in (("cold_n", cold_n), ("cold_1", cold_1), ("warm_1", warm_1), ("warm_n", warm_n))}
    lines = [
        f"target fingerprint (SHA-256 of every weight byte), {gb:.2f} GB in {args.files} safetensors files, "
        f"{os.cpu_count()} CPU(s), Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}",
        f"cold (page cache dropped), {default_workers} workers: {cold_n:.2f} s = {rate['cold_n']:.2f} GB/s",
        f"cold, 1 worker: {cold_1:.2f} s = {rate['cold_1']:.2f} GB/s",
        f"warm (page cache), 1 worker: {warm_1:.2f} s = {rate['warm_1']:.2f} GB/s (the hashing rate of one core)",
        f"warm, {default_workers} workers: {warm_n:.2f} s = {rate['warm_n']:.2f} GB/s",
        f"600 GB target: {600 / max(rate['cold_n'], rate['cold_1']) / 60:.1f} min at this disk's cold rate; "
        f"{600 / rate['warm_1'] / 60:.1f} min hashing on one core, "
        f"{600 / rate['warm_1'] / 8 / 60:.1f} min on 8 (a disk of >= {8 * rate['warm_1']:.1f} GB/s)",
    ]
    print("\n".join(lines))
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
