"""The floor's vLLM part, child side: what an engine child process (``engine_process.run_child``) runs.

``start_engine`` starts vLLM's ``LLM`` and times it; ``decode_greedy`` (the benchmark's runs, export's load
check), ``decode_sweep`` (the k schedule) and ``top_logprobs`` (the lossless check's reference) are entries
(``eagle3build.vllm.measure:<function>``) that decode and measure: wall time, vLLM's spec-decode counters
(``spec_counters``, ``spec_figures``: τ and acceptance per position) and per-request timings
(``request_timings``). Every function here runs inside the child; vLLM is imported only there.
"""

from __future__ import annotations

import os
import time

# ``engine_process.run_child``'s entry of one engine run that decodes greedily and reads vLLM's spec-decode counters
# (``decode_greedy``): the benchmark's runs and export's load check
RUN_ENTRY = "eagle3build.vllm.measure:decode_greedy"


def start_engine(engine: dict, hold: str | None = None, **kwargs):
    """``vllm.LLM(**engine, **kwargs)`` and the seconds it took to start. Call inside the child.

    ``hold`` (a held child's, ``engine_process.start_child``): once the engine has started, write ``hold`` +
    ``engine_process.READY_SUFFIX`` and wait until the file ``hold`` exists (the parent's release) before returning;
    the seconds waited are ``held_seconds()``'s, not the start's.

    Every kernel compiled after the engine's warm-up is logged (``jit_monitor_verbose``, an engine argument of
    vLLM 0.26 and 0.32, ``vllm/config/observability.py``; without it vLLM logs each kernel's name once), so a
    timed call that compiles shows it in the job's log; ``engine`` can set it False. A ``speculative_config``
    (in ``kwargs``) is served as ``engine_args.drafter_config`` gives it. A CPU engine keeps its engine core in this
    process (``engine_args.CPU_ENGINE_ENV``)."""
    from vllm import LLM

    from .engine_args import CPU_ENGINE_ENV, drafter_config, engine_core_in_process

    if engine_core_in_process(engine):  # read when the engine starts (vllm/envs.py), not at import
        for var, value in CPU_ENGINE_ENV.items():
            os.environ.setdefault(var, value)

    if kwargs.get("speculative_config"):
        kwargs = {**kwargs, "speculative_config": drafter_config(engine, kwargs["speculative_config"])}
    t0 = time.perf_counter()
    llm = LLM(**{"jit_monitor_verbose": True, **engine}, **kwargs)
    start_s = time.perf_counter() - t0
    if hold:
        _wait_release(hold)
    return llm, start_s


_HELD = {"s": 0.0}  # seconds this child's started engine waited for its release (``start_engine``'s hold)


def held_seconds() -> float:
    """Seconds this child's engine waited, started, for the parent's release (0 where it was not held)."""
    return round(_HELD["s"], 2)


def _wait_release(hold: str, poll_s: float = 0.05) -> None:
    """Tell the parent the engine has started (``hold`` + READY_SUFFIX) and wait for the file ``hold``."""
    from pathlib import Path

    from .engine_process import READY_SUFFIX

    t0 = time.perf_counter()
    ready = Path(hold + READY_SUFFIX)
    ready.with_name(ready.name + ".tmp").write_text("started")
    ready.with_name(ready.name + ".tmp").replace(ready)
    while not Path(hold).exists():
        time.sleep(poll_s)
    _HELD["s"] += time.perf_counter() - t0


