"""The draft a run builds, as one value (shared layer; no torch at import: planning makes it).

A ``Draft`` is the config's ``draft`` section resolved once (``resolve``): the method object
(``method.DraftMethod``, config ``draft.method``), every option of it with its value (``draft.<method>.*``) and the
layer object (``layer.DraftLayer``, ``draft.layer``). ``workflow.plan`` resolves it at planning, against the target's
config.json where it can be read then (a bundled target's known fields before it is materialised:
``formats.target_files.BUNDLED_CONFIGS``), and refuses in one line naming the keys what cannot be built: a method
with a layer it is not built with (``draft.method: peagle`` with ``draft.layer: mla``), a layer the target lacks
(``draft.layer: mla`` on a target without multi-head latent attention). The jobs get it as a param
(``Draft.section``, made into a ``Draft`` again at their entry) and pass it down as one value.

``draft.compare_methods`` beside a layer that some of those methods are not built with: each compared head is built
with its own layer (``compared``) and the plan says so in one line (``compare_note``): the comparison serves each
method as it can be built, and benchmark.json names every run's ``draft_layer``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .layer import DraftLayer
from .method import DraftMethod
from .methods import DEFAULT_LAYER, DEFAULT_METHOD, LAYERS, METHODS, get, get_layer, methods_with_layer


class DraftError(ValueError):
    """The config's ``draft`` section asks for a head that cannot be built (one line naming the keys)."""


@dataclass(frozen=True)
class Draft:
    """A draft head's kind: ``method`` (a registered ``DraftMethod``), ``layer`` (a registered ``DraftLayer`` the
    method is built with) and ``options`` (every option of the method by name, with its value: speculators'
    default where the config sets none). Made by ``resolve``; compared by value."""

    method: DraftMethod
    layer: DraftLayer
    options: Mapping[str, int] = field(default_factory=dict, hash=False)

    def __post_init__(self):
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def __repr__(self) -> str:
        return f"Draft({self.method.name}, {self.layer.name}, {dict(self.options)})"

    def describe(self) -> str:
        """``eagle3 head with the mla layer``: for messages."""
        return f"{self.method.name} head with the {self.layer.name} layer"

    def section(self) -> dict:
        """The config's ``draft`` section of this draft (JSON-able; ``resolve`` gives the draft back):
        ``{"method", "layer"}`` and, for a method with options, ``{<method>: {option: value}}``. The jobs get it as
        their ``draft`` param, torchrun's ranks as an argument."""
        out = {"method": self.method.name, "layer": self.layer.name}
        if self.options:
            out[self.method.name] = dict(self.options)
        return out

    def spec(self) -> dict:
        """``{"arch", "layers", "args"}`` of speculators' model of the method with these options
        (``DraftMethod.spec``)."""
        return self.method.spec(self.options)

    def head_flags(self, variant_flags: Mapping[str, bool]) -> dict[str, bool]:
        """The speculators config flags the head is built with for a head variant of flags ``variant_flags``
        (``head_format.HEAD_VARIANTS``): the variant's, the method's over them, the layer's over those
        (``DraftMethod.head_flags``: P-EAGLE turns ``norm_output``, ``fc_norm`` and ``norm_before_fc`` off, DFlash
        has none; MLA turns ``norm_before_fc`` off)."""
        return self.method.head_flags(variant_flags, self.layer.flags)

    def speculators_class(self):
        """speculators' model class of the method, with the layer registered in speculators' decoder components
        (imports speculators)."""
        self.layer.register()
        return self.method.speculators_class()

    def trainer_kwargs(self, ttt_steps: int, ttt_step_loss_decay: float, loss_implementation: str) -> dict:
        """The keyword arguments of a training forward (``DraftMethod.trainer_kwargs`` with these options)."""
        return self.method.trainer_kwargs(ttt_steps, ttt_step_loss_decay, loss_implementation, self.options)

    def served_config(self, cfg: Mapping[str, Any], served_name: str, dtype: str) -> dict:
        """The exported head's ``config.json`` from the checkpoint's speculators config ``cfg``
        (``DraftLayer.served_config``: the method's speculators format, or the layer's own)."""
        return self.layer.served_config(self.method, cfg, served_name, dtype)

    def state_fields(self) -> dict:
        """What a saved training state keys on beside the run's settings (train_draft): the method where it is
        ``recorded``, with its options where they differ from speculators' defaults (a state saved before they were
        keys resumes), and the layer where it is ``recorded``; ``{}`` for an eagle3 head of the llama layer, whose
        states keep their key."""
        out: dict = {}
        if self.method.recorded:
            out["method"] = self.method.name
            if dict(self.options) != self.method.resolved_options():
                out["method_options"] = dict(self.options)
        if self.layer.recorded:
            out["layer"] = self.layer.name
        return out

    def meta_fields(self) -> dict:
        """What train_meta.json (and so head_meta.json) records of the draft: ``method`` and ``layer`` where
        ``recorded``; ``{}`` for an eagle3 head of the llama layer, whose files keep their bytes."""
        out = {"method": self.method.name} if self.method.recorded else {}
        return {**out, **({"layer": self.layer.name} if self.layer.recorded else {})}

    def bound_drafts(self) -> tuple[Draft, ...]:
        """The drafts whose untrained heads the pre-flight bound times (compat.preflight_bound), this draft's layer
        first: EAGLE-3 heads (the default method, one token a forward: the table's steps) of ``draft.layer`` and,
        where that is not the default layer, of the default layer beside it (the choice between the two is what
        the bound informs)."""
        names = dict.fromkeys((self.layer.name, DEFAULT_LAYER))
        return tuple(Draft(METHODS[DEFAULT_METHOD], LAYERS[n]) for n in names)


