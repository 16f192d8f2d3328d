"""Every vLLM engine's arguments, parent side: what ``vllm.LLM(...)`` (and the OpenAI-compatible server's serve.yaml)
is given for a job, sized to it.

Every stage that serves the target through vLLM (export's load check, response regeneration, the benchmark and its
k schedule, the lossless check, the pre-flight bound, the vllm capture backend, the serving files) takes its engine's
arguments from ``engine_args``, so the parallelism, dtype and sizing rules live in one place:

- ``tensor_parallel_size`` is the number of GPUs the job holds (Snakemake's ``gpu`` resource; the cards themselves
  come from the GPU slot allocator, ``gpu_slots``, as the job's ``CUDA_VISIBLE_DEVICES``, which the engine's child
  process inherits). ``pipeline_parallel_size`` (config ``target.pipeline_parallel_size``) multiplies it for a target
  that does not fit one node's tensor-parallel group; vLLM then needs a Ray cluster spanning the nodes (vLLM docs,
  "Distributed inference and serving"). ``engine_layout`` is that pair; the planner shows it in each engine job's
  resources.
- dtype ``auto`` is bfloat16 on CUDA and float32 on CPU (vLLM's bf16 CPU kernel crashes on AMX hosts; eager mode on
  CPU, since torch.compile costs minutes per engine start there).
- The KV cache is sized to the job (``kv_cache_memory_bytes``) and the CUDA graphs to its batches (the benchmark's
  engines: one graph per decode step they run, ``decode_graph_sizes``; others: the largest,
  ``cudagraph_capture_size_at_least``); two engines of a small target may start side by side (``side_by_side``); a
  multimodal wrapper serves its language model only, an MLA target on CPU the reference MLA backend (and its MLA
  drafter too: ``drafter_config``).

The engine runs in a child process of its own (``engine_process``: ``run_child``, the parent watch, the server's
argv); what the child does with these arguments is ``measure`` (``start_engine``). Nothing here imports vLLM.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config.settings import declared


def engine_layout(gpus: int, pipeline_parallel_size: int) -> dict[str, int]:
    """How an engine on a job's ``gpus`` GPUs (0 = CPU) is laid out: ``{"tensor_parallel_size": gpus (1 on
    CPU), "pipeline_parallel_size": pipeline_parallel_size}`` (``target.pipeline_parallel_size``), vLLM's
    argument names. ``engine_args`` passes these to vLLM; the planner shows them in each engine job's resources
    (``workflow.plan.engine_layout_resources``), so the dry-run reads the layout from this one function.

    Raises:
        ValueError: ``pipeline_parallel_size`` < 1.
    """
    if pipeline_parallel_size < 1:
        raise ValueError(f"target.pipeline_parallel_size must be >= 1, got {pipeline_parallel_size}")
    return {"tensor_parallel_size": max(1, gpus), "pipeline_parallel_size": pipeline_parallel_size}


def config_json(folder: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` of ``folder`` (a target's, or a draft head's) as a dict; ``{}`` where it is missing, not
    JSON or not a JSON object (the engine then gets no argument that depends on it)."""
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def resolve_dtype(dtype: str, gpus: int) -> str:
    """``auto`` -> ``bfloat16`` on GPUs (``gpus > 0``), ``float32`` on CPU; other names pass through.

    Raises:
        ValueError: bfloat16/float16 asked for on CPU (vLLM's CPU bf16 kernel crashes on AMX hosts).
    """
    if dtype == "auto":
        return "bfloat16" if gpus > 0 else "float32"
    if gpus == 0 and dtype in ("bfloat16", "float16"):
        raise ValueError(f"vLLM dtype {dtype!r} on CPU: use float32 or auto (bf16 crashes vLLM's CPU kernels)")
    return dtype


# KV cache sized to the job, as a multiple of what its sequences can hold at once: block rounding
# (vLLM allocates whole blocks of 16+ tokens per sequence) and the scheduler's look-ahead fit in it.
KV_CACHE_MARGIN = 1.25
KV_CACHE_FLOOR_BYTES = 64 << 20


