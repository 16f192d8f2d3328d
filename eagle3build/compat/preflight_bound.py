"""Stage ``preflight_bound``: before any training, can speculation pay on this target and these GPUs?

Speculative decoding emits τ tokens per engine step (τ: mean acceptance length, EAGLE-3 paper),
but its step verifies k + 1 tokens per sequence and drafts k tokens. Its speed-up over decoding one
token per step is ``S(k) = τ x T_decode / T_step(k)``. For a dense target verifying a few more tokens
is nearly free; for an MoE target it is not: each extra token routes to its own experts (Kimi-K2.5:
8 of 384 per layer), so a step over k + 1 tokens reads up to (k + 1) x 8 experts' weights. This stage
measures that cost on the job's GPUs with the target's real weights, in one vLLM engine (target only,
prefix caching on, the serving configuration otherwise):

- ``T_decode(c)``: time per output token of plain greedy decoding, ``c`` sequences in flight (vLLM's
  own per-request timestamps: (last token - first token) / (tokens - 1), as the benchmark's TPOT);
- ``T_fwd(n, c)``: one engine step that computes ``n`` new tokens for each of ``c`` sequences whose
  ``context_tokens``-token context is already in the KV cache (prefix caching; the step is the request's
  first-token time minus its scheduled time, both engine-core timestamps). That is the shape of a
  verification step of k = n - 1 drafts. It runs the engine's prefill path (for MLA: the context's
  latent KV decompressed, not the absorbed decode kernel; on GPUs no full CUDA graph), which costs a fixed
  amount more than a decode step, so only its slope is used: the target's verification step at k is
  ``T_verify(k, c) = T_decode(c) + k x s(c)``, ``s`` the Theil-Sen slope of ``T_fwd(n, c)`` over n >= 2
  (``step_costs.verify_slope``).
- ``T_step(k, c)``: the whole speculative step at k, *measured* for the k the benchmark serves
  (``benchmark.ks``; the largest k where none is tabulated): the target served with an untrained head
  of the trained head's shapes (``head_model.write_untrained_head``: random weights, this target's
  layer config, the configured draft vocab) as its EAGLE-3 drafter, one engine per k, timed as the
  benchmark times it (time per output token x τ, τ near 1 since random drafts are rejected). That is the
  draft's cost with vLLM's own drafter, kernels and CUDA graphs, before any training. Its share over the
  target's verification, per drafted token, ``T_draft(c)`` (the median over the measured k), estimates
  the step at the k not measured: ``T_verify(k, c) + k x T_draft(c)``.

With ``draft.layer: mla`` (a DeepSeek-V3/Kimi target) the whole step is measured with an untrained head of each
draft layer, the MLA layer first and the llama layer beside it (``draft_layers``, one engine per layer and k): the
table is the MLA head's, and ``draft_layers`` holds each layer's steps, table (draft cost per drafted token, τ to
break even) and KV cache bytes per token of the draft (``draft_kv_bytes_per_token``).

Per k and c the table holds ``step_cost_ratio = T_step(k, c) / T_decode(c)`` (``step_source``: measured or
estimated), the τ
to break even (= that ratio: S = 1) and the τ for 1.5x (1.5 x the ratio), each reachable only where
it is at most k + 1 (τ cannot exceed k + 1), and ``target_verify_ratio = T_verify / T_decode`` (the
target alone: the curve that rises for an MoE; ``step_costs.bound_table``). The benchmark compares its
measured steps with it (``step_costs.compare_benchmark``).
"""
from __future__ import annotations

import logging
import os
import statistics
from collections.abc import Mapping
from pathlib import Path

