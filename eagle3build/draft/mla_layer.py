"""The MLA draft layer (config ``draft.layer: mla``): an EAGLE-3 decoder layer with DeepSeek-V3's multi-head latent
attention, for DeepSeek-V3 and Kimi-K2/K2.5 targets (shared layer: ``head_model`` builds it, ``train_draft`` trains
it, ``export_head`` and the pre-flight bound write it).

What vLLM serves (vllm/model_executor/models/deepseek_eagle3.py, ``DeepseekV2Eagle3DecoderLayer``, registered as
``Eagle3DeepseekV3ForCausalLM``; vLLM 0.26 and the CPU build 0.32): one decoder layer whose MLA attention
(``DeepseekV2MLAAttention``) reads ``[input_layernorm(embed), hidden_norm(fused)]``, 2 x hidden wide, a dense
gated MLP (``DeepseekV2MLP``, no MoE), the ``fc`` over the aux states and the final ``norm``. This module builds the
same layer for training from transformers' DeepSeek-V3 modules (transformers/models/deepseek_v3/
modeling_deepseek_v3.py: ``DeepseekV3DecoderLayer`` with its ``DeepseekV3Attention`` and dense ``DeepseekV3MLP``),
with the two attention input projections (``q_a_proj``, or ``q_proj`` without a q LoRA rank, and
``kv_a_proj_with_mqa``) widened to 2 x hidden, as vLLM's ``input_size=2 * hidden_size`` widens them, and with
speculators' EAGLE-3 first-layer forward (``Eagle3FirstLayerMixin``: split, norm, concatenate, attend, MLP).

It is registered in speculators' own structure: ``register`` adds a ``deepseek_v3`` entry to the decoder-component
table that ``Eagle3DraftModel`` picks its layers from by ``transformer_layer_config.model_type``
(speculators/models/eagle3/model_definitions.py ``model_classes``, read in models/eagle3/core.py), so the model,
loss, TTT loop, vocab map and checkpoint format stay speculators' ``Eagle3DraftModel``. What speculators 0.9.0 does
not give: an MLA layer config (its CLI's ``create_transformer_layer_config`` builds llama/qwen3 configs only,
speculators/train/cli.py ``DRAFT_ARCH_CONFIGS``, without the MLA ranks), hence ``draft_layer_config`` here.

Rotary embedding: transformers' ``rope_interleave`` (DeepSeek-V3's default, True) rotates the interleaved pairs
as vLLM's MLA rope does (``get_rope(..., is_neox_style=False)``, deepseek_v2.py); the softmax scale gets the
same YaRN mscale in both (transformers ``yarn_apply_mscale``, vLLM ``DeepseekV2MLAAttention``).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from speculators.models import base_components
from speculators.models.eagle3.model_definitions import Eagle3FirstLayerMixin
from speculators.models.eagle3.model_definitions import model_classes as eagle3_model_classes
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3DecoderLayer,
    DeepseekV3RMSNorm,
    DeepseekV3RotaryEmbedding,
)

from .mla_format import MLA_FIELDS, MODEL_TYPE, check_rope

# The target config's fields a draft layer copies (besides the MLA ranks, MLA_FIELDS): the width, heads, MLP
# activation and norms; the rope (theta and scaling) as the target applies it.
COPIED_FIELDS = ("vocab_size", "hidden_size", "num_attention_heads", "hidden_act", "max_position_embeddings",
                 "initializer_range", "rms_norm_eps")


class DeepseekV3Eagle3FirstLayer(Eagle3FirstLayerMixin, DeepseekV3DecoderLayer):  # type: ignore[misc]
    """The EAGLE-3 first draft layer with MLA: ``DeepseekV3DecoderLayer`` (dense MLP: the config's
    ``first_k_dense_replace`` is above every draft layer) whose attention input projections read 2 x hidden
    (``[embeds, hidden]``), plus ``hidden_norm`` (RMSNorm of the fused state), and speculators' EAGLE-3 first-layer
    forward (``Eagle3FirstLayerMixin.forward``; input ``[1, T, 2H]``, output ``[1, T, H]``).

    speculators' own ``_patch_eagle3_projections`` widens ``q_proj``/``k_proj``/``v_proj``, which MLA does not have;
    this widens MLA's two input projections instead, as vLLM's ``DeepseekV2MLAAttention(input_size=2 * hidden)``.
    The latent norms take the config's ``rms_norm_eps`` (transformers builds them with 1e-6; vLLM with
    ``rms_norm_eps``, deepseek_v2.py), so the trained layer is the served one for any eps.
    """

    def __init__(self, config: DeepseekV3Config, layer_idx: int, norm_before_residual: bool = False):
        super().__init__(config, layer_idx)
        self.norm_before_residual = norm_before_residual
        self.hidden_norm = DeepseekV3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        attn, wide = self.self_attn, 2 * config.hidden_size
        if config.q_lora_rank is None:
            attn.q_proj = torch.nn.Linear(wide, config.num_attention_heads * attn.qk_head_dim, bias=False)
        else:
            attn.q_a_proj = torch.nn.Linear(wide, config.q_lora_rank, bias=config.attention_bias)
            attn.q_a_layernorm.variance_epsilon = config.rms_norm_eps
        attn.kv_a_proj_with_mqa = torch.nn.Linear(wide, config.kv_lora_rank + config.qk_rope_head_dim,
                                                  bias=config.attention_bias)
        attn.kv_a_layernorm.variance_epsilon = config.rms_norm_eps


def register() -> None:
    """Add the MLA layer to speculators' EAGLE-3 decoder components under ``MODEL_TYPE`` (``deepseek_v3``): the
    first layer ``DeepseekV3Eagle3FirstLayer``, later layers ``DeepseekV3DecoderLayer``, ``DeepseekV3RMSNorm``,
    ``DeepseekV3RotaryEmbedding`` (speculators' ``base_components.ModelComponents``). Idempotent."""
    eagle3_model_classes.setdefault(MODEL_TYPE, base_components.ModelComponents(
        DeepseekV3Eagle3FirstLayer, DeepseekV3DecoderLayer, DeepseekV3RMSNorm, DeepseekV3RotaryEmbedding))


register()


def is_mla(config: Any) -> bool:
    """Whether a (text) transformers config has multi-head latent attention: ``kv_lora_rank`` set (DeepSeek-V2/V3,
    Kimi-K2/K2.5)."""
    return bool(getattr(config, "kv_lora_rank", None))


def draft_layer_config(target_dir: str, num_layers: int = 1, *, trust_remote_code: bool) -> DeepseekV3Config:
    """The draft's ``transformer_layer_config`` for an MLA draft of the target in ``target_dir``: a
    ``DeepseekV3Config`` of ``num_layers`` dense layers (``first_k_dense_replace`` = ``num_layers``) with the
    target's MLA ranks and head dims (``MLA_FIELDS``: q_lora_rank, kv_lora_rank, qk_nope/qk_rope/v head dims),
    attention heads (``num_key_value_heads`` = heads: MLA has no grouped KV), hidden size, vocab, activation,
    norm eps and rope (``rope_parameters``: theta and scaling, ``rope_interleave``), and the dense MLP width
    speculators gives a draft (``resolve_draft_intermediate_size``: the target's dense ``intermediate_size``,
    Kimi-K2.5 18432). The text config of a multimodal wrapper (Kimi-K2.5) is read.

    Raises:
        ValueError: the target has no MLA (no ``kv_lora_rank``): ``draft.layer: mla`` needs a DeepSeek-V3/Kimi
            target; or its rope is one vLLM's DeepSeek EAGLE-3 layer cannot serve as trained
            (``mla_format.check_rope``: default and YaRN only).
    """
    from speculators.models.utils import resolve_draft_intermediate_size

    from ..target import load_config, text_config

    tc = text_config(load_config(target_dir, trust_remote_code))
    if not is_mla(tc):
        raise ValueError(f"draft.layer mla: the target {target_dir} ({type(tc).__name__}) has no multi-head latent "
                         "attention (no kv_lora_rank in its config.json); use draft.layer llama")
    kw = {k: getattr(tc, k) for k in COPIED_FIELDS + MLA_FIELDS}
    kw.update(num_hidden_layers=num_layers, first_k_dense_replace=num_layers,
              num_key_value_heads=tc.num_attention_heads, intermediate_size=resolve_draft_intermediate_size(tc),
              attention_bias=bool(getattr(tc, "attention_bias", False)),
              rope_interleave=getattr(tc, "rope_interleave", True), tie_word_embeddings=False,
              architectures=["DeepseekV3ForCausalLM"])
    rope = getattr(tc, "rope_parameters", None)
    if rope:
        kw["rope_parameters"] = check_rope(copy.deepcopy(dict(rope)), f"draft.layer mla: the target {target_dir}")
    return DeepseekV3Config(**kw)