def engine_args(target_dir: str, *, gpus: int, served_name: str, max_model_len: int, seed: int,
                dtype: str = declared("target.serve_dtype"),
                pipeline_parallel_size: int = declared("target.pipeline_parallel_size"),
                trust_remote_code: bool = declared("target.trust_remote_code"),
                max_num_seqs: int | None = None, kv_cache_tokens: int | None = None, draft_layers: int = 0,
                eager: bool = False, graph_batch_tokens: int | None = None, graph_sizes: list[int] | None = None,
                **extra) -> dict:
    """Keyword arguments of ``vllm.LLM(...)`` for serving the target on the job's ``gpus`` GPUs.

    ``gpus``: GPUs the job holds (0 = CPU). Tensor parallel size = ``gpus`` (1 on CPU);
    ``pipeline_parallel_size`` stages of that size each. ``max_model_len`` in tokens. ``seed``: the engine's
    sampling seed, the calling stage's own (``benchmark.seed``, ``data.seed``; no default: no one key's).
    ``dtype``: ``resolve_dtype``'s. ``trust_remote_code``: the user's ``target.trust_remote_code`` (every engine
    gets it).

    Sizing to the job (GPU engines; on CPU the KV cache is ``VLLM_CPU_KVCACHE_SPACE`` and the
    engine is always eager): ``max_num_seqs`` sequences in flight; ``kv_cache_tokens`` tokens
    of KV cache -> ``kv_cache_memory_bytes`` (``target.kv_cache_bytes_per_token`` x tokens x
    ``KV_CACHE_MARGIN``, with ``draft_layers`` attention layers of a drafter counted beside
    the target's), instead of vLLM's default of 92 % of each card (127 GiB for a 135M target
    on an H200, most of a 138 s start); ``eager``: no torch.compile, no CUDA graphs and no
    FlashInfer autotuning (engines that run a few requests: a load check, a capture);
    otherwise ``graph_batch_tokens`` (the tokens of one decode step, sequences x (1 + k)) sets
    the largest CUDA-graph batch captured, ``max_cudagraph_capture_size``, rounded up to a size
    of vLLM's default list (``cudagraph_capture_size_at_least``): vLLM 0.26 truncates it down
    to that list, and at k = 2 a capture size of 3 became 2, so every 3-token verification step
    ran without a graph (80 instead of 600 tokens/s on an H200). ``graph_sizes`` instead (the benchmark's engines:
    ``decode_graph_sizes``): exactly these CUDA-graph batch sizes (tokens), vLLM's ``cudagraph_capture_sizes``, an
    engine argument of vLLM 0.26 and 0.32 (vllm/engine/arg_utils.py), which vLLM takes as given (deduplicated, sorted,
    less any above ``max_num_batched_tokens``: vllm/config/vllm.py ``_set_cudagraph_sizes``) and whose largest becomes
    ``max_cudagraph_capture_size``.
    ``extra`` is passed through (e.g. ``enable_prefix_caching=False``). The target's config.json is read once
    (``config_json``: an MLA target's CPU backend, a multimodal wrapper's ``language_model_only``), and its
    transformers config once more where the KV cache is sized (``kv_cache_memory_bytes``).

    Raises:
        ValueError: ``pipeline_parallel_size`` < 1, or a 16-bit dtype on CPU.
    """
    kw = {
        "model": os.path.abspath(target_dir),
        "tokenizer": os.path.abspath(target_dir),
        "served_model_name": served_name,
        "dtype": resolve_dtype(dtype, gpus),
        "max_model_len": max_model_len,
        "seed": seed,
        "disable_log_stats": False,
        **engine_layout(gpus, pipeline_parallel_size),
    }
    config = config_json(target_dir)  # read once: the MLA backend and language_model_only below
    if trust_remote_code:
        kw["trust_remote_code"] = True
    if max_num_seqs:
        kw["max_num_seqs"] = max_num_seqs
    if gpus == 0:
        # torch.compile adds ~3 min per engine start on 2 cores; the KV cache is sized by
        # VLLM_CPU_KVCACHE_SPACE (child_env), not by this fraction, on CPU.
        kw.update(enforce_eager=True, gpu_memory_utilization=0.5)
        if pipeline_parallel_size == 1:
            kw["distributed_executor_backend"] = CPU_EXECUTOR  # its engine core in the child itself: CPU_ENGINE_ENV
        if mla_config(config):
            # vLLM's CPU platform picks AMX_MLA for MLA wherever the CPU has AMX (vllm/platforms/cpu.py,
            # get_attn_backend_cls), and that backend refuses the float32 weights every CPU engine here has:
            # "expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8" (vllm-cpu 0.32,
            # v1/attention/backends/mla/amx_mla.py:303, process_weights_after_loading). CPU_MLA, the reference
            # backend, serves float32 (and an MLA draft beside it: drafter_config).
            kw["attention_backend"] = "CPU_MLA"
    else:
        if kv_cache_tokens:
            kv = kv_cache_memory_bytes(target_dir, kw["dtype"], max(1, gpus), kv_cache_tokens, draft_layers,
                                       trust_remote_code)
            if kv:
                kw["kv_cache_memory_bytes"] = kv
        if eager:
            kw.update(enforce_eager=True, enable_flashinfer_autotune=False)
        elif graph_sizes:
            kw["cudagraph_capture_sizes"] = sorted({int(n) for n in graph_sizes})
        elif graph_batch_tokens:
            kw["max_cudagraph_capture_size"] = cudagraph_capture_size_at_least(int(graph_batch_tokens))
    if pipeline_parallel_size > 1:
        kw["distributed_executor_backend"] = "ray"
    if multimodal_wrapper(config):
        kw["language_model_only"] = True
    kw.update(extra)
    return kw


