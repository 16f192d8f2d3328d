"""The draft registries (shared layer; no torch at import, planning reads them through ``config.spec``): the draft
methods (config ``draft.method``; ``METHODS``) and the draft decoder layers (config ``draft.layer``; ``LAYERS``),
one object each, defined in its own module:

- methods (``method.DraftMethod`` subclasses): ``eagle3`` (eagle3.py), ``peagle`` (peagle.py), ``dflash``
  (dflash.py);
- layers (``layer.DraftLayer`` subclasses): ``llama`` (layer.py, speculators' own layer of the method), ``mla``
  (mla.py, DeepSeek-V3's multi-head latent attention; eagle3 only).

The anchor is speculators' own split (speculators/models/<method>/, one registered model class per method that owns
its behaviour; speculators/train/config/schema.py: one typed group per method). A new method is its module and its
line here (the config's ``draft`` section, the schemas' enums and the rules' wildcard are made from this registry),
a new layer likewise. What a run builds is a ``choice.Draft`` (method, options, layer), resolved once from the config;
what a head folder holds is a ``head_format.Head``. No module branches on a method's or a layer's name, nor on this
registry's constants, outside eagle3build/draft/ (tests/test_draft_registry.py reads the tree for such branches).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .dflash import DFLASH
from .eagle3 import EAGLE3
from .layer import LLAMA, DraftLayer
from .method import DraftMethod
from .mla import MLA
from .peagle import PEAGLE

METHODS: dict[str, DraftMethod] = {m.name: m for m in (EAGLE3, PEAGLE, DFLASH)}
LAYERS: dict[str, DraftLayer] = {x.name: x for x in (LLAMA, MLA)}

# The method of a head or run that names none: EAGLE-3, the only one before draft.method existed (its files keep
# their bytes: ``DraftMethod.recorded``). The layer of a head or run that names none: speculators' own layer of the
# method (``DraftLayer.recorded``).
DEFAULT_METHOD = EAGLE3.name
DEFAULT_LAYER = LLAMA.name
NAMES: tuple[str, ...] = tuple(METHODS)
LAYER_NAMES: tuple[str, ...] = tuple(LAYERS)
assert all(set(m.layer_choices) <= set(LAYERS) and m.layer_choices[0] == DEFAULT_LAYER for m in METHODS.values())


def num_aux_layers(aux_layer_ids: str | list[int]) -> int:
    """The aux layers a capture of ``capture.aux_layer_ids`` holds per token (``DraftMethod.num_aux_layers``): every
    registered method reads the same ones, so one capture serves the heads of every method (draft.compare_methods).

    Raises:
        ValueError: two methods would read different counts (one capture could not serve both).
    """
    counts = {m.num_aux_layers(aux_layer_ids) for m in METHODS.values()}
    if len(counts) != 1:
        raise ValueError(f"the draft methods read different aux layer counts for {aux_layer_ids}: {counts}")
    return counts.pop()


def get(name: str) -> DraftMethod:
    """The method named ``name`` (``draft.method``, a head's ``speculators_model_type``).

    Raises:
        ValueError: no such method.
    """
    if name not in METHODS:
        raise ValueError(f"draft.method {name!r} is not one of {list(METHODS)}")
    return METHODS[name]


def get_layer(name: str) -> DraftLayer:
    """The draft layer named ``name`` (config ``draft.layer``).

    Raises:
        ValueError: no such layer.
    """
    if name not in LAYERS:
        raise ValueError(f"draft.layer {name!r} is not one of {list(LAYERS)}")
    return LAYERS[name]


def methods_with_layer(layer: DraftLayer) -> list[str]:
    """The names of the methods built with ``layer`` (their ``layer_choices``), in registry order."""
    return [m.name for m in METHODS.values() if layer.name in m.layer_choices]


def of_config(cfg: Mapping[str, Any]) -> DraftMethod:
    """The method of a head's ``config.json`` ``cfg``: its ``speculators_model_type`` (a head without one, an
    exported MLA head's vLLM config included, is ``DEFAULT_METHOD``'s).

    Raises:
        ValueError: a type no method has.
    """
    return get(cfg.get("speculators_model_type", DEFAULT_METHOD))


def layer_of(cfg: Mapping[str, Any]) -> DraftLayer:
    """The draft layer of a checkpoint's or exported head's ``config.json`` ``cfg``: the registered layer that
    recognises it (``DraftLayer.recognises``: MLA where its layer config has a ``kv_lora_rank``), else
    ``DEFAULT_LAYER``'s."""
    return next((x for x in LAYERS.values() if x.recognises(cfg)), LAYERS[DEFAULT_LAYER])


def aux_layer_ids(cfg: Mapping[str, Any]) -> list[int]:
    """The aux layer ids of a head's ``config.json`` ``cfg``, read by its method (``DraftMethod.aux_layer_ids``:
    ``eagle_aux_hidden_state_layer_ids`` for eagle3 and peagle, ``aux_hidden_state_layer_ids`` for dflash).

    Raises:
        KeyError: ``cfg`` lacks its method's field.
        ValueError: ``cfg`` names no registered method.
    """
    return of_config(cfg).aux_layer_ids(cfg)
