"""The EAGLE-3 head format: variants, head flags, tensor shapes, and a head folder read once (``Head``; shared
layer, no torch).

The head is speculators' EAGLE-3 format (speculators/models/eagle3.py,
``Eagle3SpeculatorConfig``), read by vLLM through its speculators config parser
(vllm/transformers_utils/configs/speculators/algos.py) and draft model
(vllm/model_executor/models/llama_eagle3.py). ``train_draft`` builds a head of a variant,
``export_head`` checks its tensors against ``expected_shapes``, and the compat report asks
which flags the installed vLLM reads. P-EAGLE and DFlash heads (``draft.method``) are speculators' formats of
those methods; an MLA head (``draft.layer: mla``) is exported in vLLM's own format. What a head folder is (its
method, layer, trained positions, KV-cached layers, aux layers, its ``speculative_config`` at a k) is a ``Head``,
read once (``Head.read``) and handed to export's checks, the benchmark, its k schedule and the pre-flight.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import methods
from .layer import DraftLayer
from .method import DraftMethod
from .mla_format import layer_config

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


def expected_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape that a head with config ``cfg`` (its ``config.json``, a checkpoint's or an exported
    head's) must hold: its draft layer's layout of its method (``DraftLayer.expected_shapes``; EAGLE-3: speculators'
    ``Eagle3DraftModel``; P-EAGLE adds ``mask_hidden``; DFlash its qwen3 layers, no embedding; an MLA head
    ``mla_format.expected_shapes``).

    Raises:
        ValueError: ``cfg`` names a method that is not registered.
        KeyError: ``cfg`` lacks a field the layout is sized from.
    """
    return methods.layer_of(cfg).expected_shapes(methods.of_config(cfg), cfg)


class HeadError(ValueError):
    """A head folder that is no head of a registered method, or whose meta file contradicts its config.json (the
    message names the file and field)."""


@dataclass(frozen=True)
class Head:
    """A draft head's folder, read once (``read``): a checkpoint (train_draft's) or an exported head (export_head's).

    ``path``: the folder; ``config``: its ``config.json`` (speculators' format; an exported MLA head's is vLLM's
    own); ``meta``: its meta file where one was read (``train_meta.json`` or ``head_meta.json``, checked against
    its schema), else None; ``method`` and ``layer``: its registered method and draft layer (config.json's
    ``speculators_model_type``; the layer that recognises the config); ``draft_layer``: the layer as
    benchmark.json names it (``mla``; ``llama``, ``qwen3`` for DFlash: ``DraftLayer.benchmark_name``);
    ``trained_positions``: draft positions one forward of it was trained to fill (P-EAGLE ``num_depths``, DFlash
    ``block_size - 1``; None for eagle3, any k); ``kv_layers``: its attention layers that take KV cache in vLLM (its
    layer config's ``num_hidden_layers``); ``aux_layer_ids``: the target layers whose hidden states it reads (None
    where the config names none: a config written by hand)."""

    path: Path
    config: Mapping[str, Any] = field(repr=False, hash=False)
    method: DraftMethod
    layer: DraftLayer
    draft_layer: str
    trained_positions: int | None
    kv_layers: int
    aux_layer_ids: tuple[int, ...] | None
    meta: Mapping[str, Any] | None = field(default=None, repr=False, hash=False)

    @classmethod
    def read(cls, folder: str | os.PathLike, meta=None) -> Head:
        """The head in ``folder``: its ``config.json``, and where ``meta`` is given (``formats.artifacts.TrainMeta``
        or ``HeadMeta``) its meta file, which must name the method and layer the config is of (absent: the
        defaults, eagle3 and llama).

        Raises:
            HeadError: config.json is not JSON, names no registered method, lacks a field the head is read from, or
                its method or layer differs from the meta file's (both named).
            artifacts.ArtifactError: the meta file is missing or does not match its schema.
        """
        path = Path(folder)
        try:
            cfg = json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise HeadError(f"{path}/config.json: not a head's config ({type(e).__name__}: {e})") from None
        head = cls.of(path, cfg)
        if meta is None:
            return head
        data = meta.load(path).data
        for what, name, said in (("", head.method.name, data.get("method", methods.DEFAULT_METHOD)),
                                 ("-layer", head.layer.name, data.get("layer", methods.DEFAULT_LAYER))):
            if name != said:
                raise HeadError(f"{path}: config.json is a {name}{what} head but {meta.FILENAME} says {said}")
        return replace(head, meta=data)

    @classmethod
    def of(cls, folder: str | os.PathLike, cfg: Mapping[str, Any]) -> Head:
        """The head in ``folder`` whose ``config.json`` is ``cfg`` (already read or just written: not read again).

        Raises:
            HeadError: as ``read``.
        """
        path = Path(folder)
        try:
            method = methods.of_config(cfg)
            layer = methods.layer_of(cfg)
            aux = method.aux_layer_ids(cfg) if method.aux_ids_key in cfg else None
            return cls(path, cfg, method, layer, layer.benchmark_name(method, cfg), method.trained_positions(cfg),
                       int(layer_config(cfg)["num_hidden_layers"]), tuple(aux) if aux is not None else None)
        except KeyError as e:
            raise HeadError(f"{path}/config.json: no {e.args[0]} (read for a {cfg.get('speculators_model_type', '?')} "
                            "head)") from None
        except ValueError as e:
            raise HeadError(f"{path}/config.json: {e}") from None

    def speculative_config(self, k: int, bands: list[list[int]] | None = None) -> dict:
        """vLLM's ``speculative_config`` serving this head (its absolute folder) with ``k`` draft tokens a step, by
        its method (``DraftMethod.speculative_config``: eagle3 ``{"method": "eagle3"}``; peagle EAGLE-3 with
        ``parallel_drafting``, vLLM having no peagle method; dflash ``{"method": "dflash"}``); with ``bands``, vLLM's
        ``num_speculative_tokens_per_batch_size`` (a k schedule, serve.k_schedule)."""
        out = self.method.speculative_config(os.path.abspath(self.path), k)
        return {**out, "num_speculative_tokens_per_batch_size": bands} if bands is not None else out

    def described(self) -> dict:
        """What benchmark.json says a run served: ``{"method", "draft_layer", "trained_positions"}``."""
        return {"method": self.method.name, "draft_layer": self.draft_layer, "trained_positions": self.trained_positions}

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape it must hold (``expected_shapes``).

        Raises:
            KeyError: config.json lacks a field the layout is sized from.
        """
        return self.layer.expected_shapes(self.method, self.config)

    def served_config(self, served_name: str, dtype: str) -> dict:
        """The exported head's ``config.json`` made from this checkpoint's (``DraftLayer.served_config``)."""
        return self.layer.served_config(self.method, self.config, served_name, dtype)

    def speculators_class(self):
        """speculators' model class of its method, with its layer registered (imports speculators)."""
        self.layer.register()
        return self.method.speculators_class()

    def export_problem(self) -> str:
        """Why this checkpoint would be served otherwise than trained (``DraftMethod.export_problem``); ``""``."""
        return self.method.export_problem(self.config)

    def load_hint(self) -> str:
        """A hint where vLLM fails to load it (``DraftMethod.load_hint``: a P-EAGLE head of an older build); ``""``."""
        return self.method.load_hint(self.config)