# Config keys of a multimodal wrapper's towers (transformers' LLaVA, Qwen-VL, Kimi-K2.5 configs).
TOWER_CONFIG_KEYS = ("vision_config", "audio_config")


def multimodal_wrapper(config: Mapping[str, Any]) -> bool:
    """Whether a target's ``config.json`` (``config``, as ``config_json`` reads it) holds a vision or audio tower
    config (a multimodal wrapper around a text model, e.g. Kimi-K2.5's ``KimiK25ForConditionalGeneration``).

    Every engine here serves text, so such a target gets vLLM's ``language_model_only``
    (vllm/config/multimodal.py, ``MultiModalConfig``): the towers are neither built nor loaded
    (vllm/model_executor/models/interfaces.py, ``_mark_tower_model``), which saves their memory and
    lets a checkpoint without tower weights load.
    """
    return any(config.get(k) for k in TOWER_CONFIG_KEYS)


def mla_config(config: Mapping[str, Any]) -> bool:
    """Whether a model's ``config.json`` (``config``, as ``config_json`` reads it: a target's, or a draft head's) has
    multi-head latent attention: it (or its ``text_config``, a multimodal wrapper's) sets ``kv_lora_rank``
    (DeepSeek-V2/V3, Kimi-K2/K2.5, an MLA draft head)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return bool(text.get("kv_lora_rank"))


def drafter_config(engine: dict, speculative_config: dict) -> dict:
    """``speculative_config`` as the engine of ``engine`` (``engine_args``) serves it: a head with MLA (its
    ``model`` folder's config.json, ``mla_config``: an MLA draft head) gets the engine's ``attention_backend``
    where ``engine_args`` set one (CPU_MLA on CPU) and the config names none. vLLM selects a drafter's attention
    backend on its own, never the target's (vllm/v1/spec_decode/llm_base_proposer.py, "Never inherit the
    attention backend from base"), so on an AMX host the MLA drafter would get AMX_MLA and refuse its float32
    weights as the target's would. Not changed otherwise (``measure.start_engine`` applies it)."""
    sc = speculative_config
    if (engine.get("attention_backend") and "attention_backend" not in sc and sc.get("model")
            and mla_config(config_json(sc["model"]))):
        return {**sc, "attention_backend": engine["attention_backend"]}
    return sc


def cudagraph_capture_size_at_least(tokens: int) -> int:
    """The smallest size in vLLM's default CUDA-graph capture list that is >= ``tokens`` (a batch in tokens).

    The list (vllm/config/vllm.py, ``VllmConfig._set_cudagraph_sizes``, 0.26 to 0.33): 1, 2, 4, then
    multiples of 8 below 256, then multiples of 16. vLLM truncates ``max_cudagraph_capture_size``
    down to the list, so a batch between two sizes would run eager.

    Raises:
        ValueError: ``tokens`` < 1.
    """
    if tokens < 1:
        raise ValueError(f"a CUDA-graph batch holds at least 1 token, got {tokens}")
    if tokens <= 4:
        return 1 << (tokens - 1).bit_length()
    step = 8 if tokens < 256 else 16
    return -(-tokens // step) * step


# Up to this many CUDA graphs, an engine gets one for each decode step it can run (``decode_graph_sizes``); beyond, vLLM's
# grid of sizes up to its widest step. Capture is ~1 s for a handful of graphs of a 135M target on an H100 (its
# ``Graph capturing finished`` line, issue 70); a graph per in-flight count at 64 requests and k 3 would be 112 of them.
EXACT_GRAPH_SIZES = 32


def decode_graph_sizes(seqs: int, k: int = 0) -> list[int]:
    """The CUDA-graph batch sizes (tokens) of an engine that decodes with up to ``seqs`` sequences in flight and ``k``
    draft tokens: one size for each decode step it runs, where those are at most ``EXACT_GRAPH_SIZES``: with n of
    1..``seqs`` sequences in flight (the last requests of a batch finish one by one), the target's step takes n x
    (1 + k) tokens (each sequence's last token and its k drafts, verified in one forward) and a drafter's step n
    tokens; so ``[1, 4]`` at one request and k 3, ``[1]`` for the target alone. Beyond, vLLM's default grid (1, 2, 4,
    multiples of 8, then of 16: ``cudagraph_capture_size_at_least``) up to the widest step, the widest step itself
    included (a step between two sizes is padded up to the larger; the widest must be captured, or vLLM runs it
    eagerly: vllm #54933). Each step's size is a multiple of (1 + k) where vLLM 0.26's V2 runner captures its FULL
    decode graphs (vllm/v1/worker/gpu/cudagraph_utils.py, ``_init_candidates`` rounds each size up to the decode query
    length and drops those above ``max_num_seqs`` x it), so every step here has its graph.

    Raises:
        ValueError: ``seqs`` < 1 or ``k`` < 0.
    """
    if seqs < 1 or k < 0:
        raise ValueError(f"CUDA-graph sizes need at least one sequence and k >= 0, got {seqs} and {k}")
    exact = sorted({n * q for n in range(1, seqs + 1) for q in {1, 1 + k}})
    if len(exact) <= EXACT_GRAPH_SIZES:
        return exact
    widest = seqs * (1 + k)
    grid = [n for n in (1, 2, 4) if n < widest] + list(range(8, min(widest, 256), 8)) + list(range(256, widest, 16))
    return sorted({*grid, widest})


def kv_cache_memory_bytes(target_dir: str, dtype: str, tensor_parallel_size: int, tokens: int, draft_layers: int = 0,
                          trust_remote_code: bool = declared("target.trust_remote_code")) -> int | None:
    """KV cache bytes per GPU that hold ``tokens`` tokens of the target (and ``draft_layers`` drafter layers):
    ``target.kv_cache_bytes_per_token`` x ``tokens`` x ``KV_CACHE_MARGIN``, at least ``KV_CACHE_FLOOR_BYTES``.
    None where the target's config cannot be read or its attention is not one that function knows
    (the engine then keeps vLLM's default, a fraction of the card)."""
    from ..target import kv_cache_bytes_per_token, load_config, text_config

    try:
        cfg = text_config(load_config(target_dir, trust_remote_code))
    except Exception as e:  # noqa: BLE001 - any unreadable config means: keep vLLM's own sizing
        logging.getLogger(__name__).warning("KV cache left to vLLM's default: %s: %s", type(e).__name__, e)
        return None
    per_token = kv_cache_bytes_per_token(cfg, 4 if dtype == "float32" else 2, tensor_parallel_size, draft_layers)
    if per_token is None:
        return None
    return max(KV_CACHE_FLOOR_BYTES, int(per_token * tokens * KV_CACHE_MARGIN))


# Engines started side by side on a card (``engine_process.run_side_by_side``): each may start only where this share of
# the card is free (vLLM's ``gpu_memory_utilization``, which an engine whose KV cache is sized in bytes uses for that
# check alone: vllm/v1/worker/utils.py ``request_memory``; not in the compile cache's hash, vllm/config/cache.py), and
# only targets of at most SIDE_BY_SIDE_MAX_WEIGHT_BYTES of weights per GPU are started so: two engines of such a target,
# their KV caches and ~2 GiB each of context, activations and graphs leave 40 % of a 40 GB card free.
SIDE_BY_SIDE_UTILIZATION = 0.4
SIDE_BY_SIDE_MAX_WEIGHT_BYTES = 8 << 30
SIDE_BY_SIDE = 2  # engines started at once: the baseline beside the first head's run, then two by two


def side_by_side(engines: list[dict], target_dir: str | os.PathLike) -> list[dict] | None:
    """``engines`` (``engine_args``'s, of one target) as they start side by side (``engine_process.run_side_by_side``),
    or None where they should not. On CPU (vLLM's KV cache there: ``VLLM_CPU_KVCACHE_SPACE`` each) as given; on GPUs
    only where each has its KV cache sized in bytes (``kv_cache_memory_bytes``), one pipeline stage, and the target's
    weights per GPU (its weight files' bytes over the tensor-parallel size) are at most
    ``SIDE_BY_SIDE_MAX_WEIGHT_BYTES``, each then with ``gpu_memory_utilization`` ``SIDE_BY_SIDE_UTILIZATION``."""
    from ..formats.target_files import weight_files

    if any(e.get("pipeline_parallel_size") not in (None, 1) for e in engines):  # absent: one stage
        return None
    if all(e.get("distributed_executor_backend") == CPU_EXECUTOR for e in engines):
        return engines
    if not all(e.get("kv_cache_memory_bytes") for e in engines):
        return None
    tp = max(e.get("tensor_parallel_size", 1) for e in engines)
    if sum(os.path.getsize(f) for f in weight_files(target_dir)) / tp > SIDE_BY_SIDE_MAX_WEIGHT_BYTES:
        return None
    return [{**e, "gpu_memory_utilization": SIDE_BY_SIDE_UTILIZATION} for e in engines]


# A CPU engine of one stage: vLLM's engine core runs in the engine's child process itself (vllm/envs.py
# VLLM_ENABLE_V1_MULTIPROCESSING=0, applied by ``measure.start_engine``), its worker in a process of its own
# (``engine_args``: ``distributed_executor_backend`` CPU_EXECUTOR; without it vLLM would run the worker in-process too).
# vllm-cpu 0.32 otherwise spawns an engine-core process that imports torch and vLLM again: a bundled-target engine
# with a head took 27.1 s from import to exit against 19.9 s, and decoded 128 tokens in 8.5 s against 8.3 s beside a
# busy core (measured here, 2026-12-06). The worker stays apart: in the caller's process its OpenMP threads, bound to
# the cores, decoded at 1.45 against 19.9 tokens/s beside another test process, and a Kimi-K2.5 wrapper's processor
# (numba) broke vllm-cpu's kernel rebinding there (vllm/triton_utils/dispatcher.py, ``_rebind_kernels``).
CPU_EXECUTOR = "mp"
CPU_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def engine_core_in_process(engine: dict) -> bool:
    """Whether ``engine`` (``engine_args``) is a CPU engine of one stage, whose engine core runs in its child."""
    one_stage = engine.get("pipeline_parallel_size") in (None, 1)  # absent: vLLM's one stage
    return engine.get("distributed_executor_backend") == CPU_EXECUTOR and one_stage



def engine_arg_declared(name: str) -> bool:
    """Whether the installed vLLM's ``EngineArgs`` declares the field ``name`` (e.g.
    ``per_request_spec_decode_metrics``, vllm-cpu 0.32 and vLLM 0.33; not vLLM 0.26), read from the source of
    vllm/engine/arg_utils.py without importing vLLM (an import takes 10-20 s on 2 cores). False where vLLM is not
    installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    src = Path(list(spec.submodule_search_locations)[0]) / "engine" / "arg_utils.py"
    try:
        text = src.read_text()
    except OSError:
        return False
    return re.search(rf"^\s+{re.escape(name)}\s*:", text, re.M) is not None
