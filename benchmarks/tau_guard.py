"""τ guard: serve a head on prompt sets and fail when its acceptance length falls below a recorded value.

vLLM's own CI guards its EAGLE-3 heads this way (a recorded mean acceptance length per model,
a run failing more than a tolerance below it). One engine, the target with the head as its
EAGLE-3 drafter (``measure.decode_greedy``, the benchmark's engine and counters), greedy,
``--k`` speculative tokens, the first ``--num-prompts`` prompts of each set
(``prompt_sets``: ``chat`` from ``--prompts``, ``humaneval``, ``custom`` from ``--custom``).
No baseline engine: the guard checks acceptance, not speed.

    python benchmarks/tau_guard.py --target TARGET_DIR --head results/R/head --prompts results/R/data/prompts.jsonl \\
        --sets chat humaneval --k 3 --reference REFERENCE.json [--tolerance 0.02] [--out RUN.json]

``REFERENCE.json``: ``{"k": 3, "num_prompts": 16, "max_tokens": 256, "tau": {"chat": 2.25, ...}}``
(``--record`` writes it from this run). Exit status 1 when a set's τ is more than
``--tolerance`` (relative) below its reference, 0 otherwise; the comparison is printed. A reference
recorded at another ``k``, ``num_prompts`` or ``max_tokens`` is refused (exit 2) before the engine
starts. ``--out`` also records the package versions and the hardware.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from eagle3build import prompt_sets  # noqa: E402
from eagle3build.config.provenance import BENCHMARK_PACKAGES, hardware, software_versions  # noqa: E402
from eagle3build.vllm import engine_process  # noqa: E402
from eagle3build.vllm.engine_args import engine_args  # noqa: E402
from eagle3build.vllm.measure import RUN_ENTRY  # noqa: E402


def check(measured: dict[str, float], reference: dict[str, float], tolerance: float) -> list[dict]:
    """Per set of ``reference``: measured τ, reference τ, the floor ``(1 - tolerance) x reference`` and
    whether it passed. A set of the reference that was not measured fails."""
    out = []
    for name, ref in reference.items():
        got = measured.get(name)
        floor = (1 - tolerance) * ref
        out.append({"set": name, "tau": got, "reference": ref, "floor": round(floor, 4),
                    "passed": got is not None and got >= floor})
    return out


def settings_mismatch(reference: dict, k: int, num_prompts: int, max_tokens: int) -> list[str]:
    """The serving settings a reference records (``k``, ``num_prompts``, ``max_tokens``; each optional)
    that differ from this run's, as ``"field: reference R, this run V"``; [] when all agree. A τ is
    comparable only at the same k (τ is bounded by k + 1) and over the same prompts and lengths."""
    run = {"k": k, "num_prompts": num_prompts, "max_tokens": max_tokens}
    return [f"{f}: reference {reference[f]}, this run {v}" for f, v in run.items()
            if f in reference and reference[f] != v]


def serve(a) -> dict:
    """One engine with the head; τ per set (1 + accepted / drafts, vLLM's counters)."""
    engine_process.require_vllm(needed_by="benchmarks/tau_guard.py")
    by_set = prompt_sets.load_sets(a.sets, a.num_prompts, prompt_sets.Sources(a.prompts, a.custom))
    prompts = [p for ps in by_set.values() for p in ps]
    eng = engine_args(a.target, gpus=a.gpus, served_name=Path(a.target).name, max_model_len=a.max_model_len,
                      seed=0, dtype=a.dtype, max_num_seqs=1, kv_cache_tokens=a.max_model_len + a.k,
                      draft_layers=1, graph_batch_tokens=1 + a.k)
    spec = {"engine": eng, "prompts": prompts, "max_tokens": a.max_tokens, "concurrency": 1,
            "sets": [{"name": n, "count": len(ps)} for n, ps in by_set.items()],
            "speculative_config": {"method": "eagle3", "model": os.path.abspath(a.head), "num_speculative_tokens": a.k}}
    with tempfile.TemporaryDirectory(prefix="tau-guard-") as tmp:
        r = engine_process.run_child(RUN_ENTRY, spec, tmp, "tau_guard")
    return {"k": a.k, "num_prompts": a.num_prompts, "max_tokens": a.max_tokens, "dtype": eng["dtype"],
            "tau": {n: r["sets"][n]["mean_acceptance_length"] for n in by_set},
            "acceptance_rate_per_position": {n: r["sets"][n]["acceptance_rate_per_position"] for n in by_set}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--prompts", default=None, help="prepare_data's prompts.jsonl (set chat)")
    ap.add_argument("--custom", default=None, help="a prompts JSONL (set custom)")
    ap.add_argument("--sets", nargs="+", default=["chat", "humaneval"])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--gpus", type=int, default=0)
    ap.add_argument("--reference", default=None, help="the recorded τ (JSON); with --record, where to write it")
    ap.add_argument("--record", action="store_true", help="write this run as the reference instead of checking")
    ap.add_argument("--tolerance", type=float, default=0.02, help="relative: fail below (1 - tolerance) x reference")
    ap.add_argument("--out", default=None, help="this run's figures and the comparison (JSON)")
    a = ap.parse_args(argv)
    if a.reference and not a.record:  # before the engine starts: a reference of other settings cannot be compared
        ref = json.loads(Path(a.reference).read_text())
        if "tau" not in ref:
            ap.error(f"{a.reference}: no field 'tau' (a reference is {{\"k\": 3, \"tau\": {{\"chat\": 2.25}}}})")
        if bad := settings_mismatch(ref, a.k, a.num_prompts, a.max_tokens):
            ap.error(f"{a.reference}: recorded at other settings than this run's: {'; '.join(bad)}")

    run = serve(a)
    result = {"command": "benchmarks/tau_guard.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "versions": software_versions(BENCHMARK_PACKAGES, keep_missing=False), "hardware": hardware(),
              "run": run}
    status = 0
    if a.record:
        Path(a.reference).write_text(json.dumps({k: run[k] for k in ("k", "num_prompts", "max_tokens", "dtype", "tau")},
                                                indent=1) + "\n")
        print(f"recorded tau {run['tau']} to {a.reference}")
    elif a.reference:
        rows = check(run["tau"], ref["tau"], a.tolerance)
        result["check"] = rows
        for r in rows:
            print(f"{r['set']}: tau {r['tau']} against {r['reference']} (floor {r['floor']}): "
                  f"{'ok' if r['passed'] else 'FAILED'}")
        status = 0 if all(r["passed"] for r in rows) else 1
    else:
        print(f"tau {run['tau']} (no --reference: nothing checked)")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