def decode_greedy(spec: dict) -> dict:
    """One engine: start it, decode all prompts greedily, read its counters. Runs inside the child process.

    ``spec``: ``engine`` (``engine_args``), ``prompts`` (``[{"id", "messages"}]``), ``max_tokens``,
    ``concurrency`` (requests in flight; 0 = all) and optionally ``speculative_config`` and
    ``sets``: ``[{"name": str, "count": int}]``, consecutive groups of ``prompts`` (counts sum to
    ``len(prompts)``). Each group is decoded on its own, one after the other in the same engine,
    with wall time and vLLM's (engine-global) spec-decode counters read before and after it, so
    each group gets its own figures; without ``sets`` all prompts are one group. A group may hold ``parts``
    (``[{"name", "count"}]``, consecutive, counts summing to the group's: MT-Bench's categories), each then decoded
    and read on its own in the same way (its own batches: concurrency 0 puts one part's prompts in flight at once),
    the group's figures being its parts together. The timed calls follow
    ``warm_up`` over the same batches (the groups' or parts' prompts, ``concurrency`` at a time).
    Returns per-run figures over all prompts: engine start and wall seconds (sum over groups),
    output tokens and tokens/s, request latency / TTFT / TPOT summaries, token ids and texts; with
    a drafter also vLLM's spec-decode counters, τ = 1 + accepted / drafts (EAGLE-3 paper) and
    acceptance rates. With ``sets`` also ``"sets": {name: the same figures for that group}``, and for a group with
    ``parts`` ``"sets": {name: {..., "categories": {part name: the same figures for that part}}}``.

    Raises:
        ValueError: the ``sets`` counts do not sum to the number of prompts, or a group's ``parts`` counts to its.
        RuntimeError: vLLM did not empty its prefix cache after the warm-up (``_empty_prefix_cache``).
    """
    from vllm import SamplingParams

    llm, start_s = start_engine(spec["engine"], hold=spec.get("hold"), speculative_config=spec.get("speculative_config"))
    # Greedy needs no per-request seed; a seeded request takes vLLM's slow per-request-generator
    # sampling path (6x fewer tokens/s measured here).
    sp = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"])
    msgs = [p["messages"] for p in spec["prompts"]]
    groups = spec.get("sets") or [{"name": None, "count": len(msgs)}]
    if sum(g["count"] for g in groups) != len(msgs):
        raise ValueError(f"sets {groups} do not partition the {len(msgs)} prompts")
    units, i0 = [], 0  # per group: its timed units (its parts, or itself), each (name, prompts, in flight)
    for g in groups:
        parts = g.get("parts") or [{"name": None, "count": g["count"]}]
        if sum(q["count"] for q in parts) != g["count"]:
            raise ValueError(f"set {g['name']}: parts {parts} do not partition its {g['count']} prompts")
        units.append([])
        for q in parts:
            part = msgs[i0:i0 + q["count"]]
            units[-1].append((q["name"], part, spec.get("concurrency") or max(1, len(part))))  # a set may be empty
            i0 += q["count"]
    # one pass: the groups are timed one after the other without emptying the prefix cache between them
    warm_up(llm, [[b for us in units for _, part, n in us for b in _batches(part, n)]], sp)
    speculative = bool(spec.get("speculative_config"))
    per_set, all_outs, all_counters, total_wall = {}, [], {}, 0.0
    for g, us in zip(groups, units):
        parts, g_outs, g_counters, g_wall = {}, [], {}, 0.0
        for name, part, n in us:
            outs, wall, counters = _timed_chat(llm, part, n, sp)
            parts[name] = _run_figures(outs, wall, counters, speculative)
            g_outs += outs
            g_wall += wall
            g_counters = {k: _add(g_counters.get(k), v) for k, v in counters.items()}
        per_set[g["name"]] = parts[None] if None in parts else {**_run_figures(g_outs, g_wall, g_counters, speculative),
                                                                "categories": parts}
        all_outs += g_outs
        total_wall += g_wall
        all_counters = {k: _add(all_counters.get(k), v) for k, v in g_counters.items()}
    res = {"engine_start_s": round(start_s, 2), **_run_figures(all_outs, total_wall, all_counters, speculative)}
    if spec.get("hold"):
        res["held_s"] = held_seconds()
    if spec.get("sets"):
        res["sets"] = per_set
    return res


def _batches(msgs: list, in_flight: int) -> list[list]:
    """``msgs`` in consecutive batches of ``in_flight`` (the last may be shorter): one ``llm.chat`` call each."""
    return [msgs[i:i + in_flight] for i in range(0, len(msgs), in_flight)]


def _empty_prefix_cache(llm) -> None:
    """vLLM's prefix cache emptied (``LLM.reset_prefix_cache``, vLLM 0.26 and 0.32: a bool).

    Raises:
        RuntimeError: vLLM did not empty it (blocks still held by a request).
    """
    if llm.reset_prefix_cache() is False:
        raise RuntimeError("vLLM did not empty its prefix cache (LLM.reset_prefix_cache returned False)")