def _keys(section: Mapping[str, Any]) -> str:
    """``draft.method: peagle, draft.layer: mla``: the section's method and layer as config keys."""
    return f"draft.method: {section.get('method', DEFAULT_METHOD)}, draft.layer: {section.get('layer', DEFAULT_LAYER)}"


def resolve(section: Mapping[str, Any] | None = None, target_config: Mapping[str, Any] | None = None,
            target: str = "the target") -> Draft:
    """The ``Draft`` of the config's ``draft`` section ``section`` (``{"method", "layer", <method>: {options},
    ...}``; a key left out takes its default, ``{}`` or None the default draft: eagle3, llama). Where
    ``target_config`` (the target's config.json as a dict, read without torch) is given, the layer is checked against
    it (``DraftLayer.target_problem``); ``target`` names the target in the message (``target.path /models/x``).

    Raises:
        DraftError: one line, ``config: ...``, naming the keys: an unknown method or layer, an option the method
            does not have, a layer the method is not built with, or a layer the target cannot take.
    """
    section = dict(section or {})
    try:
        method = get(section.get("method", DEFAULT_METHOD))
        layer = get_layer(section.get("layer", DEFAULT_LAYER))
        options = method.resolved_options(section.get(method.name) if method.options else None)
    except ValueError as e:
        raise DraftError(f"config: {e}") from None
    if layer.name not in method.layer_choices:
        raise DraftError(
            f"config: {_keys(section)}: the {layer.name} layer is built for draft.method "
            f"{' or '.join(methods_with_layer(layer))} only, not {method.name}; set draft.layer: "
            f"{method.layer_choices[0]} ({method.name}'s own), or draft.method: {methods_with_layer(layer)[0]}")
    if target_config is not None and (problem := layer.target_problem(target_config)):
        raise DraftError(f"config: draft.layer: {layer.name} cannot be built for {target}, which {problem}; set "
                         f"draft.layer: {DEFAULT_LAYER}")
    return Draft(method, layer, options)


def compare_draft(section: Mapping[str, Any], draft: Draft, name: str) -> Draft:
    """The draft of method ``name`` trained beside ``draft`` (the run's own) for ``draft.compare_methods``: the run's
    layer where the method is built with it, else the method's own (``layer_choices[0]``), and the method's options
    from ``section`` (the config's ``draft`` section).

    Raises:
        DraftError: as ``resolve`` (an unknown method, an option it does not have).
    """
    method = METHODS.get(name)
    layer = draft.layer.name if method is None or draft.layer.name in method.layer_choices else method.layer_choices[0]
    return resolve({**section, "method": name, "layer": layer})


def compared(section: Mapping[str, Any], draft: Draft) -> tuple[Draft, ...]:
    """The drafts of ``draft.compare_methods`` (``section["compare_methods"]``, in order), each by
    ``compare_draft``."""
    return tuple(compare_draft(section, draft, m) for m in section.get("compare_methods", []))


def compare_note(draft: Draft, others: tuple[Draft, ...]) -> str | None:
    """One line for the plan where a head of ``draft.compare_methods`` (``others``) gets another layer than the run's
    own ``draft``: which layer each head gets and why; None where all share the run's layer."""
    apart = [d for d in others if d.layer != draft.layer]
    if not apart:
        return None
    heads = ", ".join(f"{d.method.name}'s the {d.layer.name} layer" for d in apart)
    return (f"config: draft.compare_methods {[d.method.name for d in others]} beside draft.layer: {draft.layer.name}: "
            f"the run's {draft.method.name} head gets the {draft.layer.name} layer, {heads} (draft.layer "
            f"{draft.layer.name} is built for draft.method {' or '.join(methods_with_layer(draft.layer))} only); "
            "benchmark.json names each run's draft_layer")
