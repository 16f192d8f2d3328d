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
- ``T_draft(c)``: the draft head's cost per drafted token, *estimated*: one forward of a stand-in of the
  head (speculators' layer config for this target: ``fc`` 3H -> H, one decoder layer over 2H inputs with
  attention over the context, the norm, ``lm_head`` H -> draft vocab) for ``c`` tokens, timed in PyTorch
  eager on the same device. vLLM's drafter runs it with CUDA graphs and adds its own bookkeeping.

Per k and c the table holds ``step_cost_ratio = (T_verify(k, c) + k T_draft(c)) / T_decode(c)``, the τ
to break even (= that ratio: S = 1) and the τ for 1.5x (1.5 x the ratio), each reachable only where
it is at most k + 1 (τ cannot exceed k + 1), and ``target_verify_ratio = T_verify / T_decode`` (the
target alone: the curve that rises for an MoE; ``step_costs.bound_table``). The benchmark compares its
measured steps with it (``step_costs.compare_benchmark``).
"""
from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import vllm_engine
from ..atomic import write_json
from ..contract import StageSettings
from ..provenance import BENCHMARK_PACKAGES, hardware, software_versions
from ..step_costs import bound_table

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes.
OUTPUT_VERSION = 1
SCHEMA = "eagle3build.preflight/1"
ENTRY = "eagle3build.compat.preflight_bound:measure_in_engine"
DECODE_TOKENS = 32  # output tokens per request of the plain-decoding measurement


def measure_in_engine(spec: dict) -> dict:
    """Inside the engine's child process: start the target's engine and time decode and n-token steps.

    ``spec``: ``engine`` (``vllm_engine.engine_args``), ``concurrencies`` (sequences in flight),
    ``verify_tokens`` (the ``n`` of the n-token steps, 1 first), ``context_tokens`` (cached context per
    sequence, a multiple of the KV block size), ``repeats``, ``vocab_size``, ``seed``. Returns
    ``{"engine_start_s", "by_concurrency": {c: {"decode_step_s", "forward_s": {n: s}, "cached_tokens_min":
    {n: int}}}}``, seconds as medians over the requests of ``repeats`` calls.

    Raises:
        RuntimeError: the engine served no per-request timestamps (stats logging off), or a step's
            context was not served from the prefix cache (the timing would include the context).
    """
    import numpy as np
    from vllm import SamplingParams

    llm, start_s = vllm_engine.start_engine(spec["engine"])
    rng = np.random.default_rng(spec.get("seed", 0))
    lo, hi = 100, max(101, min(int(spec["vocab_size"]), 30000))  # ordinary token ids, no special tokens

    def fresh(n: int) -> list[int]:
        return rng.integers(lo, hi, n).tolist()

    def gen(prompts: list[list[int]], sp):
        return llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)

    one = SamplingParams(max_tokens=1, temperature=0.0)
    out: dict = {"engine_start_s": round(start_s, 2), "by_concurrency": {}}
    ctx = int(spec["context_tokens"])
    for c in spec["concurrencies"]:
        prefixes = [fresh(ctx) for _ in range(c)]
        gen(prefixes, one)  # fills the prefix cache (and warms up)
        decode = []
        dsp = SamplingParams(max_tokens=DECODE_TOKENS, temperature=0.0, ignore_eos=True)
        gen([p + fresh(1) for p in prefixes], dsp)  # warm-up of the decode path
        for _ in range(spec["repeats"]):
            for o in gen([p + fresh(1) for p in prefixes], dsp):
                m = o.metrics
                n_out = len(o.outputs[0].token_ids)
                if m is None or not getattr(m, "last_token_ts", 0) or n_out < 2:
                    raise RuntimeError("vLLM returned no per-request timestamps; the engine needs disable_log_stats=False")
                decode.append((m.last_token_ts - m.first_token_ts) / (n_out - 1))
        fwd, cached = {}, {}
        for n in spec["verify_tokens"]:
            gen([p + fresh(n) for p in prefixes], one)  # warm-up of this shape
            vals, hits = [], []
            for _ in range(spec["repeats"]):
                for o in gen([p + fresh(n) for p in prefixes], one):
                    vals.append(o.metrics.first_token_ts - o.metrics.scheduled_ts)
                    hits.append(int(o.num_cached_tokens or 0))
            if min(hits) < ctx:
                raise RuntimeError(f"n={n}, c={c}: only {min(hits)} of the {ctx} context tokens came from the prefix "
                                   "cache; the step timing would include the context (is prefix caching on, the KV "
                                   "cache large enough, context_tokens a multiple of the block size?)")
            fwd[str(n)] = statistics.median(vals)
            cached[str(n)] = min(hits)
        out["by_concurrency"][str(c)] = {"decode_step_s": statistics.median(decode), "forward_s": fwd,
                                         "cached_tokens_min": cached}
        log.info("c=%d: decode step %.3f ms, n-token steps %s ms", c, 1e3 * statistics.median(decode),
                 {n: round(1e3 * v, 3) for n, v in fwd.items()})
    return out


def draft_step_seconds(layer: dict, draft_vocab_size: int, batch: int, context_tokens: int, device: str,
                       dtype: str, repeats: int = 20) -> float:
    """Estimated seconds of one draft step for ``batch`` sequences: a stand-in of the EAGLE-3 head's forward
    (EAGLE-3, arXiv 2503.01840 §3: ``fc`` 3H -> H, one decoder layer whose q/k/v read [embedding, fused] = 2H,
    attention over ``context_tokens`` cached tokens, SiLU MLP, final norm, ``lm_head`` H -> ``draft_vocab_size``),
    timed in PyTorch eager on ``device`` (median of ``repeats`` after a warm-up).

    ``layer``: the head's layer shapes ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``,
    ``head_dim``, ``intermediate_size`` (speculators' ``create_transformer_layer_config`` for the target).
    ``dtype``: ``bfloat16`` | ``float16`` | ``float32``. Random weights: only the cost counts.
    """
    import torch
    import torch.nn.functional as F

    dt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    h, nh, nkv = layer["hidden_size"], layer["num_attention_heads"], layer["num_key_value_heads"]
    hd, inter = layer["head_dim"], layer["intermediate_size"]
    g = torch.Generator(device).manual_seed(0)

    def w(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dt) * 0.02

    fc, qkv, o = w(h, 3 * h), w((nh + 2 * nkv) * hd, 2 * h), w(h, nh * hd)
    gate_up, down, head = w(2 * inter, h), w(h, inter), w(draft_vocab_size, h)
    kc, vc = w(batch, nkv, context_tokens, hd), w(batch, nkv, context_tokens, hd)
    aux, emb = w(batch, 3 * h), w(batch, h)

    def step():
        fused = F.rms_norm(aux @ fc.T, (h,))
        x = torch.cat([F.rms_norm(emb, (h,)), fused], dim=-1)
        q, k, v = (x @ qkv.T).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        q = q.view(batch, nh, 1, hd)
        k = torch.cat([kc, k.view(batch, nkv, 1, hd)], dim=2)
        v = torch.cat([vc, v.view(batch, nkv, 1, hd)], dim=2)
        a = F.scaled_dot_product_attention(q, k, v, enable_gqa=nh != nkv).reshape(batch, nh * hd)
        hs = fused + a @ o.T
        gu = F.rms_norm(hs, (h,)) @ gate_up.T
        hs = hs + (F.silu(gu[:, :inter]) * gu[:, inter:]) @ down.T
        return (F.rms_norm(hs, (h,)) @ head.T).argmax(-1)

    cuda = device.startswith("cuda")
    with torch.inference_mode():
        for _ in range(3):
            step()
        times = []
        for _ in range(repeats):
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def head_layer_shapes(target_dir: str, trust_remote_code: bool = False) -> dict:
    """The draft layer's shapes for ``target_dir`` as the trainer builds it (speculators'
    ``create_transformer_layer_config``, speculators/train/cli.py, one llama layer)."""
    from speculators.train.cli import create_transformer_layer_config

    tl = create_transformer_layer_config(verifier_name_or_path=target_dir, num_layers=1, draft_arch="llama",
                                         hidden_act=None, sliding_window=1, full_attention_indices=[0],
                                         mrope_full_head_hack=True, trust_remote_code=trust_remote_code)
    head_dim = getattr(tl, "head_dim", None) or tl.hidden_size // tl.num_attention_heads
    return {"hidden_size": tl.hidden_size, "num_attention_heads": tl.num_attention_heads,
            "num_key_value_heads": tl.num_key_value_heads or tl.num_attention_heads, "head_dim": head_dim,
            "intermediate_size": tl.intermediate_size}


def preflight(target_dir: str, out_json: str, *, max_k: int | str, benchmark_ks: list[int], concurrencies: list[int],
              draft_vocab_size: int, served_name: str, dtype: str = "auto", gpus: int = 0,
              context_tokens: int = 256, repeats: int = 5, seed: int = 0, trust_remote_code: bool = False,
              pipeline_parallel_size: int = 1) -> dict:
    """Measure the target's step costs (``measure_in_engine`` in a child process, one engine), estimate the
    draft's (``draft_step_seconds``), and write ``out_json``: settings, measurements, the head's layer
    shapes, ``bound_table``'s rows, versions and hardware.

    ``max_k``: the largest k to tabulate (1..max_k, each verifying k+1 tokens), or ``"auto"``: the largest
    of ``benchmark_ks`` (the config's ``preflight.max_k`` and ``benchmark.ks``); ``concurrencies``: sequences
    in flight; ``gpus``: the job's GPUs (0 = vLLM's CPU backend); ``dtype``: the engine's (``auto`` = bf16 on GPUs, fp32 on CPU);
    ``context_tokens``: cached context per sequence (rounded up to a multiple of 256, which every KV
    block size of vLLM divides).

    Raises:
        vllm_engine.VLLMUnavailable: no importable vLLM.
        ValueError: ``max_k`` below 1 (or ``auto`` with no ``benchmark_ks``), an empty ``concurrencies``, or a
            concurrency below 1.
        RuntimeError: the engine failed, or a context missed the prefix cache (``measure_in_engine``).
    """
    import tempfile

    ks = list(range(1, (max(benchmark_ks, default=0) if max_k == "auto" else int(max_k)) + 1))
    if not ks or not concurrencies or min(ks) < 1 or min(concurrencies) < 1:
        raise ValueError(f"preflight: ks {ks} and concurrencies {concurrencies} must be non-empty lists of integers >= 1")
    vllm_engine.require_vllm(needed_by=os.fspath(out_json))
    ctx = -(-context_tokens // 256) * 256
    k_max, c_max = max(ks), max(concurrencies)
    eng = vllm_engine.engine_args(target_dir, gpus=gpus, served_name=served_name, max_model_len=ctx + DECODE_TOKENS + 16,
                                  seed=seed, dtype=dtype, trust_remote_code=trust_remote_code, max_num_seqs=c_max,
                                  # every prefix stays cached while the other requests come and go
                                  kv_cache_tokens=3 * c_max * (ctx + DECODE_TOKENS + 16),
                                  graph_batch_tokens=c_max * (k_max + 1), enable_prefix_caching=True,
                                  pipeline_parallel_size=pipeline_parallel_size)
    from ..target import load_config, text_config

    vocab = text_config(load_config(target_dir, trust_remote_code)).vocab_size
    spec = {"engine": eng, "concurrencies": sorted(set(concurrencies)), "verify_tokens": list(range(1, k_max + 2)),
            "context_tokens": ctx, "repeats": repeats, "vocab_size": vocab, "seed": seed}
    with tempfile.TemporaryDirectory(prefix="eagle3-preflight-") as tmp:
        measured = vllm_engine.run_child(ENTRY, spec, tmp, "preflight")
    layer = head_layer_shapes(target_dir, trust_remote_code)
    device = "cuda" if gpus > 0 else "cpu"
    draft = {str(c): draft_step_seconds(layer, draft_vocab_size, c, ctx, device, eng["dtype"])
             for c in spec["concurrencies"]}
    rows = bound_table(measured, draft, sorted(set(ks)))
    for r in rows:
        log.info("c=%d k=%d: step %.3f ms = %.2f decode steps (target alone %.2f): break-even tau %.2f, tau %.2f "
                 "for 1.5x%s", r["concurrency"], r["k"], r["step_ms"], r["step_cost_ratio"], r["target_verify_ratio"],
                 r["tau_break_even"], r["tau_for_1_5x"], "" if r["speedup_1_5x_reachable"] else " (unreachable)")
    result = {"schema": SCHEMA, "versions": software_versions(BENCHMARK_PACKAGES, keep_missing=False),
              "hardware": hardware(),
              "settings": {"ks": sorted(set(ks)), "concurrencies": spec["concurrencies"], "context_tokens": ctx,
                           "repeats": repeats, "dtype": eng["dtype"], "draft_vocab_size": draft_vocab_size,
                           "tensor_parallel_size": eng["tensor_parallel_size"], "decode_tokens": DECODE_TOKENS},
              "target": {"dir_name": Path(target_dir).name, "served_name": served_name},
              "head_layer": layer, "draft_estimate": {"method": "pytorch eager stand-in", "seconds_per_token": draft},
              "measured": {"engine_start_s": measured["engine_start_s"], "startup": measured.get("startup"),
                           "by_concurrency": measured["by_concurrency"]},
              "table": rows}
    write_json(out_json, result)
    return result


def run_job(inputs: Mapping[str, Any], outputs: Mapping[str, str], settings: StageSettings,
            params: Mapping[str, Any], resources: Mapping[str, Any]) -> dict:
    """Rule ``preflight_bound``'s entry (``eagle3build.job.run_stage``): ``preflight`` on the job's
    ``resources["gpu"]`` GPUs into ``outputs["json"]``, with the job's settings. ``inputs``: ``target`` (its files)
    and ``decisions`` (the compat report's decisions.json). Returns what ``preflight`` returns and raises what
    it raises."""
    s = settings
    return preflight(
        target_dir=params["target_dir"], out_json=outputs["json"], max_k=s["preflight.max_k"],
        benchmark_ks=s["benchmark.ks"], concurrencies=s["preflight.concurrencies"],
        draft_vocab_size=s["vocab.draft_vocab_size"], served_name=s["target.served_name"], dtype=s["target.serve_dtype"],
        gpus=resources.get("gpu", 0), context_tokens=s["preflight.context_tokens"], repeats=s["preflight.repeats"],
        trust_remote_code=s["target.trust_remote_code"], pipeline_parallel_size=s["target.pipeline_parallel_size"])
