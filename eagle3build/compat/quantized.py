"""A quantized target's routes (issue 74), for the compat report (private to the compat subpackage): whether the
hooks route's load probe runs (``quantized_load_probes``), what each route said (``quantized_routes``) and whether the
vLLM here serves the scheme (``check_quantized_serving``)."""

from __future__ import annotations

import logging
from pathlib import Path

from .probes import Probe, probe_hooks_load, run_probe

log = logging.getLogger(__name__)


def quantization_config(target_dir: str) -> dict:
    """The target's ``quantization_config`` as its config.json has it (``formats.quantization``; ``{}`` for none)."""
    import json

    from ..formats.quantization import quantization_config as of

    return of(json.loads((Path(target_dir) / "config.json").read_text())) or {}


def quantized_load_probes(s, target: dict, aux_layer_ids: list[int] | None,
                          large_bytes: float = 80e9) -> tuple[dict[str, Probe], str | None]:
    """The hooks route's evidence for a quantized target (issue 74): probe ``hooks_quantized_load`` loads the target
    itself through transformers, as a capture would (``s``: the report's ``CompatSettings``). It is not run, and the
    reason returned, where the folder has no weight files (config only), where the target is large (above
    ``large_bytes``, compat_report's ``LARGE_TARGET_WEIGHT_BYTES``: captured by vLLM whatever this says,
    ``engine_capture_preferred``) or where its dense form (transformers decompresses it: parameters x 4 bytes in
    float32, 2 in 16 bits) would take more than half of this host's free memory (the first GPU's where one is
    visible, else RAM). Returns ``({name: probe}, None)`` or ``({}, why not)``."""
    import psutil
    import torch

    q = target["quantization"]
    weight = target["parameters"] * target["weight_bytes_per_parameter"]
    if q["weight_bytes_source"] != "files":
        return {}, "no weight files (a config-only folder)"
    if weight > large_bytes:
        return {}, f"a large target ({weight / 1e9:.0f} GB): vLLM captures it"
    cuda = torch.cuda.is_available()
    dense = target["parameters"] * (2 if cuda or s.compute_dtype in ("bfloat16", "float16") else 4)
    free = torch.cuda.mem_get_info()[0] if cuda else psutil.virtual_memory().available
    if dense > free / 2:
        return {}, (f"its dense form ({dense / 1e9:.1f} GB) would take more than half of this host's free "
                    f"{'GPU ' if cuda else ''}memory ({free / 1e9:.1f} GB)")
    p = run_probe("hooks_quantized_load", lambda: probe_hooks_load(s.target_dir, s.compute_dtype, s.trust_remote_code,
                                                                   aux_layer_ids), required=False)
    log.info("probe %-28s %-4s %6.2fs %s", p.name, p.status, p.seconds, p.error or "")
    return {"hooks_quantized_load": p}, None


def quantized_routes(probes: dict[str, Probe], hooks_not_run: str | None = None) -> dict:
    """What each route said of a quantized target: ``{"hooks": {"status", "error"}, "vllm": {...}}`` (``not run``
    with the reason where its probe was not run: ``hooks_not_run``, ``quantized_load_probes``'s)."""
    out = {}
    for route, name, why in (("hooks", "hooks_quantized_load", hooks_not_run or "not run"),
                             ("vllm", "vllm_capture_smoke", "vLLM not importable here, or serving elsewhere")):
        p = probes.get(name)
        out[route] = ({"status": "not run", "error": why} if p is None
                      else {"status": p.status, "error": p.error, "probe": name})
    return out


def check_quantized_serving(quant: dict, probes: dict[str, Probe], elsewhere: str | None = None) -> dict:
    """Whether the vLLM here serves a quantized target's scheme, as the benchmark and serve_config need: the smoke
    capture on a model quantized the same way (``probe_vllm_capture``). Without an importable vLLM (a training node)
    it passes with a note, as a dense target's build does, and so it does where the serving platform is not this host
    (``elsewhere``: why).

    Raises:
        ValueError: vLLM is importable but cannot load the scheme (one line: the scheme and vLLM's error).
    """
    smoke = probes.get("vllm_capture_smoke")
    if elsewhere:
        return {"scheme": quant["scheme"], "vllm": f"not probed: {elsewhere}"}
    if probes["vllm"].status == "fail" or smoke is None:
        return {"scheme": quant["scheme"], "vllm": "not importable here: the benchmark and serving run elsewhere"}
    if quant["method"] != "compressed-tensors":
        return {"scheme": quant["scheme"], "vllm": "not probed with the scheme (the probe's model stays dense for "
                f"method {quant['method']}): met when the capture or benchmark engine starts"}
    if smoke.status == "fail":
        raise ValueError(f"target quantized as {quant['scheme']!r}: this vLLM cannot serve it "
                         f"({(smoke.error or '').splitlines()[0][:400]}); the benchmark and serving need vLLM")
    return {"scheme": quant["scheme"], "vllm": "loads it (vllm_capture_smoke on a model quantized the same way)"}
