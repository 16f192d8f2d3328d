"""compat.md: the compat report rendered as Markdown for people (private to the compat subpackage).

Input: the report dict of ``compat_report.build_report`` (schema: schemas/compat.schema.json),
as built or as read back from compat.json.
"""

from __future__ import annotations

import json


def render_preflight(p: dict) -> list[str]:
    """compat.md's section for a preflight.json (``preflight_bound.preflight``'s result): per concurrency
    and k, the step's cost in baseline decode steps (measured, or estimated from the measured k) and the τ
    needed to break even and for 1.5x."""
    s = p["settings"]
    lines = ["", "## Pre-flight speed-up bound", "",
             f"Measured before training on {', '.join(p['hardware'].get('gpus') or [p['hardware']['processor']])} "
             f"({s['dtype']}, TP {s['tensor_parallel_size']}, {s['context_tokens']} cached context tokens per "
             f"sequence): the whole step with an untrained head at k = {', '.join(map(str, s['measured_ks']))}, "
             "estimated at the other k from the draft's measured share. tau above k + 1 cannot be reached.", "",
             "| concurrency | k | decode step ms | target verify / decode | draft ms/token | step / decode "
             "| tau to break even | tau for 1.5x |", "|---|---|---|---|---|---|---|---|"]
    for r in p["table"]:
        mark = "" if r["speedup_1_5x_reachable"] else " (unreachable)"
        lines.append(f"| {r['concurrency']} | {r['k']} | {r['decode_step_ms']:.3f} | {r['target_verify_ratio']:.2f} | "
                     f"{r['draft_ms_per_token']:.3f} | {r['step_cost_ratio']:.2f} {r['step_source']} | "
                     f"{r['tau_break_even']:.2f} | {r['tau_for_1_5x']:.2f}{mark} |")
    return lines


def render_markdown(r: dict, preflight: dict | None = None) -> str:
    """The human-readable compat.md (with ``preflight``, a preflight.json, its table)."""
    lines = ["# Compatibility report", ""]
    lines += ["## Versions", "", "| package | version |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r["versions"].items() if v]
    lines += ["", "## Probes", "", "| probe | status | required | seconds | detail |", "|---|---|---|---|---|"]
    for name, p in r["probes"].items():
        detail = p["error"] or "; ".join(p["warnings"])[:200] or json.dumps(p["value"], default=str)[:200]
        required = "yes" if p["required"] else "no"
        lines.append(f"| {name} | {p['status']} | {required} | {p['seconds']} | {detail.replace('|', '/')} |")
    t = r["target"]
    if t:
        lines += ["", "## Target", ""]
        lines += [f"- {k}: {v}" for k, v in t.items() if k != "quantization"]
    q = (t or {}).get("quantization")
    if q:  # issue 74: the scheme, its bytes and which routes load it
        lines += ["", "## Quantization", "", f"- scheme: **{q['scheme']}**",
                  f"- weights: {q['weight_bytes'] / 1e9:.3f} GB ("
                  + ("the weight files" if q["weight_bytes_source"] == "files" else "counted from the scheme: no weight "
                     "files") + f"), {8 * t['weight_bytes_per_parameter']:.2f} bits a parameter"]
        for g in q["groups"]:
            lines.append(f"- {g['name']}: {g['label']}; {g['type']} {g['bits']}-bit weights, {g['strategy']}"
                         + (f" of {g['group_size']}" if g.get("group_size") else "")
                         + f", symmetric {g['symmetric']}; targets {g['targets']}")
        lines.append(f"- left dense (ignore): {q['ignore']}")
        if q.get("quantized_modules") is not None:
            lines.append(f"- quantized layers in the files: {q['quantized_modules']}")
        for route, v in (r["capture"].get("quantized_routes") or {}).items():
            status = {"ok": "loads it", "warn": "loads it (with warnings: probe table)", "fail": "fail"}.get(
                v["status"], v["status"])
            lines.append(f"- {route} route: **{status}**" + (f": {v['error']}" if v.get("error") else ""))
    c = r["capture"]
    lines += ["", "## Capture", "", f"- backend: **{c['backend']}** (requested {c['requested']})"]
    lines += [f"- reason: {x}" for x in c["reasons"]]
    if c.get("vllm_capture_probe"):
        vp = c["vllm_capture_probe"]
        lines.append(f"- vLLM capture probe {'run' if vp['run'] else 'not run'}: {vp['why']}")
    if c.get("contradiction"):
        lines.append(f"- WARNING: {c['contradiction']}")
    if "aux_layer_ids" in c:
        rule = f": {c['aux_layer_ids_rule']}" if c.get("aux_layer_ids_rule") else ""
        lines += [f"- aux_layer_ids: {c['aux_layer_ids']} (recommended {c['recommended_aux_layer_ids']}{rule})",
                  f"- bytes per token ({c['storage_dtype']}, aux + last): {c['bytes_per_token']}"]
    v = r.get("vllm")
    if v:
        lines += ["", "## vLLM", "", f"- usable here: **{'yes' if v['usable'] else 'no'}**"
                  + (f" (vllm {v['version']})" if v.get("version") else "")]
        if v.get("warning"):
            lines.append(f"- WARNING: {v['warning']}")
    h, g = r.get("head"), r.get("given_head")
    if h or g:  # the run's head: trained here, or given (draft.head), its route named (issue 72)
        lines += ["", "## Head", ""]
        if g:
            lines += [f"- given (draft.head): {g['path']}, **{g['format']}** format: {g['route']}",
                      f"- {g['method']} head, {g['draft_layer']} draft layer, hidden size {g['hidden_size']}, target "
                      f"vocabulary {g['target_vocab_size']}, draft vocabulary {g['draft_vocab_size']}, aux layers "
                      f"{g['aux_layer_ids']}" + ("" if g["aux_layer_ids_named"] else " (none named: EAGLE-3's default)")
                      + ("" if g["has_embedding"] else "; no embedding of its own (vLLM shares the target's)")]
            if g.get("served_on"):
                lines.append(f"- trained on the target's {g.get('trained_on') or 'unrecorded'} form, served on its "
                             f"{g['served_on']} form" + (" (**differ**: measure τ on this form)"
                                                         if g.get("trained_on") not in (None, g["served_on"]) else ""))
        else:
            lines.append("- trained by this build (train_draft), exported in speculators' format (export_head)")
        if h:
            lines.append(f"- recommended variant: **{h['recommended_variant']}** ({h['reason']})")
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
        o = r["plans"].get("online_memory")
        if o:
            lines.append(f"- online training's GPU split: **{o['status']}**: {o['message']}")
    if preflight:
        lines += render_preflight(preflight)
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
