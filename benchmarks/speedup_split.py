"""Where the time of speculative decoding goes, from the project's own benchmark.json (no extra runs).

With the head, one engine step verifies k drafted tokens in one target forward and emits τ
tokens on average (τ = 1 + accepted / drafts), so the mean step time is
``TPOT(k) x τ(k)`` (TPOT: vLLM's time per output token, request means, seconds). Across the
k of one benchmark the steps differ only in how many draft tokens were proposed and verified,
so a least-squares line ``step(k) = a + b k`` splits a step into ``b`` per drafted token (the
draft head's forward, one per token, and the extra verified row) and ``a``, the rest: the
target's verification forward, sampling and rejection, and vLLM's scheduling. Baseline decoding
spends ``TPOT(0)`` per step. The speed-up is ``τ x TPOT(0) / (a + b k)``; it exceeds 1 only
where ``a + b k`` is less than τ baseline steps, and its ceiling at τ -> k + 1 is
``(k + 1) TPOT(0) / (a + b k)``.

    python benchmarks/speedup_split.py results/R/benchmark.json [more.json ...] [--json out.json]

Prints, per file, head (the run's own and each of ``benchmark.compare_heads``, each fitted on its own) and set:
the baseline step, ``a``, ``b``, per k τ, the step time, the
speed-up measured and the ceiling.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def runs(result: dict) -> list[dict]:
    """The runs with a head of one benchmark.json: ``runs`` (benchmark OUTPUT_VERSION 8 on) or ``eagle3`` (before);
    eagle3build.formats.benchmark_runs.benchmark_runs, restated so that this script reads a file without the package."""
    return result.get("runs", result.get("eagle3")) or []


def heads(result: dict) -> list[str]:
    """The heads of one benchmark.json in run order: the run's own (``head``) and each of
    ``benchmark.compare_heads`` (a run without a ``head`` field is the run's own)."""
    return list(dict.fromkeys(r.get("head", "head") for r in runs(result)))


def split(result: dict, set_name: str | None = None, head: str = "head") -> dict:
    """The step-time split of one benchmark.json (``set_name``: one prompt set; None: overall) for one ``head``
    (``heads``): the line is fitted over that head's k only (heads draft at different costs)."""
    def pick(run):
        return run if set_name is None else run["sets"][set_name]

    base_tpot = pick(result["baseline"])["time_per_output_token_s"]["mean"]
    rows = []
    for r in runs(result):
        if r.get("head", "head") != head:
            continue
        f = pick(r)
        tau = f["mean_acceptance_length"]
        if tau is None:
            continue
        k = r["num_speculative_tokens"]
        tpot = f["time_per_output_token_s"]["mean"]
        rows.append({"k": k, "tau": round(tau, 3), "tpot_ms": round(1e3 * tpot, 3), "step_ms": round(1e3 * tpot * tau, 3),
                     "speedup": round(f["speedup"], 3)})
    out = {"set": set_name or "overall", "head": head, "concurrency": result["settings"]["concurrency"],
           "baseline_step_ms": round(1e3 * base_tpot, 3), "rows": rows}
    if len({r["k"] for r in rows}) >= 2:
        ks = np.array([r["k"] for r in rows], float)
        steps = np.array([r["step_ms"] for r in rows], float)
        b, a = np.polyfit(ks, steps, 1)
        out.update(fixed_ms=round(float(a), 3), per_draft_token_ms=round(float(b), 3),
                   fixed_over_baseline_step=round(float(a) / (1e3 * base_tpot), 3))
        for r in rows:
            r["ceiling_speedup"] = round((r["k"] + 1) * 1e3 * base_tpot / (a + b * r["k"]), 3)
    return out


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("benchmarks", nargs="+", help="benchmark.json files")
    ap.add_argument("--json", type=str, default=None)
    a = ap.parse_args(argv)
    out = []
    for path in a.benchmarks:
        result = json.loads(Path(path).read_text())
        for head in heads(result):
            for name in [None, *result["settings"]["sets"]]:
                s = dict(split(result, name, head), file=str(path))
                out.append(s)
                fixed = (f"fixed a = {s['fixed_ms']} ms ({s['fixed_over_baseline_step']}x the baseline step), "
                         f"b = {s['per_draft_token_ms']} ms per draft token" if "fixed_ms" in s else "one k: no split")
                print(f"{path} [{head}, {s['set']}, concurrency {s['concurrency']}]: baseline step "
                      f"{s['baseline_step_ms']} ms; {fixed}")
                for r in s["rows"]:
                    ceiling = f", ceiling x{r['ceiling_speedup']}" if "ceiling_speedup" in r else ""
                    print(f"  k={r['k']}: tau {r['tau']}, step {r['step_ms']} ms, speed-up x{r['speedup']}{ceiling}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
