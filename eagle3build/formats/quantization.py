"""A quantized target's checkpoint: what its ``quantization_config`` says, what its weights take on disk, and how a
dense checkpoint is made into one (compressed-tensors, the format vLLM and transformers load natively).

- ``describe``: the scheme of a config.json (method, format, per group bits, type, strategy, group size, targets,
  activations; the ignore list; a short name such as ``W4A16 int4 g64``), read by the compat report, planning and the
  capture's shard metadata.
- ``weight_bytes``: the bytes the target's weights take: the weight files' sizes where they exist, else counted per
  parameter from the scheme (quantized Linear weights at their bits plus one 16-bit scale per group, the rest at the
  config's dtype): a config-only folder (examples/targets/kimi-k2.5-shape) is planned with its real bytes.
- ``quantize`` / ``quantize_tensors``: round-to-nearest quantization of a dense checkpoint by compressed-tensors itself
  (``apply_quantization_config``, ``calculate_qparams``, ``ModelCompressor.compress_model``); the test targets
  (examples/targets/quantize_target.py) and the compat report's load probes are made with it.

compressed-tensors' config (compressed_tensors/quantization/quant_config.py): ``quant_method``
``compressed-tensors``, ``format`` (``pack-quantized``: INT4 packed 8 to an int32; ``float-quantized``: FP8),
``config_groups`` (each a ``QuantizationScheme``: ``targets``, ``weights`` and ``input_activations`` as
``QuantizationArgs``) and ``ignore`` (module names or ``re:`` patterns left dense).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

# Quantization methods a route here can read: compressed-tensors (vLLM natively; transformers through the
# compressed-tensors package) and vLLM's and transformers' own ``fp8``. Another ``quant_method`` (gptq, awq,
# bitsandbytes, gguf, ...) is refused at planning (``refusal``): neither capture route has been shown to load it.
READABLE_METHODS = ("compressed-tensors", "fp8")

# Kimi-K2-Thinking's and Kimi-K2.5's quantization ignore list (their config.json, quantization_config.ignore): the
# routed experts in INT4 (group 32), attention, shared experts, the dense first layer's MLP and lm_head in bf16.
KIMI_IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*"]
# The schemes examples/targets/quantize_target.py makes: compressed-tensors' presets
# (compressed_tensors/quantization/quant_scheme.py) on every Linear but the ignored.
SCHEMES: dict[str, dict[str, Any]] = {
    "w4a16": {"preset": "W4A16", "group_size": 128, "ignore": ["lm_head", "re:.*lm_head"]},
    "fp8": {"preset": "FP8_DYNAMIC", "group_size": None, "ignore": ["lm_head", "re:.*lm_head"]},
    # + the multimodal wrapper's vision tower and projector, left in bf16 (K2.5's wrapper; no weights here)
    "kimi-int4": {"preset": "W4A16", "group_size": 32,
                  "ignore": KIMI_IGNORE + ["re:.*lm_head", "re:.*vision_tower.*", "re:.*mm_projector.*"]},
}
# A checkpoint tensor that is a Linear layer's weight (``*_proj.weight``, ``lm_head.weight``): what quantize_tensors
# may quantize. transformers 5 fuses a MoE's experts into 3-D parameters (no Linear per expert) while the
# checkpoint and vLLM keep one per expert, so the checkpoint's names, not the transformers model, are matched.
LINEAR_WEIGHT = re.compile(r"(^|.*\.)([a-z0-9_]*_proj|lm_head)\.weight$")
SHARD_BYTES = 5 << 30
DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "float8_e4m3fn": 1.0}


def quantization_config(config: dict) -> dict | None:
    """The ``quantization_config`` of a config.json dict (top level, else its ``text_config``'s), or None."""
    q = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")
    return q if isinstance(q, dict) else None


def _group_name(g: dict) -> str:
    w, a = g.get("weights") or {}, g.get("input_activations") or {}
    bits = w.get("num_bits")
    wtype = "fp" if w.get("type") == "float" else "int"
    name = f"W{bits}A{a.get('num_bits') or 16}" + (f" {wtype}{bits}" if bits else "")
    if w.get("strategy") == "group" and w.get("group_size"):
        name += f" g{w['group_size']}"
    elif w.get("strategy"):
        name += f" per-{w['strategy']}"
    if a:
        name += " dynamic activations" if a.get("dynamic") else " static activations"
    return name


def describe(config: dict) -> dict | None:
    """What a config.json dict (``config``) says of its quantization: None for a dense target, else ``{"method",
    "format", "scheme", "groups": [{"name", "bits", "type", "strategy", "group_size", "symmetric", "targets",
    "activation_bits", "dynamic_activations"}], "ignore"}``. ``scheme`` is a short name, e.g.
    ``compressed-tensors pack-quantized W4A16 int4 g64`` or ``fp8``: compressed-tensors' fields as
    compressed_tensors/quantization/quant_config.py defines them; another method's config gives its method alone
    (and ``bits`` where it names them)."""
    q = quantization_config(config)
    if q is None:
        return None
    method = str(q.get("quant_method") or "unknown")
    groups = []
    for name, g in sorted((q.get("config_groups") or {}).items()):
        w, a = g.get("weights") or {}, g.get("input_activations") or None
        groups.append({"name": name, "bits": w.get("num_bits"), "type": w.get("type"), "strategy": w.get("strategy"),
                       "group_size": w.get("group_size"), "symmetric": w.get("symmetric"),
                       "targets": list(g.get("targets") or []),
                       "activation_bits": (a or {}).get("num_bits"), "dynamic_activations": (a or {}).get("dynamic"),
                       "label": _group_name(g)})
    fmt = q.get("format")
    scheme = " ".join(x for x in (method, fmt, "; ".join(g["label"] for g in groups)) if x)
    if not groups and (q.get("bits") or q.get("weight_bits")):
        scheme += f" {q.get('bits') or q.get('weight_bits')}-bit"
    return {"method": method, "format": fmt, "scheme": scheme, "groups": groups, "ignore": list(q.get("ignore") or [])}


def refusal(config: dict, where: str) -> str | None:
    """Why no capture route here can read the target of config.json dict ``config`` (``where``: the config key
    naming it, for the message), in one line naming the scheme; None where its method is one of ``READABLE_METHODS``
    (or it is dense). Planning asks it (``workflow.plan``); the compat report's load probes then decide between the routes."""
    d = describe(config)
    if d is None or d["method"] in READABLE_METHODS:
        return None
    return (f"{where}: config.json's quantization_config is {d['scheme']!r}; this build reads "
            f"{', '.join(READABLE_METHODS)} checkpoints (vLLM natively, transformers through compressed-tensors): "
            "re-quantize it with llmcompressor or point target.path at its dense or compressed-tensors form")


def _ignored(name: str, ignore: list[str]) -> bool:
    """compressed-tensors' rule for one module name against an ignore list: an exact name, or a ``re:`` pattern
    matched from the start (compressed_tensors/utils/match.py ``is_match``)."""
    for pat in ignore:
        if pat.startswith("re:"):
            if re.match(pat[3:], name):
                return True
        elif name == pat or name.endswith("." + pat):
            return True
    return False


def weight_bytes(config: dict, named_params, dtype_bytes: float | None = None) -> int:
    """The bytes the target's weights take on disk, counted from its config and parameters (no file read).

    ``named_params``: ``(name, shape, is_linear_weight)`` of every parameter of the target as instantiated (on the
    meta device); a parameter is quantized where the scheme (``describe``) targets ``Linear``, it is a Linear
    weight or a fused experts' 3-D weight, and its module is not ignored: ``bits / 8`` bytes an element plus a 16-bit
    scale per group (per output channel for channel-wise, one per tensor otherwise). Every other parameter takes
    ``dtype_bytes`` (default: the config's dtype, 2 bytes for 16-bit). The checkpoint's weight files are what
    ``on_disk_bytes`` reads where they exist; this is the plan for a config-only folder.
    """
    dt = dtype_bytes or DTYPE_BYTES.get(str(config.get("dtype") or config.get("torch_dtype")
                                            or (config.get("text_config") or {}).get("dtype") or "bfloat16"), 2.0)
    d = describe(config)
    linear_groups = [g for g in (d or {}).get("groups", []) if "Linear" in g["targets"] and g["bits"]]
    total = 0.0
    for name, shape, is_linear in named_params:
        n = 1
        for s in shape:
            n *= s
        module = name.rsplit(".", 1)[0]
        if linear_groups and is_linear and not _ignored(module, d["ignore"]) and not _ignored(name, d["ignore"]):
            g = linear_groups[0]
            rows = n // shape[-1]
            scales = (n // g["group_size"] if g["strategy"] == "group" and g["group_size"]
                      else rows if g["strategy"] == "channel" else 1)
            total += n * g["bits"] / 8 + scales * 2
        elif d and not linear_groups and d["method"] == "fp8" and is_linear:
            total += n
        else:
            total += n * dt
    return int(total)


def on_disk_bytes(files: list[str]) -> int | None:
    """Bytes of a target's weight files (``files``: content files; those ending in a weight suffix count), None
    where it has none (a config-only folder)."""
    sizes = [os.path.getsize(f) for f in files if str(f).endswith((".safetensors", ".bin", ".pt", ".gguf"))]
    return sum(sizes) if sizes else None


# ---------------------------------------------------------------- making one (compressed-tensors)


def _tree(weights: dict):
    """An ``nn.Module`` holding one bias-free ``nn.Linear`` per tensor of ``weights`` (name -> [out, in]), at the
    tensor's module path (``a.b.q_proj.weight`` -> module ``a.b.q_proj``)."""
    import torch

    root = torch.nn.Module()
    for name, w in weights.items():
        *path, leaf = name[: -len(".weight")].split(".")
        node = root
        for part in path:
            if not hasattr(node, part):
                node.add_module(part, torch.nn.Module())
            node = getattr(node, part)
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
        lin.weight = torch.nn.Parameter(w, requires_grad=False)
        node.add_module(leaf, lin)
    return root


def _set_qparams(module) -> None:
    """Min-max scale and zero point of ``module.weight`` for its scheme's weight arguments, per group, channel or
    tensor (compressed-tensors' ``calculate_qparams``).

    Raises:
        ValueError: a group size that does not divide the input width (compressed-tensors refuses such a layer).
    """
    from compressed_tensors.quantization import QuantizationStrategy
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    args = module.quantization_scheme.weights
    w = module.weight.data.float()
    if args.strategy == QuantizationStrategy.GROUP:
        if w.shape[1] % args.group_size:
            raise ValueError(f"input width {w.shape[1]} is not a multiple of the group size {args.group_size} "
                             "(compressed-tensors refuses it): choose a group size that divides it")
        g = w.view(w.shape[0], -1, args.group_size)
        lo, hi = g.amin(-1), g.amax(-1)
    elif args.strategy == QuantizationStrategy.CHANNEL:
        lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    else:
        lo, hi = w.amin().reshape(1), w.amax().reshape(1)
    scale, zero = calculate_qparams(lo, hi, args)
    module.weight_scale.data = scale.to(module.weight_scale.dtype).reshape(module.weight_scale.shape)
    if hasattr(module, "weight_zero_point"):
        module.weight_zero_point.data = zero.to(module.weight_zero_point.dtype).reshape(module.weight_zero_point.shape)


def quantize_tensors(tensors: dict, config_groups: dict, ignore: list[str]) -> tuple[dict, int, Any]:
    """Quantize the Linear weights (``LINEAR_WEIGHT``, 2-D) of checkpoint ``tensors`` (name -> tensor) with
    compressed-tensors' ``config_groups`` (name -> ``QuantizationScheme`` or its dict) and ``ignore`` list,
    round-to-nearest, and compress them in the scheme's format. Returns the new state (the other tensors as they
    were; each quantized weight replaced by e.g. ``weight_packed`` int32 [out, in / 8], ``weight_scale``
    [out, in / group] and ``weight_shape`` for ``pack-quantized``, or an FP8 ``weight`` and its ``weight_scale`` for
    ``float-quantized``), the number of quantized layers and the ``ModelCompressor`` (its ``update_config`` writes
    the quantization_config into a folder's config.json).

    Raises:
        ValueError: the scheme matches no Linear weight, or a group size does not divide a layer's input width
            (the layer named).
    """
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus, apply_quantization_config

    linear = {k: v for k, v in tensors.items() if LINEAR_WEIGHT.match(k) and v.dim() == 2}
    tree = _tree(linear)
    apply_quantization_config(tree, QuantizationConfig(config_groups=config_groups, ignore=list(ignore)))
    quantized = [n for n, m in tree.named_modules() if getattr(m, "quantization_scheme", None) is not None]
    if not quantized:
        raise ValueError(f"the scheme matches no Linear layer (ignore list {list(ignore)})")
    for name in quantized:
        try:
            _set_qparams(tree.get_submodule(name))
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        tree.get_submodule(name).quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(tree)
    compressor.compress_model(tree)
    state = {k: v for k, v in tensors.items() if k not in linear}
    state.update({k: v.contiguous() for k, v in tree.state_dict().items()})
    return state, len(quantized), compressor


def write_checkpoint(src: Path, tmp: Path, state: dict, compressor, ignore: list[str]) -> None:
    """Write ``state`` into ``tmp`` as huggingface_hub's ``save_torch_state_dict`` shards it (``model.safetensors``,
    or 5 GB shards with their index), beside ``src``'s other files (config, tokenizer, chat template);
    ``compressor`` (``quantize_tensors``'s) writes config.json's quantization_config, whose ignore list is then
    ``ignore`` as given: compressed-tensors writes the modules it left out by the checkpoint's names, while the loaders
    match the list against their own module names (transformers' Kimi-K2.5: ``model.language_model.layers...``), so
    the patterns are what a checkpoint carries."""
    from huggingface_hub import save_torch_state_dict

    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, tmp / f.name)
    save_torch_state_dict(state, tmp, max_shard_size=SHARD_BYTES, metadata={"format": "pt"})
    compressor.update_config(str(tmp))
    cfg = json.loads((tmp / "config.json").read_text())
    cfg["quantization_config"]["ignore"] = list(ignore)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))