def warm_up(llm, passes: list[list[list]], sp) -> None:
    """Untimed, before timed decodes: ``passes`` are the timed passes, each a list of batches (lists of chat
    prompts, one ``llm.chat`` call each, in the timed order) that starts from an empty prefix cache; ``sp`` the
    timed ``SamplingParams``. The largest batch is decoded at full length (the decode path at that many requests
    in flight); then, for each pass, the prefix cache is emptied and every batch decoded again at 2 output tokens
    (its prefill, with the same cache state as its timed call, and one decode or verify step); then the cache is
    emptied, so that the timed prefills are computed, not read from this warm-up (prompts within a pass still
    share what they share, such as a chat template's system prompt). vLLM's counters move; callers read them as
    deltas around the timed calls.

    Why every batch: on the H200 (vLLM 0.26.0) the Kimi-shaped target's benchmark, when it was the machine's first
    on that target and its warm-up was one batch, decoded at normal speed per output token but its first tokens
    took 0.46-0.54 s against 0.05-0.12 s in later attempts over the same prompts (benchmarks/gpu/kimi_h200.md,
    calls 10, 16 and 20). Prefill shapes new to the engine are one candidate (vLLM compiles an MoE target's Triton
    kernels on first use); `start_engine` logs every compile, so the next run on the card shows whether any still
    falls in the timed calls.

    Raises:
        ValueError: no batch in ``passes``.
        RuntimeError: vLLM did not empty its prefix cache (``_empty_prefix_cache``).
    """
    batches = [b for p in passes for b in p]
    if not batches:
        raise ValueError("warm_up: no batch to warm up")
    llm.chat(max(batches, key=len), sp, use_tqdm=False)
    short = sp.clone()
    short.max_tokens = 2
    for p in passes:
        _empty_prefix_cache(llm)
        for b in p:
            llm.chat(b, short, use_tqdm=False)
    _empty_prefix_cache(llm)


def _timed_chat(llm, msgs: list, in_flight: int, sp):
    """Decode chat prompts ``msgs`` ``in_flight`` at a time in ``llm``: ``(outputs, wall seconds, vLLM's
    spec-decode counter deltas over the calls)``."""
    before = spec_counters(llm.get_metrics())
    t1 = time.perf_counter()
    outs = [o for b in _batches(msgs, in_flight) for o in llm.chat(b, sp, use_tqdm=False)]
    wall = time.perf_counter() - t1
    return outs, wall, counter_delta(spec_counters(llm.get_metrics()), before)


def decode_sweep(spec: dict) -> dict:
    """One engine, the same prompts decoded greedily at each of several concurrencies: the measurement behind a
    k schedule by batch size (``serve.k_schedule.k_schedule``). Runs inside the child process.

    ``spec``: ``engine`` (``engine_args``, sized for the largest concurrency), ``prompts``
    (``[{"id", "messages"}]``), ``max_tokens``, ``concurrencies`` (requests in flight, each >= 1), optionally
    ``speculative_config``. After the warm-up (``warm_up``: every concurrency's batches), for each concurrency
    ``c`` the prefix cache is emptied and the prompts are decoded ``c`` at a time. Returns ``{"engine_start_s",
    "by_concurrency": {str(c): {"wall_s", "output_tokens", "output_tokens_per_s", ..., and with a drafter τ and
    acceptance}}}`` (``_run_figures`` less token ids and texts).

    Raises:
        RuntimeError: vLLM did not empty its prefix cache (``_empty_prefix_cache``).
    """
    from vllm import SamplingParams

    llm, start_s = start_engine(spec["engine"], speculative_config=spec.get("speculative_config"))
    sp = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"])
    msgs = [p["messages"] for p in spec["prompts"]]
    warm_up(llm, [_batches(msgs, c) for c in spec["concurrencies"]], sp)
    speculative = bool(spec.get("speculative_config"))
    by_c = {}
    for c in spec["concurrencies"]:
        _empty_prefix_cache(llm)  # each concurrency's prefills computed, as the first one's
        fig = _run_figures(*_timed_chat(llm, msgs, c, sp), speculative)
        for key in ("token_ids", "prompt_token_ids", "texts"):
            fig.pop(key)
        by_c[str(c)] = fig
    return {"engine_start_s": round(start_s, 2), "by_concurrency": by_c}


