"""Benchmark: the compat report for the Kimi-K2.5-shaped config (1.03T parameters, meta device), seconds.

Goal (issue 4): under 30 s on 2 CPU cores, imports and every probe included.

    .venv/bin/python benchmarks/compat_report_kimi.py [--target DIR] [--backend auto|hooks|vllm]

Prints the wall time of the whole process so far (Python start to report written),
each probe's seconds, and the compat.md.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from eagle3build.compat import compat_report  # noqa: E402

KIMI = Path(__file__).resolve().parents[1] / "examples/targets/kimi-k2.5-shape"


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default=str(KIMI), help="another target directory (tests: a tiny one)")
    ap.add_argument("--backend", default="auto", help="capture.backend: auto runs the vLLM probe for an MoE target")
    args = ap.parse_args()
    t_import = time.perf_counter() - T0
    with tempfile.TemporaryDirectory() as tmp:
        t1 = time.perf_counter()
        # 100,000 planned tokens (one a sample) on 8 cards of 96 GB
        r = compat_report.build_report(compat_report.CompatSettings(
            target_dir=args.target, results_dir=tmp, backend=args.backend, num_train_samples=100_000,
            num_eval_samples=0, max_seq_len=1, gpu_memory_gb=96, gpus_per_node=8, capture_gpus=8, serve_gpus=8))
        compat_report.write(r, f"{tmp}/compat.json", f"{tmp}/compat.md")
        t_report = time.perf_counter() - t1
        md = Path(f"{tmp}/compat.md").read_text()
    print(md)
    print("probe seconds:", {k: v["seconds"] for k, v in r["probes"].items()})
    print(f"import eagle3build: {t_import:.1f} s; report: {t_report:.1f} s; total: {time.perf_counter() - T0:.1f} s "
          f"(goal < 30 s) on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