from ..atomic import write_json
from ..config.provenance import BENCHMARK_PACKAGES, hardware, software_versions
from ..config.settings import config_fields, job
from ..draft.choice import Draft, resolve
from ..draft.head_format import Head
from ..draft.head_model import write_untrained_head
from ..draft.mla_format import layer_config
from ..draft.step_costs import bound_table
from ..formats.artifacts import Decisions
from ..target import kv_cache_bytes_per_token
from ..vllm import engine_process, measure
from ..vllm.engine_args import engine_args

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes.
# 2: the whole step measured with an untrained head in vLLM (no eager stand-in); 3: its spread;
# 4: measured.startup.model_runner (engine_process.startup_breakdown); 5: decode length = benchmark.max_tokens;
# 6: the decode step's spread and second pass (decode_step_s_min / _max / _second_pass)
OUTPUT_VERSION = 6
# Before training: vLLM engines on the serve job's GPUs time the target's verification steps alone and with an
# untrained head (decisions.json: its aux layer ids and variant).
STAGE = {
    "inputs": ("target",), "decisions": ("capture.aux_layer_ids", "head.recommended_variant"),
    "packages": ("vllm", "torch", "speculators"), "entry": "preflight",
    "keys": {"run": "files", "target.bundled": "files", "target.path": "files", "target.served_name": "runtime",
             "target.serve_dtype": "trigger:dtype", "target.trust_remote_code": "trigger", "target.offline": "runtime",
             "target.pipeline_parallel_size": "trigger", "vocab.draft_vocab_size": "trigger",
             "draft.layer": "trigger:preflight/draft_layer", "benchmark.ks": "trigger", "benchmark.max_tokens": "trigger",
             "preflight.*": "trigger:preflight", "preflight.enabled": "files", "resources.gpu_model": "runtime",
             "resources.serve.*": "runtime"},
}

SCHEMA = "eagle3build.preflight/1"
ENTRY = "eagle3build.compat.preflight_bound:measure_in_engine"
SPEC_ENTRY = "eagle3build.compat.preflight_bound:measure_speculative_steps"
# Output tokens per request of the decode and speculative-step measurements where none is given; the job passes
# the benchmark's cap, benchmark.max_tokens, the length the benchmark's steps are checked at. Time per output token
# falls with a request's length: the bundled target at one request in flight on an H200 (vLLM 0.26.0,
# benchmarks/records/decode-step-ab_h200.json) read 2.30 ms a token over 32 tokens and 1.73 over 96 in one engine
# (2.46 and 1.88 in the pre-flight's engine size), and a pre-flight timed at 32 tokens read the decode step 23 % above
# the benchmark's at 96 (2.39 against 1.95 ms; benchmarks/gpu/kimi_h200.md, calls 12-16).
SEED = 0  # the engines' sampling seed: every measurement decodes greedily
DECODE_TOKENS = 32


class _Requests:
    """Token-id requests of ordinary random tokens (ids 100..min(vocab, 30000), no special tokens), seeded,
    and the engine calls both measurements share (inside an engine child)."""

    def __init__(self, llm, vocab_size: int, seed: int):
        import numpy as np

        self.llm, self.rng = llm, np.random.default_rng(seed)
        self.lo, self.hi = 100, max(101, min(int(vocab_size), 30000))

    def fresh(self, n: int) -> list[int]:
        return self.rng.integers(self.lo, self.hi, n).tolist()

    def gen(self, prompts: list[list[int]], sp):
        return self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)

    def decode_steps(self, prefixes: list[list[int]], repeats: int, tokens: int = DECODE_TOKENS) -> list[float]:
        """Per request of ``repeats`` calls (one request per prefix, in flight together, ``tokens`` output tokens
        each): its time per output token (vLLM's timestamps: (last - first token) / (tokens - 1), seconds), after
        one warm-up call.

        Raises:
            RuntimeError: vLLM returned no per-request timestamps (stats logging off).
        """
        from vllm import SamplingParams

        sp = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        self.gen([p + self.fresh(1) for p in prefixes], sp)  # warm-up of the decode path
        out = []
        for _ in range(repeats):
            for o in self.gen([p + self.fresh(1) for p in prefixes], sp):
                m, n_out = o.metrics, len(o.outputs[0].token_ids)
                if m is None or not getattr(m, "last_token_ts", 0) or n_out < 2:
                    raise RuntimeError("vLLM returned no per-request timestamps; the engine needs disable_log_stats=False")
                out.append((m.last_token_ts - m.first_token_ts) / (n_out - 1))
        return out