def top_logprobs(spec: dict) -> dict:
    """One engine (no drafter): for each ``items`` entry (``prompt_token_ids`` + ``prefix``, token
    ids) the engine's ``top`` most likely next tokens and their log-probabilities, from one greedy
    step with ``SamplingParams(logprobs=top)`` (vLLM returns log-softmax over the target's full
    vocabulary). Runs inside the child process. Returns ``{"engine_start_s", "top": [[[token, logprob],
    ...] per item, most likely first]}``.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm, start_s = start_engine(spec["engine"])
    top = int(spec.get("top", 5))
    prompts = [TokensPrompt(prompt_token_ids=list(it["prompt_token_ids"]) + list(it["prefix"])) for it in spec["items"]]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1, logprobs=top), use_tqdm=False)
    res = []
    for o in outs:
        lp = o.outputs[0].logprobs[0]  # {token_id: Logprob} of the one generated position
        res.append(sorted(([int(t), float(v.logprob)] for t, v in lp.items()), key=lambda x: -x[1])[:top])
    return {"engine_start_s": round(start_s, 2), "top": res}


def _run_figures(outs, wall: float, counters: dict, speculative: bool) -> dict:
    """Figures of one group of requests: tokens, tokens/s over ``wall`` seconds, timings, texts,
    and with a drafter the spec-decode counters and τ = 1 + accepted / drafts (EAGLE-3 paper)."""
    token_ids = [list(o.outputs[0].token_ids) for o in outs]
    out_tokens = sum(len(t) for t in token_ids)
    res = {
        "wall_s": round(wall, 3),
        "output_tokens": out_tokens,
        "output_tokens_per_s": round(out_tokens / wall, 2),
        **request_timings(outs),
        "token_ids": token_ids,
        "prompt_token_ids": [list(o.prompt_token_ids or []) for o in outs],
        "texts": [o.outputs[0].text for o in outs],
    }
    if speculative:
        res.update(spec_figures(counters))
    return res


def spec_figures(counters: dict) -> dict:
    """τ and acceptance rates from vLLM's spec-decode counter deltas (``vllm:spec_decode_*``).

    τ (mean acceptance length) = 1 + accepted / drafts (EAGLE-3 paper); acceptance rate =
    accepted / draft tokens; at position i = accepted_per_pos[i] / drafts. None where no draft ran.
    """
    drafts = counters.get("vllm:spec_decode_num_drafts", 0)
    draft_tokens = counters.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = counters.get("vllm:spec_decode_num_accepted_tokens", 0)
    per_pos = counters.get("vllm:spec_decode_num_accepted_tokens_per_pos", [])
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "accepted_per_position": per_pos,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "acceptance_rate_per_position": [a / drafts for a in per_pos] if drafts else None,
    }


def summary(values: list[float]) -> dict:
    """p50, p95 (linear interpolation, numpy's default) and mean of ``values`` (seconds)."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return {"p50": 0.0, "p95": 0.0, "mean": 0.0}
    return {"p50": round(float(np.percentile(v, 50)), 5), "p95": round(float(np.percentile(v, 95)), 5),
            "mean": round(float(v.mean()), 5)}


def request_timings(outs) -> dict:
    """Latency, time to first token and time per output token over the requests (seconds).

    Raises:
        RuntimeError: vLLM returned no per-request metrics (stats logging is off).
    """
    lat, ttft, tpot = [], [], []
    for o in outs:
        m = o.metrics
        if m is None or not getattr(m, "last_token_ts", 0):
            raise RuntimeError("vLLM returned no per-request metrics; the engine must run with disable_log_stats=False")
        n = len(o.outputs[0].token_ids)
        lat.append(m.last_token_ts - m.queued_ts)
        ttft.append(m.first_token_ts - m.queued_ts)
        if n > 1:
            tpot.append((m.last_token_ts - m.first_token_ts) / (n - 1))
    return {"request_latency_s": summary(lat), "time_to_first_token_s": summary(ttft),
            "time_per_output_token_s": summary(tpot)}


def counter_delta(after: dict, before: dict) -> dict:
    """``after - before`` per counter of two ``spec_counters`` readings (lists element-wise)."""
    return {k: _sub(after.get(k), before.get(k)) for k in after}


def _sub(a, b):
    if isinstance(a, list):
        b = b or [0] * len(a)
        return [x - y for x, y in zip(a, b, strict=True)]
    return (a or 0) - (b or 0)


def _add(a, b):
    if isinstance(b, list):
        a = a or [0] * len(b)
        return [x + y for x, y in zip(a, b, strict=True)]
    return (a or 0) + (b or 0)


def spec_counters(metrics) -> dict:
    """vLLM's spec-decode counters (``vllm:spec_decode_*``, totals since the engine started) from
    ``LLM.get_metrics()``: ``{name: int, or a list of ints per draft position}``."""
    out: dict = {}
    for m in metrics:
        if not m.name.startswith("vllm:spec_decode"):
            continue
        if hasattr(m, "values"):
            out[m.name] = list(m.values)
        elif hasattr(m, "value"):
            out[m.name] = m.value
    return out
