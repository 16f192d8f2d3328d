"""Step costs of speculative decoding: the pre-flight bound's table and the benchmark's check against it.

Shared by the compat stage's ``preflight_bound`` (which measures) and the serve stage's ``benchmark``
(which compares): a speculative step that verifies k drafts costs ``step(k)``; with τ tokens emitted per
step (mean acceptance length, EAGLE-3 paper, arXiv 2503.01840) the speed-up over plain decoding is
``τ x T_decode / step(k)``, so τ must reach ``step(k) / T_decode`` to break even and 1.5 times that for
1.5x; τ cannot exceed k + 1. A k schedule's sweep is judged by the same figures (``accepted``, ``log_gain``).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from ..formats.benchmark_runs import OWN_HEAD, benchmark_runs

log = logging.getLogger(__name__)

TOLERANCE = 0.15  # the benchmark's measured step-cost ratio should fall within this share of the table's


def verify_slope(forward_s: dict[str, float]) -> float:
    """Seconds each more verified token adds to a step: the Theil-Sen slope (the median of the slopes between
    every pair of points; Sen 1968) of the n-token step times ``forward_s`` (``{str(n): seconds}``) over n >= 2.

    n = 1 is left out: one new token per sequence runs the engine's decode kernels (and, on GPUs, its full CUDA
    graph), n >= 2 its prefill path, which costs a fixed amount more (3.5 ms on an H200 for a 135M target,
    benchmarks/gpu/kimi_h200.md) that a verification step does not pay. The median keeps one noisy shape
    from setting the slope. Where fewer than two n >= 2 were measured: the difference to n = 1.

    Raises:
        ValueError: fewer than two shapes measured.
    """
    pts = sorted((int(n), t) for n, t in forward_s.items())
    pre = [(n, t) for n, t in pts if n >= 2]
    if len(pre) < 2:
        if len(pts) < 2:
            raise ValueError(f"verify_slope: need step times of two shapes, got {forward_s}")
        (n0, t0), (n1, t1) = pts[0], pts[-1]
        return max(0.0, (t1 - t0) / (n1 - n0))
    slopes = sorted((t2 - t1) / (n2 - n1) for a, (n1, t1) in enumerate(pre) for n2, t2 in pre[a + 1:])
    mid = len(slopes) // 2
    # at least 0: a step over more tokens costs no less (a negative median is noise: a dense target at 16 in
    # flight, whose extra tokens are free)
    return max(0.0, slopes[mid] if len(slopes) % 2 else (slopes[mid - 1] + slopes[mid]) / 2)


def bound_table(measured: dict, steps_s: dict, ks: list[int]) -> list[dict]:
    """The pre-flight table: per concurrency c (``measured["by_concurrency"]``: ``decode_step_s`` and the n-token
    steps ``forward_s``) and k in ``ks``: the target's verification step ``T_verify = T_decode + k x
    verify_slope``; the whole speculative step, measured where ``steps_s`` (``{str(k): {str(c): seconds}}``)
    holds it, else ``T_verify + k x T_draft``, with ``T_draft`` (``draft_ms_per_token``) the median over the
    measured k of (measured step - ``T_verify``) / k, at least 0; ``step_cost_ratio`` = step / ``T_decode``,
    ``tau_break_even`` (= that ratio), ``tau_for_1_5x`` (1.5 x it) and whether each is reachable (at most k + 1);
    ``target_verify_ratio`` = ``T_verify`` / ``T_decode``; ``step_source``: ``measured`` | ``estimated``.
    Milliseconds in the rows.

    Raises:
        ValueError: a concurrency with fewer than two measured shapes (``verify_slope``), or no measured step
            at some concurrency.
    """
    import statistics

    rows = []
    for c, m in measured["by_concurrency"].items():
        base = m["decode_step_s"]
        slope = verify_slope(m["forward_s"])
        at_c = {int(k): v[c] for k, v in steps_s.items() if c in v}
        if not at_c:
            raise ValueError(f"bound_table: no speculative step measured at concurrency {c} (got {steps_s})")
        draft = max(0.0, statistics.median((s - base - k * slope) / k for k, s in at_c.items()))
        for k in ks:
            verify = base + k * slope
            step = at_c.get(k, verify + k * draft)
            ratio = step / base
            rows.append({"concurrency": int(c), "k": k, "decode_step_ms": round(1e3 * base, 4),
                         "verify_ms_per_token": round(1e3 * slope, 4), "verify_step_ms": round(1e3 * verify, 4),
                         "draft_ms_per_token": round(1e3 * draft, 4), "step_ms": round(1e3 * step, 4),
                         "step_source": "measured" if k in at_c else "estimated",
                         "target_verify_ratio": round(verify / base, 4), "step_cost_ratio": round(ratio, 4),
                         "tau_break_even": round(ratio, 3), "tau_for_1_5x": round(1.5 * ratio, 3),
                         "break_even_reachable": ratio <= k + 1, "speedup_1_5x_reachable": 1.5 * ratio <= k + 1,
                         "max_speedup_at_tau_k_plus_1": round((k + 1) / ratio, 3)})
    return rows


def accepted(taus: Mapping[int, Mapping[int, float | None]] | None, k: int, c: int) -> bool:
    """Whether k's drafts were accepted at concurrency c (τ above 1; τ None: the engine drafted nothing there);
    True where no τ are given (``taus``: k -> concurrency -> τ, the k schedule's sweep)."""
    if taus is None:
        return True
    t = taus.get(k, {}).get(c)
    return t is not None and t > 1.0


def log_gain(tps: Mapping[int, float], baseline: Mapping[int, float]) -> float:
    """Sum over the concurrencies of ``tps`` (concurrency -> output tokens/s) of log(its tokens/s over
    ``baseline``'s): a schedule's speed-up on balance; -inf where either is not positive (nothing decoded)."""
    if any(tps[c] <= 0 or baseline[c] <= 0 for c in tps):
        return -math.inf
    return sum(math.log(tps[c] / baseline[c]) for c in tps)


def speculative_step_s(run: dict) -> float | None:
    """The mean engine step of a benchmark run with a head, in seconds: its time per output token (mean over
    requests) x τ (mean acceptance length: tokens a step emits; benchmarks/speedup_split.py). None where the run
    drafted nothing (τ None) or no request had two tokens (time per output token 0)."""
    tau, tpot = run.get("mean_acceptance_length"), run["time_per_output_token_s"]["mean"]
    return tpot * tau if tau and tpot else None


def step_cost(base: dict, run: dict) -> dict:
    """The mean engine step with the head, ``step_ms`` = ``run``'s time per output token (mean, s) x its τ (mean
    acceptance length: tokens a step emits), in ms, and ``step_cost_ratio`` = that step over ``base``'s time per
    output token: what one speculative step costs in the target's own decode steps (the τ that breaks even;
    benchmarks/speedup_split.py splits the same step across k). Heads served at one k verify the same k + 1 tokens
    a step, so their ``step_ms`` differ by what drafting costs each. None where the run drafted nothing (τ None)
    or a time per output token is 0 (no request of two tokens). The mean time per output token is over requests
    and τ over drafts, so the product is the mean step where requests are alike in length; the times are read to
    10 µs (``measure.summary``), about 0.5 % of a 2 ms step."""
    step = speculative_step_s(run)
    base_tpot = base["time_per_output_token_s"]["mean"]
    return {"step_ms": round(1e3 * step, 4) if step else None,
            "step_cost_ratio": round(step / base_tpot, 4) if step and base_tpot else None}


def _relative(measured: float | None, predicted: float | None) -> float | None:
    """``measured / predicted - 1``, rounded to 4 places; None where either is missing or 0."""
    return round(measured / predicted - 1, 4) if measured and predicted else None


def compare_benchmark(benchmark: dict, preflight_result: dict, tolerance: float = TOLERANCE) -> dict:
    """Measured against predicted, per EAGLE-3 run of a benchmark.json (``benchmark``): the measured step
    (time per output token x τ, overall) over the measured baseline step (its time per output token), against
    the pre-flight table's ``step_cost_ratio`` at the same k and the nearest measured concurrency to the
    requests actually in flight (``settings.concurrency``, capped by each set's prompt count since the sets
    run one after another; 0 = all of a set's prompts at once). Only the run's own head's rows (the table
    timed an untrained EAGLE-3 head of its shapes; ``benchmark.compare_heads``' rows are left out).
    Returns ``{"concurrency_used", "tolerance", "draft_cost", "rows": [{"k", "measured_step_ms",
    "measured_baseline_step_ms", "measured_step_cost_ratio", "predicted_step_ms", "predicted_decode_step_ms",
    "predicted_step_cost_ratio", "relative_error", "within_tolerance", "step_relative_error",
    "decode_relative_error"}]}`` (times in ms). A k
    the table lacks gets ``predicted_step_ms``, ``predicted_step_cost_ratio``, ``relative_error``,
    ``within_tolerance`` and ``step_relative_error`` None.

    ``draft_cost`` (issue 40 item 2), one row per run of every head (``benchmark.compare_heads``' included: the
    target's verification at a k does not depend on the head): ``[{"head", "method", "k", "step_ms",
    "verify_step_ms", "draft_ms_per_step", "draft_ms_per_drafted_token"}]`` in ms. ``verify_step_ms`` is the
    target's own step over k + 1 tokens, this benchmark's baseline step plus k x the table's
    ``verify_ms_per_token`` (a slope: a per-step offset between the pre-flight's engine and this one, as
    ``decode_relative_error`` shows, cancels out of it); ``draft_ms_per_step`` the measured step (``step_ms``: time
    per output token x τ) less that: what drafting costs the head a step, with everything else a speculative step
    adds (the drafter's forwards, rejection sampling, the proposer's bookkeeping). It may come out below 0 by
    noise (it is not clamped). ``draft_ms_per_drafted_token`` is that over k: EAGLE-3's cost per draft forward,
    but for a parallel drafter (P-EAGLE, DFlash: one forward for all k; ``method``, where the run names it) an
    amortised figure that falls with k. A run without τ, or a k the table lacks, gets None in the computed fields.

    ``relative_error`` (the check, against ``tolerance``) is the ratio's: measured / predicted - 1. The ratio's
    two sides are also compared on their own, each as measured / predicted - 1 (a fraction; below 0: the
    benchmark ran faster than the pre-flight timed): the speculative step (``step_relative_error``) and the
    target's decode step, the benchmark's baseline against the pre-flight's ``T_decode`` at that concurrency
    (``decode_relative_error``, the same for every k). So 1 + relative_error = (1 + step_relative_error) /
    (1 + decode_relative_error). On an H200 (benchmarks/gpu/kimi_h200.md, calls 11-13) the dense target's step
    was +0.7 % and its decode step -18.4 % (ratio +23.4 %); the Kimi-shaped target's -15.3 % and -21.6 % (+8.1 %).
    """
    # requests in flight: each set is decoded on its own, so at most its prompt count (16 asked of 4 prompts is 4)
    c = benchmark["settings"]["concurrency"]
    conc = max((min(c, s["num_prompts"]) if c else s["num_prompts"] for s in benchmark["settings"]["sets"].values()),
               default=c or 1)
    table = preflight_result["table"]
    cs = sorted({r["concurrency"] for r in table})
    c_used = min(cs, key=lambda c: (abs(c - conc), c))
    base = benchmark["baseline"]["time_per_output_token_s"]["mean"]
    decode_ms = next(t["decode_step_ms"] for t in table if t["concurrency"] == c_used)  # one T_decode per concurrency
    decode_err = _relative(1e3 * base, decode_ms)
    rows, draft_cost = [], []
    for r in benchmark_runs(benchmark):
        k, head, step = r["num_speculative_tokens"], r.get("head", OWN_HEAD), speculative_step_s(r)
        t = next((t for t in table if t["k"] == k and t["concurrency"] == c_used), None)
        # every head: its step less the target's verification (this baseline's step + k x the table's slope)
        verify = 1e3 * base + k * t["verify_ms_per_token"] if t and base else None
        draft = 1e3 * step - verify if step is not None and verify is not None else None
        draft_cost.append({"head": head, "method": r.get("method"), "k": k,
                           "step_ms": round(1e3 * step, 4) if step is not None else None,
                           "verify_step_ms": round(verify, 4) if verify is not None else None,
                           "draft_ms_per_step": round(draft, 4) if draft is not None else None,
                           "draft_ms_per_drafted_token": round(draft / k, 4) if draft is not None else None})
        if draft is not None:
            log.info("%s k=%d: step %.3f ms, of which the target's verification %.3f ms and drafting %.3f ms",
                     head, k, 1e3 * step, verify, draft)
        if head != OWN_HEAD:  # a compared head (benchmark.compare_heads): not what the table timed
            continue
        ratio = step / base if step and base else None
        p = t["step_cost_ratio"] if t else None
        err = (ratio - p) / p if ratio is not None and p else None
        step_err = _relative(1e3 * step if step else None, t["step_ms"] if t else None)
        rows.append({"k": k, "tau": r["mean_acceptance_length"], "measured_step_ms": round(1e3 * step, 4) if step else None,
                     "measured_baseline_step_ms": round(1e3 * base, 4),
                     "measured_step_cost_ratio": round(ratio, 4) if ratio is not None else None,
                     "predicted_step_ms": t["step_ms"] if t else None,
                     "predicted_decode_step_ms": decode_ms,
                     "predicted_step_cost_ratio": p, "relative_error": round(err, 4) if err is not None else None,
                     "within_tolerance": abs(err) <= tolerance if err is not None else None,
                     "step_relative_error": step_err, "decode_relative_error": decode_err})
        if err is not None:
            log.info("k=%d: step %.3f ms = %.2f baseline steps measured, %.2f predicted by the pre-flight table "
                     "(c=%d): %+.1f %% (the step alone %+.1f %%, the baseline's decode step %+.1f %%)", k, 1e3 * step,
                     ratio, p, c_used, 100 * err, 100 * step_err, 100 * decode_err)
    return {"concurrency_used": c_used, "tolerance": tolerance, "draft_cost": draft_cost, "rows": rows}