def measure_in_engine(spec: dict) -> dict:
    """Inside the engine's child process: start the target's engine (no drafter) and time decode and n-token steps.

    ``spec``: ``engine`` (``engine_args``), ``concurrencies`` (sequences in flight),
    ``verify_tokens`` (the ``n`` of the n-token steps, 1 first), ``context_tokens`` (cached context per
    sequence, a multiple of the KV block size), ``repeats``, ``vocab_size``, ``seed``; optional ``decode_tokens``
    (output tokens per request of the decode measurement, ``DECODE_TOKENS`` where absent) and
    ``decode_lengths``: more output lengths (tokens) to time the decode step at, each concurrency then also gets
    ``decode_step_s_by_length`` (``{str(tokens): s}``; ``benchmarks/decode_step_ab.py``). Returns
    ``{"engine_start_s", "by_concurrency": {c: {"decode_step_s", "decode_step_s_min", "decode_step_s_max",
    "decode_step_s_second_pass", "forward_s": {n: s}, "cached_tokens_min": {n: int}}}}``, seconds as medians over
    the requests of ``repeats`` calls (min / max: over those requests; the second pass: the decode step timed
    again in the same engine after every concurrency's n-token steps, the engine's own repeatability).

    Raises:
        RuntimeError: the engine served no per-request timestamps (stats logging off), or a step's
            context was not served from the prefix cache (the timing would include the context).
    """
    from vllm import SamplingParams

    llm, start_s = measure.start_engine(spec["engine"])
    req = _Requests(llm, spec["vocab_size"], spec["seed"])
    one = SamplingParams(max_tokens=1, temperature=0.0)
    out: dict = {"engine_start_s": round(start_s, 2), "by_concurrency": {}}
    ctx, tokens = int(spec["context_tokens"]), int(spec.get("decode_tokens", DECODE_TOKENS))
    prefixes_by_c = {}
    for c in spec["concurrencies"]:
        prefixes = prefixes_by_c[c] = [req.fresh(ctx) for _ in range(c)]
        req.gen(prefixes, one)  # fills the prefix cache (and warms up)
        decode = req.decode_steps(prefixes, spec["repeats"], tokens)
        fwd, cached = {}, {}
        for n in spec["verify_tokens"]:
            req.gen([p + req.fresh(n) for p in prefixes], one)  # warm-up of this shape
            vals, hits = [], []
            for _ in range(spec["repeats"]):
                for o in req.gen([p + req.fresh(n) for p in prefixes], one):
                    vals.append(o.metrics.first_token_ts - o.metrics.scheduled_ts)
                    hits.append(int(o.num_cached_tokens or 0))
            if min(hits) < ctx:
                raise RuntimeError(f"n={n}, c={c}: only {min(hits)} of the {ctx} context tokens came from the prefix "
                                   "cache; the step timing would include the context (is prefix caching on, the KV "
                                   "cache large enough, context_tokens a multiple of the block size?)")
            fwd[str(n)] = statistics.median(vals)
            cached[str(n)] = min(hits)
        out["by_concurrency"][str(c)] = {"decode_step_s": statistics.median(decode), "decode_step_s_min": min(decode),
                                         "decode_step_s_max": max(decode), "forward_s": fwd,
                                         "cached_tokens_min": cached}
        if spec.get("decode_lengths"):
            out["by_concurrency"][str(c)]["decode_step_s_by_length"] = {
                str(t): statistics.median(req.decode_steps(prefixes, spec["repeats"], int(t)))
                for t in spec["decode_lengths"]}
        log.info("c=%d: decode step %.3f ms (requests %.3f-%.3f ms), n-token steps %s ms", c,
                 1e3 * statistics.median(decode), 1e3 * min(decode), 1e3 * max(decode),
                 {n: round(1e3 * v, 3) for n, v in fwd.items()})
    # the decode step again, after everything else in this engine: on the H200 the c = 1 decode step over 96 tokens
    # of the bundled target read 1.44 and 1.875 ms in two engines of the same shape (benchmarks/gpu/kimi_h200.md,
    # calls 16 and 18); a second pass tells an engine's drift within its life from the spread between instances
    for c, prefixes in prefixes_by_c.items():
        second = statistics.median(req.decode_steps(prefixes, spec["repeats"], tokens))
        out["by_concurrency"][str(c)]["decode_step_s_second_pass"] = second
        log.info("c=%d: decode step, second pass %.3f ms", c, 1e3 * second)
    return out


