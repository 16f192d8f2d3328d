"""Draft layer ``mla`` (config ``draft.layer``, eagle3 only): DeepSeek-V3's multi-head latent attention in the EAGLE-3
head, for DeepSeek-V3 and Kimi-K2/K2.5 targets (shared layer; no torch at import: its torch module, mla_layer.py, is
imported where a head is built). Its format (shapes, the config vLLM serves it from, what a target needs) is
mla_format.py.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import mla_format
from .layer import DraftLayer

if TYPE_CHECKING:
    from .method import DraftMethod


class MlaLayer(DraftLayer):
    """The MLA draft layer (config ``draft.layer: mla``, eagle3 only): the eagle3 head with DeepSeek-V3's multi-head
    latent attention built from the target's MLA config (eagle3build/draft/mla_layer.py), exported as vLLM's
    Eagle3DeepseekV3ForCausalLM loads it (``served_config``: vLLM's speculators parser refuses the layer). vLLM's
    DeepSeek EAGLE-3 model has no input_norm: ``norm_before_fc`` off."""

    name = "mla"
    summary = ("mla (eagle3 only: DeepSeek-V3 multi-head latent attention from the target's MLA config, for "
               "DeepSeek-V3/Kimi targets; served by vLLM as Eagle3DeepseekV3ForCausalLM; the pre-flight bound then "
               "times both layers)")
    flags = {"norm_before_fc": False}
    format_version = 2  # 2: rope_parameters as vLLM 0.26 and 0.32 both read them (issue 58)

    def target_problem(self, target_config: Mapping[str, Any]) -> str | None:
        """``mla_format.target_problem``."""
        return mla_format.target_problem(dict(target_config))

    def layer_config(self, spec: Mapping[str, Any], target_dir: str, trust_remote_code: bool):
        """``mla_layer.draft_layer_config`` of ``spec["layers"]`` layers (imports torch and speculators)."""
        from . import mla_layer

        return mla_layer.draft_layer_config(target_dir, spec["layers"], trust_remote_code=trust_remote_code)

    def register(self) -> None:
        """Register the layer in speculators (``mla_layer.register``, idempotent; its import does it too)."""
        from . import mla_layer

        mla_layer.register()

    def recognises(self, cfg: Mapping[str, Any]) -> bool:
        """``mla_format.is_mla_config``: its layer config has a ``kv_lora_rank``."""
        return mla_format.is_mla_config(dict(cfg))

    def expected_shapes(self, method: DraftMethod, cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        """``mla_format.expected_shapes``, with the method's aux layers."""
        return mla_format.expected_shapes(dict(cfg), len(method.aux_layer_ids(cfg)))

    def served_config(self, method: DraftMethod, cfg: Mapping[str, Any], served_name: str, dtype: str) -> dict:
        """``mla_format.served_config``: vLLM's own config, which names no verifier."""
        return mla_format.served_config(dict(cfg), method.aux_layer_ids(cfg), dtype)

    def speculators_config_dir(self, head_dir: str | os.PathLike, checkpoint_dir: str | os.PathLike
                               ) -> str | os.PathLike:
        """The checkpoint's: the exported config.json is vLLM's own."""
        return checkpoint_dir

    def benchmark_name(self, method: DraftMethod, cfg: Mapping[str, Any]) -> str:
        """``mla``: the config's choice, not the layer's model_type (``deepseek_v3`` trained, ``deepseek_v2``
        exported)."""
        return self.name

    def version_param(self) -> dict:
        """``{"layer_format": format_version}``: a change of ``served_config`` re-exports its heads and no other
        build's."""
        return {"layer_format": self.format_version}


MLA = MlaLayer()
