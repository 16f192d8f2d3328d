"""Step costs of speculative decoding: the pre-flight bound's table and the benchmark's check against it.

Shared by the compat stage's ``preflight_bound`` (which measures) and the serve stage's ``benchmark``
(which compares): a speculative step that verifies k drafts costs ``step(k)``; with τ tokens emitted per
step (mean acceptance length, EAGLE-3 paper, arXiv 2503.01840) the speed-up over plain decoding is
``τ x T_decode / step(k)``, so τ must reach ``step(k) / T_decode`` to break even and 1.5 times that for
1.5x; τ cannot exceed k + 1.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)

TOLERANCE = 0.15  # the benchmark's measured step-cost ratio should fall within this share of the table's


def bound_table(measured: dict, draft_s: dict, ks: list[int]) -> list[dict]:
    """The pre-flight table: per concurrency c (``measured["by_concurrency"]``, ``measure_in_engine``'s) and
    k in ``ks``: the target's verification step, the draft's estimated cost (``draft_s[c]``, seconds per
    drafted token), ``step_cost_ratio``, ``tau_break_even``, ``tau_for_1_5x`` and whether each is reachable
    (at most k + 1). Seconds become milliseconds in the rows.

    Raises:
        KeyError: ``measured`` lacks the n = k + 1 or n = 1 step of a k.
    """
    rows = []
    for c, m in measured["by_concurrency"].items():
        base, fwd = m["decode_step_s"], m["forward_s"]
        for k in ks:
            verify = base + fwd[str(k + 1)] - fwd["1"]
            step = verify + k * draft_s[c]
            ratio = step / base
            rows.append({"concurrency": int(c), "k": k, "decode_step_ms": round(1e3 * base, 4),
                         "verify_step_ms": round(1e3 * verify, 4), "draft_ms_per_token": round(1e3 * draft_s[c], 4),
                         "step_ms": round(1e3 * step, 4), "target_verify_ratio": round(verify / base, 4),
                         "step_cost_ratio": round(ratio, 4), "tau_break_even": round(ratio, 3),
                         "tau_for_1_5x": round(1.5 * ratio, 3), "break_even_reachable": ratio <= k + 1,
                         "speedup_1_5x_reachable": 1.5 * ratio <= k + 1,
                         "max_speedup_at_tau_k_plus_1": round((k + 1) / ratio, 3)})
    return rows


def compare_benchmark(benchmark: dict, preflight_result: dict, tolerance: float = TOLERANCE) -> dict:
    """Measured against predicted, per EAGLE-3 run of a benchmark.json (``benchmark``): the measured step
    (time per output token x τ, overall) over the measured baseline step (its time per output token), against
    the pre-flight table's ``step_cost_ratio`` at the same k and the nearest measured concurrency
    (``settings.concurrency``; 0 = all prompts at once). Returns ``{"concurrency_used", "tolerance", "rows":
    [{"k", "measured_step_ms", "measured_baseline_step_ms", "measured_step_cost_ratio", "predicted_step_cost_ratio",
    "relative_error", "within_tolerance"}]}``; a k the table lacks gets ``predicted`` None.
    """
    conc = benchmark["settings"]["concurrency"] or sum(s["num_prompts"] for s in benchmark["settings"]["sets"].values())
    table = preflight_result["table"]
    cs = sorted({r["concurrency"] for r in table})
    c_used = min(cs, key=lambda c: (abs(c - conc), c))
    base = benchmark["baseline"]["time_per_output_token_s"]["mean"]
    rows = []
    for r in benchmark["eagle3"]:
        k, tau = r["num_speculative_tokens"], r["mean_acceptance_length"]
        step = r["time_per_output_token_s"]["mean"] * tau if tau else None
        pred = next((t for t in table if t["k"] == k and t["concurrency"] == c_used), None)
        ratio = step / base if step and base else None
        p = pred["step_cost_ratio"] if pred else None
        err = (ratio - p) / p if ratio is not None and p else None
        rows.append({"k": k, "tau": tau, "measured_step_ms": round(1e3 * step, 4) if step else None,
                     "measured_baseline_step_ms": round(1e3 * base, 4),
                     "measured_step_cost_ratio": round(ratio, 4) if ratio is not None else None,
                     "predicted_step_ms": pred["step_ms"] if pred else None,
                     "predicted_step_cost_ratio": p, "relative_error": round(err, 4) if err is not None else None,
                     "within_tolerance": abs(err) <= tolerance if err is not None else None})
        if err is not None:
            log.info("k=%d: step %.3f ms = %.2f baseline steps measured, %.2f predicted by the pre-flight table "
                     "(c=%d): %+.1f %%", k, 1e3 * step, ratio, p, c_used, 100 * err)
    return {"concurrency_used": c_used, "tolerance": tolerance, "rows": rows}