def measure_speculative_steps(spec: dict) -> dict:
    """Inside an engine child: serve the target with ``spec["speculative_config"]`` (an untrained EAGLE-3 head at
    one k) and time its steps at each concurrency as the benchmark does: time per output token (median over the
    requests of ``repeats`` calls of ``c`` requests with a ``context_tokens``-token context, ``decode_tokens``
    tokens each) x τ (1 + accepted / drafts, vLLM's spec-decode counters over those calls; EAGLE-3 paper).

    ``spec``: ``engine``, ``speculative_config``, ``concurrencies``, ``context_tokens``, ``repeats``,
    ``vocab_size``, ``seed``, optional ``decode_tokens`` (``DECODE_TOKENS`` where absent). Returns
    ``{"engine_start_s", "by_concurrency": {c: {"step_s", "tpot_s", "tau", "drafts", "tpot_s_min", "tpot_s_max",
    "tpot_s_second_pass"}}}`` (seconds; the second pass times the same concurrencies again in the same engine,
    after all of them: the engine's own repeatability).

    Raises:
        RuntimeError: no per-request timestamps, or the engine drafted nothing (the head did not run).
    """
    from vllm import SamplingParams

    from ..vllm.measure import counter_delta, spec_counters, spec_figures

    llm, start_s = measure.start_engine(spec["engine"], speculative_config=spec["speculative_config"])
    req = _Requests(llm, spec["vocab_size"], spec["seed"])
    tokens = int(spec.get("decode_tokens", DECODE_TOKENS))
    out: dict = {"engine_start_s": round(start_s, 2), "by_concurrency": {}}

    def cached(c: int) -> list[list[int]]:  # c fresh contexts, already in the prefix cache
        prefixes = [req.fresh(int(spec["context_tokens"])) for _ in range(c)]
        req.gen(prefixes, SamplingParams(max_tokens=1, temperature=0.0))
        return prefixes

    for c in spec["concurrencies"]:
        prefixes = cached(c)
        before = spec_counters(llm.get_metrics())
        tpots = req.decode_steps(prefixes, spec["repeats"], tokens)
        figs = spec_figures(counter_delta(spec_counters(llm.get_metrics()), before))
        if not figs["drafts"]:
            raise RuntimeError(f"c={c}: the engine drafted nothing with {spec['speculative_config']}")
        tau = figs["mean_acceptance_length"]  # over the warm-up call too: tau of random drafts is near 1 either way
        tpot = statistics.median(tpots)
        # the spread over requests and a second pass in the same engine (after the other concurrencies): on the
        # H200 the c = 1 step of one Kimi-shaped target read 5.78 ms and 9.23 on two machines, and 7.10 then 9.14
        # in the two passes of one engine (benchmarks/gpu/kimi_h200.md, calls 8-10)
        out["by_concurrency"][str(c)] = {"step_s": tpot * tau, "tpot_s": tpot, "tau": round(tau, 4),
                                         "drafts": figs["drafts"], "tpot_s_min": min(tpots), "tpot_s_max": max(tpots)}
        log.info("k=%d c=%d: speculative step %.3f ms (time per token %.3f ms x tau %.3f; requests %.3f-%.3f ms)",
                 spec["speculative_config"]["num_speculative_tokens"], c, 1e3 * tpot * tau, 1e3 * tpot, tau,
                 1e3 * min(tpots), 1e3 * max(tpots))
    for c in spec["concurrencies"]:
        out["by_concurrency"][str(c)]["tpot_s_second_pass"] = statistics.median(req.decode_steps(cached(c),
                                                                                                 spec["repeats"], tokens))
    return out


def draft_kv_bytes_per_token(head: Head, dtype_bytes: int, tensor_parallel_size: int = 1) -> int | None:
    """KV cache bytes one token takes in the draft ``head`` (a ``Head``) on one GPU
    (``target.kv_cache_bytes_per_token`` of its layer config: an MLA layer's latent ``kv_lora_rank +
    qk_rope_head_dim`` replicated on every rank; a llama layer's K and V of its KV heads on this rank), per draft
    layer times its layers; None where the config's attention is not one that function knows."""
    from types import SimpleNamespace

    return kv_cache_bytes_per_token(SimpleNamespace(**layer_config(head.config)), dtype_bytes, tensor_parallel_size)


