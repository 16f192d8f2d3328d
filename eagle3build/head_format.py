"""The EAGLE-3 head format: variants, head flags, tensor shapes (shared layer).

The head is speculators' EAGLE-3 format (speculators/models/eagle3.py,
``Eagle3SpeculatorConfig``), read by vLLM through its speculators config parser
(vllm/transformers_utils/configs/speculators/algos.py) and draft model
(vllm/model_executor/models/llama_eagle3.py). ``train_draft`` builds a head of a variant,
``export_head`` checks its tensors against ``expected_shapes``, and the compat report asks
which flags the installed vLLM reads.
"""

from __future__ import annotations

# The head flags (speculators' Eagle3SpeculatorConfig fields), in the order the compat report lists them.
HEAD_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")

# Head flags of the two EAGLE-3 variants (speculators' Eagle3SpeculatorConfig fields).
HEAD_VARIANTS = {
    # Li et al. 2025: fc over the raw concatenated aux states, residual after the hidden norm.
    "eagle3": {"norm_before_residual": False, "norm_before_fc": False, "norm_output": False, "fc_norm": False},
    # speculators' default since 0.4 ("Eagle 3.1"): norm before fc, post-norm states fed back.
    "eagle3.1": {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True, "fc_norm": False},
}

assert all(set(v) == set(HEAD_FLAGS) for v in HEAD_VARIANTS.values())


def expected_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape that a head with speculators config ``cfg`` (its ``config.json``) must hold.

    H = ``transformer_layer_config.hidden_size``, V = its ``vocab_size`` (the target's), D =
    ``draft_vocab_size``, A = the number of aux layers: ``fc.weight`` (H, A*H), ``lm_head.weight``
    (D, H), ``d2t`` (D,) int64, ``t2d`` (V,) bool, one decoder layer whose attention reads
    [embed, hidden] (2H wide), ``input_norm.weight`` (A*H,) only with ``norm_before_fc``. The
    layout of speculators' ``Eagle3DraftModel`` (speculators/models/eagle3.py).
    """
    tl = cfg["transformer_layer_config"]
    H = tl["hidden_size"]
    V = tl["vocab_size"]
    D = cfg["draft_vocab_size"]
    A = len(cfg["eagle_aux_hidden_state_layer_ids"])
    heads, kv = tl["num_attention_heads"], tl["num_key_value_heads"]
    hd = tl.get("head_dim") or H // heads
    inter = tl["intermediate_size"]
    shapes = {
        "fc.weight": (H, A * H),
        "norm.weight": (H,),
        "lm_head.weight": (D, H),
        "d2t": (D,),
        "t2d": (V,),
        "embed_tokens.weight": (V, H),
        # the first draft layer attends over [embed, hidden] (2H wide)
        "layers.0.self_attn.q_proj.weight": (heads * hd, 2 * H),
        "layers.0.self_attn.k_proj.weight": (kv * hd, 2 * H),
        "layers.0.self_attn.v_proj.weight": (kv * hd, 2 * H),
        "layers.0.self_attn.o_proj.weight": (H, heads * hd),
        "layers.0.mlp.gate_proj.weight": (inter, H),
        "layers.0.mlp.up_proj.weight": (inter, H),
        "layers.0.mlp.down_proj.weight": (H, inter),
        "layers.0.input_layernorm.weight": (H,),
        "layers.0.hidden_norm.weight": (H,),
        "layers.0.post_attention_layernorm.weight": (H,),
    }
    if cfg.get("norm_before_fc"):
        shapes["input_norm.weight"] = (A * H,)
    return shapes
