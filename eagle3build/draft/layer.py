"""A draft decoder layer (config ``draft.layer``): the class every layer subclasses, and ``LLAMA``, speculators' own
layer of the method (shared layer; no torch at import, planning reads it).

The base is speculators' own decoder layer of the method's ``arch`` (llama for eagle3 and peagle, qwen3 for dflash),
built by speculators' CLI: it forces no head flags, its checkpoint and exported head are speculators' format of the
method, and its runs write no ``layer`` into their saved states, train_meta.json and head_meta.json (the bytes they
had before ``draft.layer`` existed). A layer of its own (``MLA``, eagle3build/draft/mla.py) overrides what it
changes: the head flags it forces, its layer config and its registration in speculators, how its checkpoint and
exported head are recognised, its tensors, the config.json vLLM serves it from, the version of that format and what
a target must have for it (checked at planning, ``target_problem``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from .method import DraftMethod


class DraftLayer:
    """A draft decoder layer (the module docstring). ``name``: the config's choice; ``summary``: the config doc's
    words for it; ``flags``: head flags over the method's (vLLM reads no other); ``recorded``: whether its runs
    write ``layer`` into saved states, train_meta.json and head_meta.json; ``format_version``: the version of its
    exported format (``version_param``)."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    flags: ClassVar[Mapping[str, bool]] = {}
    recorded: ClassVar[bool] = True
    format_version: ClassVar[int] = 0

    def __repr__(self) -> str:
        return f"<draft layer {self.name}>"

    def target_problem(self, target_config: Mapping[str, Any]) -> str | None:
        """What keeps this layer from being built for a target of ``config.json`` ``target_config`` (a dict, read
        without torch at planning), in words after "the target"; None where nothing does (this base: any)."""
        return None

    def layer_config(self, spec: Mapping[str, Any], target_dir: str, trust_remote_code: bool):
        """The draft's ``transformer_layer_config`` for the target in ``target_dir`` (imports speculators):
        speculators' CLI layer config (``create_transformer_layer_config``) of the method's architecture and layer
        count (``spec``: ``DraftMethod.spec``), every layer full attention, no sliding window anywhere (so no
        engine reads one from the exported config)."""
        from speculators.train.cli import create_transformer_layer_config

        tl = create_transformer_layer_config(
            verifier_name_or_path=target_dir,
            num_layers=spec["layers"],
            draft_arch=spec["arch"],
            hidden_act=None,
            sliding_window=1,  # unused: every layer is full attention
            full_attention_indices=list(range(spec["layers"])),
            mrope_full_head_hack=True,
            trust_remote_code=trust_remote_code,
        )
        tl.sliding_window = None
        tl.use_sliding_window = False
        return tl

    def register(self) -> None:
        """Register the layer in speculators' decoder components (this base: speculators' own, nothing to do)."""

    def recognises(self, cfg: Mapping[str, Any]) -> bool:
        """Whether a checkpoint's or exported head's ``config.json`` ``cfg`` is of this layer (this base: the layer
        of a config no other layer recognises, never asked)."""
        return False

    def expected_shapes(self, method: DraftMethod, cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape a head of ``method`` and config ``cfg`` holds: the method's layout."""
        return method.expected_shapes(cfg)

    def served_config(self, method: DraftMethod, cfg: Mapping[str, Any], served_name: str, dtype: str) -> dict:
        """The exported head's ``config.json`` from the checkpoint's ``cfg``: the method's, speculators' format."""
        return method.served_config(cfg, served_name, dtype)

    def speculators_config_dir(self, head_dir: str | os.PathLike, checkpoint_dir: str | os.PathLike
                               ) -> str | os.PathLike:
        """Where speculators reads the config to reload an exported head: the head's folder, whose config.json is
        speculators' (a layer that ships vLLM's own config: the checkpoint's)."""
        return head_dir

    def benchmark_name(self, method: DraftMethod, cfg: Mapping[str, Any]) -> str:
        """The layer as benchmark.json names it (``draft_layer``): the architecture speculators built it as, the
        ``transformer_layer_config.model_type`` of ``cfg`` (``llama``; ``qwen3`` for DFlash), else the method's
        ``arch``."""
        return (cfg.get("transformer_layer_config") or {}).get("model_type") or method.arch

    def version_param(self) -> dict:
        """What export_head's ``version`` param carries for a run of this layer (workflow.contract.version): nothing
        (a default-layer build keeps its param)."""
        return {}


class LlamaLayer(DraftLayer):
    """speculators' own layer of the method (config ``draft.layer: llama``; qwen3 for dflash): the base's."""

    name = "llama"
    summary = "llama (speculators' layer of the method: llama; qwen3 for dflash)"
    recorded = False


LLAMA = LlamaLayer()
