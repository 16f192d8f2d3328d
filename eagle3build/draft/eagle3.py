"""Draft method ``eagle3`` (config ``draft.method``): speculators' ``Eagle3DraftModel`` (speculators/models/eagle3/),
one llama decoder layer trained with training-time test, one token a forward, served by vLLM as ``method: eagle3``
(shared layer; no torch at import). The default method: its runs' files keep the bytes they had before
``draft.method`` existed (``recorded`` false). The only method built with the MLA layer too (``layer_choices``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .method import DraftMethod


def dims(cfg: Mapping[str, Any], aux_layer_ids: list[int]) -> tuple:
    """``(H, V, D, A, heads, kv_heads, head_dim, intermediate)`` of a head's speculators ``config.json`` ``cfg``:
    ``transformer_layer_config``'s hidden size, vocab size (the target's), heads, KV heads, head dim (its
    ``head_dim``, else H / heads) and MLP width; D its ``draft_vocab_size``; A ``len(aux_layer_ids)``.

    Raises:
        KeyError: ``cfg`` lacks one of those fields.
    """
    tl = cfg["transformer_layer_config"]
    H, heads = tl["hidden_size"], tl["num_attention_heads"]
    return (H, tl["vocab_size"], cfg["draft_vocab_size"], len(aux_layer_ids), heads, tl["num_key_value_heads"],
            tl.get("head_dim") or H // heads, tl["intermediate_size"])


def eagle3_shapes(cfg: Mapping[str, Any], aux_layer_ids: list[int]) -> dict[str, tuple[int, ...]]:
    """speculators' ``Eagle3DraftModel`` (speculators/models/eagle3.py): H = ``transformer_layer_config.hidden_size``,
    V = its ``vocab_size`` (the target's), D = ``draft_vocab_size``, A = the number of aux layers: ``fc.weight``
    (H, A*H), ``lm_head.weight`` (D, H), ``d2t`` (D,) int64, ``t2d`` (V,) bool, one decoder layer whose attention
    reads [embed, hidden] (2H wide), ``input_norm.weight`` (A*H,) only with ``norm_before_fc``."""
    H, V, D, A, heads, kv, hd, inter = dims(cfg, aux_layer_ids)
    shapes = {
        "fc.weight": (H, A * H), "norm.weight": (H,), "lm_head.weight": (D, H), "d2t": (D,), "t2d": (V,),
        "embed_tokens.weight": (V, H),
        # the first draft layer attends over [embed, hidden] (2H wide)
        "layers.0.self_attn.q_proj.weight": (heads * hd, 2 * H), "layers.0.self_attn.k_proj.weight": (kv * hd, 2 * H),
        "layers.0.self_attn.v_proj.weight": (kv * hd, 2 * H), "layers.0.self_attn.o_proj.weight": (H, heads * hd),
        "layers.0.mlp.gate_proj.weight": (inter, H), "layers.0.mlp.up_proj.weight": (inter, H),
        "layers.0.mlp.down_proj.weight": (H, inter), "layers.0.input_layernorm.weight": (H,),
        "layers.0.hidden_norm.weight": (H,), "layers.0.post_attention_layernorm.weight": (H,),
    }
    if cfg.get("norm_before_fc"):
        shapes["input_norm.weight"] = (A * H,)
    return shapes


class Eagle3(DraftMethod):
    """EAGLE-3 (Li et al. 2025, arXiv:2503.01840): the module docstring. Its model and a training forward get the
    TTT steps (``train.ttt_steps``) and their loss decay, not a mask token; its k schedule may mix any k."""

    name = "eagle3"
    summary = "eagle3 (one token a forward, training-time test)"
    arch = "llama"
    vllm_method = {"method": "eagle3"}
    layer_choices = ("llama", "mla")
    recorded = False
    peer_route_type = "eagle3"

    def model_kwargs(self, target_dir: str, vocab_size: int, ttt_steps: int, trust_remote_code: bool) -> dict:
        """``{"ttt_steps": ttt_steps}``: the TTT steps its forward unrolls."""
        return {"ttt_steps": ttt_steps}

    def trainer_kwargs(self, ttt_steps: int, ttt_step_loss_decay: float, loss_implementation: str,
                       options: Mapping[str, Any] | None = None) -> dict:
        """``ttt_steps``, ``ttt_step_loss_decay`` and the ``kl_div`` loss of ``loss_implementation`` (``eager`` |
        ``fused``; speculators' ``resolve_loss_config``)."""
        from speculators.losses import resolve_loss_config

        return {"ttt_steps": ttt_steps, "ttt_step_loss_decay": ttt_step_loss_decay,
                "loss_config": resolve_loss_config("kl_div", implementation=loss_implementation)}

    def expected_shapes(self, cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        """``eagle3_shapes`` of ``cfg`` and its aux layers."""
        return eagle3_shapes(cfg, self.aux_layer_ids(cfg))


EAGLE3 = Eagle3()
