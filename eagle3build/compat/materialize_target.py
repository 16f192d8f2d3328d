"""Stage ``materialize_target``: turn a bundled GGUF into a Hugging Face model directory.

transformers reads GGUF files (``gguf_file=``, with the ``gguf`` package) and, with
``GgufConfig(dequantize=True)``, unpacks every weight into a plain dense model. Such a
model still carries the quantizer's marks and ``save_pretrained`` refuses it ("quantized
with gguf ... not serializable"); once the marks are cleared it saves as an ordinary HF
directory (transformers' GGUF loader, transformers/modeling_gguf_pytorch_utils.py). The result
is what every later stage and vLLM load.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from ..atomic import atomic_path
from ..config.settings import config_fields, job
from ..target import bundled_gguf_path

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 1
# The bundled target, dequantised once: a build made from it stays consistent with it after an upgrade, and
# re-materialising would rewrite 270 MB of weights and replan every stage (no packages).
STAGE = {"entry": "materialize_target",
         "keys": {"target.bundled": "files", "target.offline": "runtime", "resources.materialize.*": "runtime"}}


def gguf_to_hf(gguf: str | os.PathLike, out_dir: str | os.PathLike, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Dequantise ``gguf`` into ``out_dir``: config.json, model.safetensors (``dtype``), tokenizer, chat template.

    The directory appears atomically (written under a temporary name, then renamed).

    Raises:
        FileNotFoundError: ``gguf`` does not exist.
        ValueError: the tokenizer in the GGUF has no chat template (every later stage needs one).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = Path(gguf)
    if not gguf.is_file():
        raise FileNotFoundError(f"GGUF file {gguf} not found")
    log.info("reading %s (%.1f MB)", gguf, gguf.stat().st_size / 1e6)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tok.chat_template:
        raise ValueError(f"{gguf}: the tokenizer has no chat template")
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        dtype=dtype,
        quantization_config=GgufConfig(dequantize=True),
    )
    # Clear the quantizer's marks so save_pretrained writes a plain dense checkpoint.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = ""
    with atomic_path(out_dir) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    log.info("wrote %s: %s", out_dir, sorted(os.listdir(out_dir)))
    return Path(out_dir)


def materialize(name: str, out_dir: str | os.PathLike, dtype: str = "bfloat16") -> Path:
    """Materialise bundled target ``name`` (see ``target.BUNDLED_TARGETS``) into ``out_dir``."""
    return gguf_to_hf(bundled_gguf_path(name), out_dir, dtype={"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype])


@config_fields({})
class MaterializeSettings:
    """One materialize_target job: bundled target ``name`` (the rule's wildcard, ``target.bundled``'s value) into
    ``out_dir`` (the folder of the rule's output files). No config field: ``target.bundled`` decides the files, the
    ``resources.materialize`` keys the job's resources."""

    name: str = job("wildcards.name")
    out_dir: str = job("params.out_dir")


def materialize_target(s: MaterializeSettings) -> Path:
    """Rule ``materialize_target``'s entry (``eagle3build.workflow.job.run_stage``): ``materialize`` ``s.name`` into
    ``s.out_dir``. Returns the folder; raises what ``materialize`` raises."""
    return materialize(s.name, s.out_dir)
