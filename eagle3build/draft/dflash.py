"""Draft method ``dflash`` (config ``draft.method``): speculators' DFlash (``DFlashDraftModel``,
speculators/models/dflash/), a block of tokens drafted in one forward over the target's context (shared layer; no
torch at import).

5 qwen3 layers (speculators' CLI default), block_size 8 (dflash/core.py); built bidirectional in every layer (all full
attention, ``sliding_window_non_causal``), the one layout vLLM serves as trained (docs/design/peagle_dflash.md §3.3),
and without ``sample_from_anchor`` (vLLM 0.26 does not read it). Rows are not shifted; its config has no head flags;
its aux layer ids are ``aux_hidden_state_layer_ids``; vLLM's DFlash sizes its fc from the aux ids themselves
(qwen3_dflash.py), so export adds no fc fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .eagle3 import dims
from .method import DraftMethod, Option, proposal_positions


class DFlash(DraftMethod):
    """DFlash: the module docstring."""

    name = "dflash"
    summary = "dflash (a block of tokens in one forward over the target's context)"
    arch = "qwen3"
    args = {"sliding_window_non_causal": True, "sample_from_anchor": False}
    options = (Option("block_size", {"type": "integer", "minimum": 2}, 8,
                      "DFlash: tokens per drafted block, the anchor and block_size - 1 drafts (speculators' block_size, "
                      "models/dflash/core.py); read where draft.method is dflash (changing it retrains under any "
                      "method)"),
               Option("num_layers", {"type": "integer", "minimum": 1}, 5,
                      "DFlash: decoder layers of the draft (speculators' CLI default 5); read where draft.method is "
                      "dflash (changing it retrains under any method)", goes_to="layers"))
    shifted = False
    vllm_method = {"method": "dflash"}
    aux_ids_key = "aux_hidden_state_layer_ids"

    def head_flags(self, variant_flags: Mapping[str, bool], layer_flags: Mapping[str, bool]) -> dict[str, bool]:
        """``{}``: its speculators config has no head flags."""
        return {}

    def fc_fields(self, aux_layer_ids: list[int]) -> dict:
        """``{}``: vLLM's DFlash sizes its fc from the aux ids themselves."""
        return {}

    def expected_shapes(self, cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        """``fc.weight`` (H, A*H), ``hidden_norm.weight``, ``norm``, ``lm_head``, ``d2t``, ``t2d``, no embedding,
        and per layer of ``num_hidden_layers`` a qwen3 decoder layer over H (q/k norms of the head dim)
        (speculators/models/dflash/model_definitions.py)."""
        H, V, D, A, heads, kv, hd, inter = dims(cfg, self.aux_layer_ids(cfg))
        shapes = {"fc.weight": (H, A * H), "hidden_norm.weight": (H,), "norm.weight": (H,), "lm_head.weight": (D, H),
                  "d2t": (D,), "t2d": (V,)}
        for i in range(cfg["transformer_layer_config"]["num_hidden_layers"]):
            p = f"layers.{i}."
            shapes.update({
                p + "self_attn.q_proj.weight": (heads * hd, H), p + "self_attn.k_proj.weight": (kv * hd, H),
                p + "self_attn.v_proj.weight": (kv * hd, H), p + "self_attn.o_proj.weight": (H, heads * hd),
                p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                p + "mlp.gate_proj.weight": (inter, H), p + "mlp.up_proj.weight": (inter, H),
                p + "mlp.down_proj.weight": (H, inter), p + "input_layernorm.weight": (H,),
                p + "post_attention_layernorm.weight": (H,)})
        return shapes

    def export_problem(self, cfg: Mapping[str, Any]) -> str:
        """vLLM applies ``dflash_config.causal = not sliding_window_non_causal`` to every layer, while training keeps
        full-attention layers bidirectional (docs/design/peagle_dflash.md §3.3): only this layout serves as
        trained."""
        if cfg.get("sliding_window_non_causal") and not cfg.get("sample_from_anchor"):
            return ""
        return (f"a DFlash head must have sliding_window_non_causal true and sample_from_anchor false (got "
                f"{cfg.get('sliding_window_non_causal')}, {cfg.get('sample_from_anchor')}): vLLM would serve it "
                "otherwise than it was trained")

    def trained_positions(self, cfg: Mapping[str, Any]) -> int:
        """``block_size - 1``: ``method.proposal_positions``.

        Raises:
            KeyError: ``cfg`` lacks the field.
        """
        return proposal_positions(cfg)


DFLASH = DFlash()
