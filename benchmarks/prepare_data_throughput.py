"""Benchmark: prepare_data over the whole bundled ShareGPT file (tokenize + mask + split), conversations/s.

Goal (issue 3): all 17,671 conversations in under 2 minutes on 2 cores.

    .venv/bin/python benchmarks/prepare_data_throughput.py [TARGET_DIR] [--max-seq-len 2048] [--max-samples N]

TARGET_DIR defaults to the materialised bundled target (resources/targets/smollm2-135m-instruct;
built into a temporary directory if absent). Prints the data report's figures and the rate.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from eagle3build.data.prepare_data import PrepareSettings, prepare  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target", nargs="?", default="resources/targets/smollm2-135m-instruct")
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--max-samples", type=int, default=None, help="conversations kept (tests: a few; default all)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(args.target)
        if not (target / "config.json").exists():
            from eagle3build.compat.materialize_target import materialize

            target = materialize("smollm2-135m-instruct", Path(tmp) / "target")
        out = [Path(tmp) / n for n in ("train.safetensors", "eval.safetensors", "prompts.jsonl", "report.json")]
        t0 = time.perf_counter()
        # the data settings at their declared defaults (config.yaml's); the conversations' throughput only: no
        # benchmark prompt checked, an empty eval split allowed (a few --max-samples)
        rep = prepare(PrepareSettings(sources=[{"path": "bundled:sharegpt", "max_samples": args.max_samples}],
                                      target_dir=target, out_train=out[0], out_eval=out[1], out_prompts=out[2],
                                      out_report=out[3], max_seq_len=args.max_seq_len, require_eval=False,
                                      benchmark_sets=[]))
        dt = time.perf_counter() - t0
    print(json.dumps({k: rep[k] for k in ("records_read", "kept", "train_samples", "eval_samples", "skipped",
                                          "skipped_total", "fixed", "truncated_to_max_seq_len", "tokens",
                                          "supervised_fraction", "hidden_state_bytes")}, indent=1))
    print(f"bytes lost at the cut: {rep['sources'][0]['bytes_lost']} at offset {rep['sources'][0]['truncated_at_byte']}")
    print(f"seconds: {dt:.1f}  conversations/s (records read): {rep['records_read'] / dt:.1f}  "
          f"kept conversations/s: {rep['kept'] / dt:.1f}  cores: {os.cpu_count()}")


if __name__ == "__main__":
    main()