@config_fields({
    "max_k": "preflight.max_k", "benchmark_ks": "benchmark.ks", "concurrencies": "preflight.concurrencies",
    "draft_vocab_size": "vocab.draft_vocab_size", "served_name": "target.served_name", "dtype": "target.serve_dtype",
    "context_tokens": "preflight.context_tokens", "repeats": "preflight.repeats",
    "trust_remote_code": "target.trust_remote_code", "pipeline_parallel_size": "target.pipeline_parallel_size",
    "decode_tokens": "benchmark.max_tokens",
})
class PreflightSettings:
    """What one pre-flight job measures (``preflight``): its files, its GPUs and the run's draft, and its config
    fields (``config.settings``: the config's ``preflight.*``, ``benchmark.*``, ``target.*`` and ``vocab.*`` keys it
    reads, below).

    ``target_dir``: the target's folder; ``out_json``: preflight.json; ``decisions_json``: the compat report's
    decisions (the head's aux layer ids and variant); ``gpus``: the job's GPUs (0 = vLLM's CPU backend); ``draft``:
    the run's draft (``choice.Draft``: its untrained heads are ``Draft.bound_drafts``). Of the config fields:
    ``max_k``: the largest k to tabulate (1..max_k, each verifying k+1 tokens), or ``"auto"``: the largest of
    ``benchmark_ks``, at which the whole step is measured (within 1..max_k; at max_k where none is);
    ``concurrencies``: sequences in flight; ``draft_vocab_size``: the head's draft vocab (tokens); ``dtype``: ``auto`` =
    bf16 on GPUs, fp32 on CPU; ``context_tokens``: cached context per sequence (rounded up to a multiple of 256, which
    every KV block size of vLLM divides); ``decode_tokens``: output tokens per request of the decode and
    speculative-step measurements, the length the benchmark's measured steps are checked at. The engines' sampling
    seed is ``SEED`` (greedy decoding: it picks nothing).
    """

    target_dir: str = job("params.target_dir")
    out_json: str = job("outputs.json")
    decisions_json: str = job("inputs.decisions")
    gpus: int = job("resources.gpu?", default=0)
    draft: Draft = job("params.draft", default_factory=resolve)  # a draft section (the job's ``draft`` param) becomes one

    @property
    def seed(self) -> int:
        return SEED

    def __post_init__(self) -> None:
        if isinstance(self.draft, Mapping):  # the draft section planning resolved (the job's ``draft`` param)
            object.__setattr__(self, "draft", resolve(self.draft))


