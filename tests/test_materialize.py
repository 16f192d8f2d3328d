"""materialize_target: the bundled GGUF becomes a working bf16 Hugging Face directory."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors import safe_open

from eagle3build.formats.target_files import BUNDLED_CONFIGS
from eagle3build.target import bundled_gguf_path, fingerprint


def test_hf_directory_contents(smol_target):
    names = {p.name for p in smol_target.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= names
    cfg = json.loads((smol_target / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576 and cfg["vocab_size"] == 49152
    assert "quantization_config" not in cfg
    # what planning knows of it before it is materialised (draft.layer mla is refused there: no kv_lora_rank)
    known = BUNDLED_CONFIGS["smollm2-135m-instruct"]
    assert {k: cfg[k] for k in known} == known == {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    assert "kv_lora_rank" not in cfg
    with safe_open(str(smol_target / "model.safetensors"), "pt") as f:
        w = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
        assert w.dtype == torch.bfloat16 and w.shape == (576, 576)
    assert "<|im_start|>" in (smol_target / "chat_template.jinja").read_text()


def test_materialized_model_answers(smol_target):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_target)
    model = AutoModelForCausalLM.from_pretrained(smol_target, dtype=torch.float32).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1]:])


def test_fingerprint_is_stable_and_content_based(smol_target, tiny_target, tmp_path):
    """The materialised target's fingerprint is its files' content: a copy elsewhere with other file times keeps
    it (a clean clone's target keeps its shards), one changed byte of a tokenizer file changes it, and another
    target has another."""
    fp = fingerprint(smol_target)
    copy = tmp_path / "copy"
    shutil.copytree(smol_target, copy, copy_function=shutil.copyfile)  # new paths, new times
    os.utime(copy / "model.safetensors", (1, 1))
    assert fingerprint(copy) == fp and len(fp) == 16
    cfg = (copy / "tokenizer_config.json").read_bytes()
    (copy / "tokenizer_config.json").write_bytes(cfg.replace(b"{", b" {", 1))
    assert fingerprint(copy) != fp
    (copy / "tokenizer_config.json").write_bytes(cfg)
    assert fingerprint(copy) == fp
    assert fingerprint(tiny_target) != fp


def test_unknown_bundled_target():
    with pytest.raises(KeyError, match="unknown bundled target 'nope'"):
        bundled_gguf_path("nope")