def quantize_with(src: str | os.PathLike, out: str | os.PathLike, config_groups: dict, ignore: list[str]) -> dict:
    """Write ``src`` (a dense HF checkpoint: config.json, safetensors weights, tokenizer) quantized with compressed-tensors'
    ``config_groups`` and ``ignore`` (``quantize_tensors``) to ``out``; its config.json gains the quantization_config
    (``write_checkpoint``). The folder appears at once (written under a temporary name, then renamed).

    Returns ``{"out", "quantized_modules", "weight_bytes"}`` (bytes of the safetensors files written).

    Raises:
        FileExistsError: ``out`` exists. FileNotFoundError: ``src`` has no safetensors weights.
        ValueError: what ``quantize_tensors`` raises, with ``src`` named.
    """
    from safetensors.torch import load_file

    src, out = Path(src), Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists: remove it first")
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{src}: no *.safetensors weights")
    tensors: dict = {}
    for f in files:
        tensors.update(load_file(str(f)))
    try:
        state, n, compressor = quantize_tensors(tensors, config_groups, ignore)
    except ValueError as e:
        raise ValueError(f"{src}: {e}") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        write_checkpoint(src, tmp, state, compressor, ignore)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": str(out), "quantized_modules": n,
            "weight_bytes": sum(f.stat().st_size for f in out.glob("*.safetensors"))}


def quantize(src: str | os.PathLike, out: str | os.PathLike, scheme: str, group_size: int | None = None) -> dict:
    """``quantize_with`` the preset ``scheme`` of ``SCHEMES`` (``w4a16``, ``fp8``, ``kimi-int4``); ``group_size``:
    elements of a row sharing one INT4 scale (default: the scheme's). Returns ``quantize_with``'s dict plus
    ``scheme``; raises what it raises."""
    from compressed_tensors.quantization import preset_name_to_scheme

    spec = SCHEMES[scheme]
    qscheme = preset_name_to_scheme(spec["preset"], ["Linear"])
    if qscheme.weights.group_size is not None:
        qscheme.weights.group_size = group_size or spec["group_size"]
    return {**quantize_with(src, out, {"group_0": qscheme}, spec["ignore"]), "scheme": scheme}