def preflight(s: PreflightSettings) -> dict:
    """Measure the target's step costs alone (``measure_in_engine``, one engine) and with an untrained head
    (``measure_speculative_steps``, one engine per measured k), each in a child process, and write ``s.out_json``:
    settings, measurements, ``bound_table``'s rows, versions and hardware. ``s``: ``PreflightSettings``.

    The whole step is timed with an untrained head of each of ``s.draft.bound_drafts()`` (an EAGLE-3 head of
    ``draft.layer``, and of the default llama layer beside a layer of its own), the run's layer first: its steps and
    table are the result's ``speculative`` and ``table``; where more than one layer is timed, ``draft_layers`` gets
    each layer's ``{"speculative", "table", "draft_kv_bytes_per_token"}`` and ``settings`` its ``draft_layer``.

    Raises:
        engine_process.VLLMUnavailable: no importable vLLM.
        artifacts.ArtifactError: ``s.decisions_json`` is missing or does not match its schema.
        ValueError: ``max_k`` below 1 (or ``auto`` with no ``benchmark_ks``), an empty ``concurrencies``, a
            concurrency below 1, ``decode_tokens`` below 2, a draft vocab larger than the target's, or an MLA layer
            for a target without MLA (``head_model.build_model``).
        RuntimeError: an engine failed, a context missed the prefix cache (``measure_in_engine``), or the
            head drafted nothing (``measure_speculative_steps``).
    """
    import tempfile

    ks = list(range(1, (max(s.benchmark_ks, default=0) if s.max_k == "auto" else int(s.max_k)) + 1))
    concurrencies, decode_tokens = s.concurrencies, s.decode_tokens
    if not ks or not concurrencies or min(concurrencies) < 1:
        raise ValueError(f"preflight: ks {ks} and concurrencies {concurrencies} must be non-empty lists of integers >= 1")
    if decode_tokens < 2:
        raise ValueError(f"preflight: decode_tokens (benchmark.max_tokens) {decode_tokens} must be at least 2: a time per "
                         "output token needs two output tokens")
    drafts = s.draft.bound_drafts()
    measured_ks = sorted(set(s.benchmark_ks) & set(ks)) or [max(ks)]
    engine_process.require_vllm(needed_by=os.fspath(s.out_json))
    decisions = Decisions.load(s.decisions_json)
    ctx = -(-s.context_tokens // 256) * 256
    k_max, c_max = max(ks), max(concurrencies)
    max_len = ctx + decode_tokens + 16
    target_dir, served_name, trust_remote_code = s.target_dir, s.served_name, s.trust_remote_code

    def engine(k: int, verify_tokens: int) -> dict:
        # every prefix stays cached while the other requests come and go; graphs up to one step's tokens
        return engine_args(target_dir, gpus=s.gpus, served_name=served_name, max_model_len=max_len + k,
                           seed=s.seed, dtype=s.dtype, trust_remote_code=trust_remote_code,
                           max_num_seqs=c_max, kv_cache_tokens=3 * c_max * (max_len + k),
                           draft_layers=1 if k else 0, graph_batch_tokens=c_max * verify_tokens,
                           enable_prefix_caching=True, pipeline_parallel_size=s.pipeline_parallel_size)

    from ..target import load_config, text_config

    vocab = text_config(load_config(target_dir, trust_remote_code)).vocab_size
    common = {"concurrencies": sorted(set(concurrencies)), "context_tokens": ctx, "repeats": s.repeats,
              "vocab_size": vocab, "seed": s.seed, "decode_tokens": decode_tokens}
    eng = engine(0, k_max + 1)
    with tempfile.TemporaryDirectory(prefix="eagle3-preflight-") as tmp:
        measured = engine_process.run_child(
            ENTRY, {**common, "engine": eng, "verify_tokens": list(range(1, k_max + 2))}, tmp, "preflight")
        by_layer = {}
        for i, draft in enumerate(drafts):
            layer = draft.layer.name
            # the first layer's head and engine runs keep the names a one-layer pre-flight always had
            name = "" if i == 0 else f"-{layer}"
            head = write_untrained_head(target_dir, Path(tmp) / f"untrained-head{name}",
                                        aux_layer_ids=decisions.aux_layer_ids, draft_vocab_size=s.draft_vocab_size,
                                        head_variant=decisions.head_variant, served_name=served_name,
                                        dtype=eng["dtype"], trust_remote_code=trust_remote_code, seed=s.seed, draft=draft)
            speculative = {}
            for k in measured_ks:
                sc = head.speculative_config(k)
                speculative[str(k)] = engine_process.run_child(
                    SPEC_ENTRY, {**common, "engine": engine(k, k + 1), "speculative_config": sc}, tmp,
                    f"preflight{name.replace('-', '_')}_k{k}")
            by_layer[layer] = {"speculative": speculative, "table": bound_table(
                measured, {k: {c: v["step_s"] for c, v in r["by_concurrency"].items()} for k, r in speculative.items()},
                ks), "draft_kv_bytes_per_token": draft_kv_bytes_per_token(
                    head, 4 if eng["dtype"] == "float32" else 2, eng["tensor_parallel_size"])}
    speculative, rows = by_layer[drafts[0].layer.name]["speculative"], by_layer[drafts[0].layer.name]["table"]
    for layer, r in by_layer.items():
        if len(by_layer) > 1:
            log.info("draft layer %s: %s B of KV cache per token; per drafted token %s ms (c=%s)", layer,
                     r["draft_kv_bytes_per_token"], [row["draft_ms_per_token"] for row in r["table"] if row["k"] == 1],
                     common["concurrencies"])
    for r in rows:
        log.info("c=%d k=%d: step %.3f ms (%s) = %.2f decode steps (target alone %.2f): break-even tau %.2f, tau %.2f "
                 "for 1.5x%s", r["concurrency"], r["k"], r["step_ms"], r["step_source"], r["step_cost_ratio"],
                 r["target_verify_ratio"], r["tau_break_even"], r["tau_for_1_5x"],
                 "" if r["speedup_1_5x_reachable"] else " (unreachable)")
    result = {"schema": SCHEMA, "versions": software_versions(BENCHMARK_PACKAGES, keep_missing=False),
              "hardware": hardware(),
              "settings": {"ks": ks, "measured_ks": measured_ks, "concurrencies": common["concurrencies"],
                           "context_tokens": ctx, "repeats": s.repeats, "dtype": eng["dtype"],
                           "draft_vocab_size": s.draft_vocab_size, "aux_layer_ids": decisions.aux_layer_ids,
                           "head_variant": decisions.head_variant,
                           "tensor_parallel_size": eng["tensor_parallel_size"], "decode_tokens": decode_tokens},
              "target": {"dir_name": Path(target_dir).name, "served_name": served_name},
              "measured": {"engine_start_s": measured["engine_start_s"], "startup": measured.get("startup"),
                           "by_concurrency": measured["by_concurrency"]},
              "speculative": speculative,
              "table": rows}
    if len(by_layer) > 1:  # a pre-flight of one layer (llama) writes the file it always wrote
        result["settings"]["draft_layer"] = drafts[0].layer.name
        result["draft_layers"] = by_layer
    write_json(s.out_json, result)
    return result
