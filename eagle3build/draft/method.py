"""A draft method (config ``draft.method``): the class every method's own module subclasses (shared layer; no torch
at import, planning reads it).

Anchor: speculators' split of its models (speculators/models/<method>/: one package per method, whose registered
model class owns its behaviour). Here each method is one module of eagle3build/draft/ (``eagle3.py``, ``peagle.py``,
``dflash.py``) holding one ``DraftMethod`` subclass and its one instance; the registry (``methods.py``) lists them.
What the method changes is behaviour on that object, which the stages call, never a flag they branch on:

- its options (config ``draft.<method>.<option>``) with speculators' defaults, and the arguments of speculators'
  model it is built with (``arch``, ``layers``, ``args``, ``spec``): the config's ``draft`` section
  (eagle3build/config/spec.py) and the model ``head_model.build_model`` builds;
- the head flags it keeps (``head_flags``), what its model and a training forward get beside the shared arguments
  (``model_kwargs``, ``trainer_kwargs``) and whether training rows are shifted (``shifted``, handed to the batches);
- which hidden states of the target it reads, and why: for a target of N decoder layers by default
  (``default_aux_layer_ids``, ``aux_layer_ids_rule``), a user's ids checked (``check_aux_layer_ids``), how many
  (``num_aux_layers``) and the field of its head's config.json naming them (``aux_layer_ids``); every registered method
  reads the same ones, so one capture serves them all (tests/test_draft_methods.py);
- the tensors its head holds (``expected_shapes``), the config.json its exported head ships (``served_config``) and
  the checks a checkpoint passes before export (``export_problem``, ``load_hint``);
- the ``speculative_config`` vLLM serves it with (``speculative_config``), the draft positions one forward of it
  was trained to fill (``trained_positions``) and the k a schedule may hold (``schedule_k``);
- the decoder layers it is built with (``layer_choices``: names of ``draft.layer``, eagle3build/draft/layer.py).

A fourth method is its own module with one subclass (speculators' Medusa, which reads the last hidden state and no
aux layers, would override ``aux_layer_ids``, ``expected_shapes`` and ``model_kwargs``), one line of the registry and
its tests; the config key, schemas and wildcard follow from the registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .servable import head_config_fields


@dataclass(frozen=True)
class Option:
    """A knob of a method, config key ``draft.<method>.<name>``: its JSON schema, speculators' default, its doc
    line, and where it goes: ``"layers"`` (the draft's decoder layer count) or ``"arg"`` (a speculators argument
    of the model and its trainer kwargs, under ``name``)."""

    name: str
    schema: Mapping[str, Any]
    default: int
    doc: str
    goes_to: str = "arg"


def proposal_positions(cfg: Mapping[str, Any]) -> int:
    """``speculators_config.proposal_methods[0].speculative_tokens`` of a head's speculators ``config.json``
    ``cfg``: the draft positions the head proposes in one forward.

    Raises:
        KeyError: ``cfg`` lacks the field.
    """
    return int(cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"])


class DraftMethod:
    """One draft method (the module docstring). Subclasses set the class attributes and override the behaviour
    that differs from this base's (a speculators model of aux hidden states, trained with a mask token and its own
    class's trainer kwargs, served in speculators' format).

    ``name``: speculators' and vLLM's name (``speculators_model_type`` of its head's config.json); ``summary``: the
    config doc's words for it; ``arch``: speculators' draft_arch of its decoder layers; ``args``: speculators' method
    arguments no option sets; ``layers``: decoder layers where no option sets them; ``options``: its ``Option``
    knobs; ``shifted``: trained on ``shift_batch``ed rows (speculators/train/cli.py); ``flags``: head flags over the
    variant's; ``vllm_method``: vLLM's speculative_config less model and k; ``layer_choices``: the config
    ``draft.layer`` names it is built with, its own layer first; ``recorded``: whether its runs write the method into
    saved states, train_meta.json and head_meta.json (the default method's files keep the bytes they had before
    methods existed); ``peer_route_type``: speculators' ``--speculator-type`` that trains it from this build's data
    (benchmarks/peer_route.py), None where that route does not; ``static_shapes``: its training forward has the same
    shapes every step (a fixed ``total_seq_len``), so its compiled graphs need no dynamic shapes and may be CUDA graphs
    (``compiled.resolve_plan``).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    arch: ClassVar[str] = "llama"
    args: ClassVar[Mapping[str, Any]] = {}
    layers: ClassVar[int] = 1
    options: ClassVar[tuple[Option, ...]] = ()
    shifted: ClassVar[bool] = True
    flags: ClassVar[Mapping[str, bool]] = {}
    vllm_method: ClassVar[Mapping[str, Any]] = {}
    layer_choices: ClassVar[tuple[str, ...]] = ("llama",)
    recorded: ClassVar[bool] = True
    peer_route_type: ClassVar[str | None] = None
    static_shapes: ClassVar[bool] = True
    aux_ids_key: ClassVar[str] = "eagle_aux_hidden_state_layer_ids"  # the head config's field of the aux layer ids
    # Fewer decoder layers than this and EAGLE-3's default ids [2, N//2, N-3] repeat a layer or leave the stack.
    eagle3_min_layers: ClassVar[int] = 7

    def __repr__(self) -> str:
        return f"<draft method {self.name}>"

    # --- the model and its training ---

    def spec(self, options: Mapping[str, Any] | None = None) -> dict:
        """``{"arch", "layers", "args"}`` with the user's ``options`` (``draft.<method>.*``) in place of the
        defaults.

        Raises:
            ValueError: an option is not one of the method's (the message names ``draft.<method>``).
        """
        options = dict(options or {})
        names = [o.name for o in self.options]
        bad = sorted(set(options) - set(names))
        if bad:
            raise ValueError(f"draft.{self.name}: {bad} are not options of {self.name} (it has {names})")
        out = {"arch": self.arch, "layers": self.layers, "args": dict(self.args)}
        for o in self.options:
            value = int(options.get(o.name, o.default))
            if o.goes_to == "layers":
                out["layers"] = value
            else:
                out["args"][o.name] = value
        return out

    def resolved_options(self, options: Mapping[str, Any] | None = None) -> dict:
        """Every option with its value: ``options`` where given, else its default (``spec``'s errors)."""
        spec = self.spec(options)
        return {o.name: spec["layers"] if o.goes_to == "layers" else spec["args"][o.name] for o in self.options}

    def head_flags(self, variant_flags: Mapping[str, bool], layer_flags: Mapping[str, bool]) -> dict[str, bool]:
        """The speculators config flags its head is built with for a head variant of flags ``variant_flags``
        (``head_format.HEAD_VARIANTS``) and a draft layer forcing ``layer_flags``: the variant's with the method's
        own over them and the layer's over those."""
        return {**variant_flags, **self.flags, **layer_flags}

    def speculators_class(self):
        """speculators' model class of the method (its ``SpeculatorModel`` registry entry; imports speculators).
        A layer other than speculators' own registers itself first (``DraftLayer.register``; ``Draft`` and
        ``Head`` do both)."""
        import importlib

        from speculators.model import SpeculatorModel

        importlib.import_module("speculators.models")  # registers the model classes

        return SpeculatorModel.registry[self.name]

    def model_kwargs(self, target_dir: str, vocab_size: int, ttt_steps: int, trust_remote_code: bool) -> dict:
        """What ``from_training_args`` gets beside the shared arguments (``head_model.build_model``): speculators'
        ``resolve_mask_token_id`` of the target's tokenizer (``vocab_size``: the verifier's embedding rows), the
        token its masked positions read (P-EAGLE, DFlash); EAGLE-3 overrides it with its TTT steps."""
        from speculators.train.utils import resolve_mask_token_id

        return {"mask_token_id": resolve_mask_token_id(target_dir, vocab_size, trust_remote_code=trust_remote_code)}

    def trainer_kwargs(self, ttt_steps: int, ttt_step_loss_decay: float, loss_implementation: str,
                       options: Mapping[str, Any] | None = None) -> dict:
        """The keyword arguments of a training forward (``net(**row, **these)``): its class's own
        ``get_trainer_kwargs`` (speculators' CLI route, speculators/train/cli.py) with the ``kl_div`` loss of
        ``loss_implementation`` (``eager`` | ``fused``) and ``options`` (``spec``) in place of its defaults;
        EAGLE-3 overrides it with its TTT steps and decay."""
        train_kw, _ = self.speculators_class().get_trainer_kwargs(
            loss_fn="kl_div", loss_implementation=loss_implementation, **self.spec(options)["args"])
        return train_kw

    # --- the target's hidden states it reads ---

    def num_aux_layers(self, aux_layer_ids: str | list[int]) -> int:
        """How many aux layers a head reads for ``capture.aux_layer_ids``: 3 for ``auto`` (``default_aux_layer_ids``),
        else the ids' count."""
        return 3 if aux_layer_ids == "auto" else len(aux_layer_ids)

    def default_aux_layer_ids(self, num_layers: int) -> list[int]:
        """The aux layers a head reads where ``capture.aux_layer_ids`` is ``auto``: EAGLE-3's ``[2, N//2, N-3]``
        (vLLM's and speculators' default; EAGLE-3, arXiv 2503.01840) for ``N`` >= ``eagle3_min_layers`` decoder
        layers; below that, where those would repeat a layer (6 layers: ``[2, 3, 3]``), three distinct layers spread
        over the stack the same way, low, middle and high: ``[1, N//2, N-2]`` for 5-6 layers, ``[1, 2, 3]`` for 4,
        ``[0, 1, 2]`` for 3 (issue 67; ``aux_layer_ids_rule`` says which). Layer id ``k`` is the residual stream
        *entering* decoder layer ``k``.

        Raises:
            ValueError: fewer than 3 layers (no three distinct ones; give ``capture.aux_layer_ids`` fewer ids).
        """
        n = num_layers
        if n >= self.eagle3_min_layers:
            return [2, n // 2, n - 3]
        if n < 3:
            raise ValueError(f"target has {n} decoder layer(s): no three distinct aux layers; set "
                             f"capture.aux_layer_ids to ids in [0, {n - 1}]")
        lo, hi = (1 if n >= 4 else 0), (n - 2 if n >= 5 else n - 1)
        mid = n // 2 if lo < n // 2 < hi else lo + 1
        return [lo, mid, hi]

    def aux_layer_ids_rule(self, num_layers: int) -> str:
        """Why ``default_aux_layer_ids`` chose its ids for a ``num_layers``-layer target, as the compat report says
        it."""
        ids, n = self.default_aux_layer_ids(num_layers), num_layers
        if n >= self.eagle3_min_layers:
            return f"EAGLE-3's default [2, N//2, N-3] for N = {n} layers: {ids}"
        return (f"a shallow target ({n} layers, fewer than {self.eagle3_min_layers}): EAGLE-3's [2, N//2, N-3] would "
                f"be {[2, n // 2, n - 3]}, so three distinct layers spread over the stack: {ids}")

    def check_aux_layer_ids(self, ids: list[int], num_layers: int) -> list[int]:
        """User-given aux layer ids (``capture.aux_layer_ids``), checked: integers in ``[0, num_layers)``, unique,
        sorted.

        Raises:
            ValueError: naming the offending ids and the valid range.
        """
        if not ids:
            raise ValueError("capture.aux_layer_ids is empty")
        bad = [i for i in ids if not isinstance(i, int) or i < 0 or i >= num_layers]
        if bad:
            raise ValueError(f"capture.aux_layer_ids {ids}: {bad} out of range [0, {num_layers - 1}] for a "
                             f"{num_layers}-layer target")
        if len(set(ids)) != len(ids):
            raise ValueError(f"capture.aux_layer_ids {ids}: ids must be unique")
        if list(ids) != sorted(ids):
            raise ValueError(f"capture.aux_layer_ids {ids}: ids must be sorted ascending")
        return list(ids)

    # --- its head's config.json ---

    def aux_layer_ids(self, cfg: Mapping[str, Any]) -> list[int]:
        """The target layers whose hidden states a head of config ``cfg`` reads (its ``aux_ids_key`` field).

        Raises:
            KeyError: ``cfg`` lacks the field.
        """
        return list(cfg[self.aux_ids_key])

    def expected_shapes(self, cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape a head of speculators config ``cfg`` holds with speculators' own layer (a layer
        of its own: ``DraftLayer.expected_shapes``).

        Raises:
            KeyError: ``cfg`` lacks a field the layout is sized from.
        """
        raise NotImplementedError(f"draft method {self.name} names no tensor layout")

    def fc_fields(self, aux_layer_ids: list[int]) -> dict:
        """The keys export adds to the head's ``transformer_layer_config`` so that vLLM sizes the drafter's ``fc``
        for its aux hidden states (``servable.head_config_fields``); DFlash adds none (vLLM's DFlash sizes it from
        the aux ids themselves)."""
        return head_config_fields(aux_layer_ids)

    def served_config(self, cfg: Mapping[str, Any], served_name: str, dtype: str) -> dict:
        """The exported head's ``config.json`` in speculators' format from the one ``save_pretrained`` wrote
        (``cfg``, not changed): the verifier named by ``served_name`` (no local path), the ``transformer_layer_config``
        fields vLLM sizes the ``fc`` from (``fc_fields``), no ``auto_map`` (it names a ``config.py`` that is not
        shipped) and ``dtype`` (``bfloat16`` | ``float16`` | ``float32``)."""
        import json

        out = json.loads(json.dumps(cfg))
        out["speculators_config"]["verifier"]["name_or_path"] = served_name
        out["transformer_layer_config"].update(self.fc_fields(self.aux_layer_ids(out)))
        out.pop("auto_map", None)
        out["dtype"] = dtype
        return out

    def export_problem(self, cfg: Mapping[str, Any]) -> str:
        """Why a checkpoint of config ``cfg`` would be served otherwise than trained; ``""`` where it would not."""
        return ""

    def load_hint(self, cfg: Mapping[str, Any]) -> str:
        """A hint for a head of config ``cfg`` that vLLM fails to load (a head of an older build); ``""``."""
        return ""

    # --- serving ---

    def speculative_config(self, model: str, k: int) -> dict:
        """vLLM's ``speculative_config`` serving a head of the method in folder ``model`` with ``k`` draft tokens
        a step."""
        return {**self.vllm_method, "model": model, "num_speculative_tokens": k}

    def trained_positions(self, cfg: Mapping[str, Any]) -> int | None:
        """Draft positions a head of speculators config ``cfg`` was trained to fill in one forward; None for a
        method of one token a forward, which serves any k (this base); P-EAGLE and DFlash read
        ``proposal_positions``.

        Raises:
            KeyError: ``cfg`` lacks the field a method reads.
        """
        return None

    def schedule_k(self, sweep: Mapping[int, Mapping[int, float]], concurrencies: list[int],
                   baseline: Mapping[int, float], taus: Mapping[int, Mapping[int, float | None]] | None = None
                   ) -> int | None:
        """The one k > 0 a k schedule of a head of this method may hold beside 0 (serve.k_schedule), chosen from
        ``sweep`` (k -> concurrency -> output tokens/s with the head), ``baseline`` (concurrency -> the target
        alone's) and ``taus`` (k -> concurrency -> τ); 0: none pays; None: any swept k (this base)."""
        return None
