"""A head the user brings (config ``draft.head``: the run's head; ``train.init_from``: where training starts): its
folder read and checked without torch at planning, and made into speculators' format (shared layer).

Two formats are read:

- ``speculators``: speculators' EAGLE-3 format (speculators/models/eagle3.py; P-EAGLE and DFlash heads likewise), what
  export_head writes and vLLM loads: ``config.json`` with ``speculators_model_type``, ``model.safetensors``;
- ``eagle``: the EAGLE repo's EAGLE-3 format (github.com/SafeAILab/EAGLE, eagle/model/cnets.py; SpecForge writes the
  same): ``config.json`` of a Llama layer (``architectures`` ``LlamaForCausalLMEagle3``, ``vocab_size`` the target's,
  ``draft_vocab_size``) and ``model.safetensors`` or ``pytorch_model.bin`` with the decoder layer under ``midlayer.``,
  ``fc``, ``norm``, ``lm_head``, ``d2t``, ``t2d`` (the embedding optional: vLLM then shares the target's,
  vllm/v1/spec_decode/llm_base_proposer.py). It is converted by speculators' own converter (``speculators convert``,
  speculators/convert/eagle/eagle3_converter.py, ``Eagle3Converter``): ``as_speculators``.

``read`` gives a ``GivenHead``: its format, config, weight file and tensor shapes (a safetensors header, read without
loading a tensor; a ``.bin`` file's are known once it is loaded), the method and draft layer, the target's hidden size
and vocabulary it was made for, its draft vocabulary, aux layer ids and verifier. ``target_problem`` says in one line
why it is no head of a target (both values and the file each came from); ``draft_problem`` why it is not of the run's
``draft.method`` / ``draft.layer``. Planning (``workflow.plan``), the compat report, export and training read it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..formats.target_files import check_aux_layer_ids, default_aux_layer_ids, num_decoder_layers
from . import methods
from .head_format import Head, HeadError

FORMATS = ("speculators", "eagle")
# What the EAGLE repo's EAGLE-3 checkpoints hold (speculators' converter maps ``midlayer.`` to ``layers.0.``).
EAGLE_LAYER = ("input_layernorm", "hidden_norm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
               "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
EAGLE_TENSORS = ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
                 *(f"midlayer.{m}.weight" for m in EAGLE_LAYER))
# Tensors a given head may leave out: vLLM then uses the target's embedding (llm_base_proposer.py).
OPTIONAL_TENSORS = ("embed_tokens.weight",)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class GivenHeadError(ValueError):
    """A folder that is no head, or a head that is not of the target or the run's draft; the message is one line
    naming the config key, the folder or file, and what is missing or which values differ."""


@dataclass(frozen=True)
class GivenHead:
    """A given head's folder as read (``read``): ``path``; ``key``, the config key that named it (``draft.head``,
    ``train.init_from``); ``format`` (``FORMATS``); ``config``, its config.json; ``weights``, its weight file;
    ``shapes``, tensor name -> shape (None for a ``.bin`` file: not read at planning); ``method`` and ``layer``, the
    registered method and draft layer (the EAGLE format: eagle3, llama); ``hidden_size`` and ``vocab_size``: the
    target's hidden size and vocabulary it was made for (tokens), with the config field each came from
    (``fields``); ``draft_vocab_size``; ``aux_layer_ids`` (None: the config names none, EAGLE-3's default for the
    target then, ``aux_ids_for``); ``verifier_architectures`` (None: the config names none)."""

    path: Path
    key: str
    format: str
    config: Mapping[str, Any] = field(repr=False, hash=False)
    weights: Path
    shapes: Mapping[str, tuple[int, ...]] | None = field(repr=False, hash=False)
    method: str
    layer: str
    hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    aux_layer_ids: tuple[int, ...] | None
    verifier_architectures: tuple[str, ...] | None
    fields: Mapping[str, str] = field(repr=False, hash=False, default_factory=dict)

    @property
    def files(self) -> list[str]:
        """The files that decide what the head is: ``config.json`` first, then its weight file (a rule's inputs)."""
        return [os.fspath(self.path / "config.json"), os.fspath(self.weights)]

    @property
    def described(self) -> str:
        """How the head becomes the run's, for compat.md and head_meta.json: taken as it is, or converted."""
        if self.format == "speculators":
            return "speculators' format, taken as it is"
        return "the EAGLE repo's EAGLE-3 format, converted by speculators' converter (Eagle3Converter)"

    def aux_ids_for(self, num_layers: int | None) -> list[int] | None:
        """The aux layer ids the head reads on a target of ``num_layers`` decoder layers: its config's, else EAGLE-3's
        default (``default_aux_layer_ids``, what vLLM reads where a head names none); None where neither is known."""
        if self.aux_layer_ids is not None:
            return list(self.aux_layer_ids)
        return default_aux_layer_ids(num_layers) if num_layers and num_layers >= 3 else None


def _shapes(path: Path) -> dict[str, tuple[int, ...]] | None:
    """Tensor name -> shape of a safetensors file, from its header (no tensor read, no torch); None for another
    format."""
    if path.suffix != ".safetensors":
        return None
    from safetensors import safe_open

    with safe_open(os.fspath(path), framework="numpy") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 - safe_open has no iteration


def _eagle_aux_ids(cfg: Mapping[str, Any]) -> list[int] | None:
    """An EAGLE-format config's aux ids: ``eagle_aux_hidden_state_layer_ids`` at its top or in ``eagle_config``
    (SpecForge writes it there); None where it names none."""
    for where in (cfg, cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}):
        ids = where.get("eagle_aux_hidden_state_layer_ids")
        if ids is not None:
            return list(ids)
    return None


def read(folder: str | os.PathLike, key: str = "draft.head") -> GivenHead:
    """The head in ``folder`` (named by config ``key``), read without torch: its format, config, weight file and
    tensor shapes, checked for what a head of that format holds.

    Raises:
        GivenHeadError: one line naming ``key``, the folder and what is missing: the folder, config.json, a config
            of either format, a weight file (a sharded one is not read), a config field the head is read from, or a
            tensor (or its shape) the format requires.
    """
    path = Path(folder)
    where = f"{key} {os.fspath(path)}"
    if not path.is_dir():
        raise GivenHeadError(f"{where}: no such folder")
    try:
        cfg = json.loads((path / "config.json").read_text())
    except OSError:
        raise GivenHeadError(f"{where} is no head: it has no config.json") from None
    except ValueError as e:
        raise GivenHeadError(f"{where}/config.json is not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise GivenHeadError(f"{where}/config.json is not a JSON object")
    weights = next((path / w for w in WEIGHT_FILES if (path / w).is_file()), None)
    if weights is None:
        sharded = [f.name for f in path.glob("*.index.json")]
        raise GivenHeadError(f"{where} is no head: it has no {' or '.join(WEIGHT_FILES)}" + (
            f" ({sharded[0]}: sharded weights are not read; speculators' converter reads one file)" if sharded else ""))
    if "speculators_model_type" in cfg:
        return _read_speculators(path, key, cfg, weights)
    if any("Eagle3" in a for a in cfg.get("architectures") or []):
        return _read_eagle(path, key, cfg, weights)
    raise GivenHeadError(f"{where} is no head: its config.json names neither speculators_model_type (speculators' "
                         "format) nor an EAGLE-3 architecture (the EAGLE repo's format: LlamaForCausalLMEagle3)")


def _check_tensors(where: str, weights: Path, shapes: Mapping[str, tuple[int, ...]] | None,
                   expected: Mapping[str, tuple[int, ...] | None]) -> None:
    if shapes is None:
        return
    missing = [n for n in expected if n not in shapes and n not in OPTIONAL_TENSORS]
    if missing:
        raise GivenHeadError(f"{where} is no head: {weights.name} lacks {', '.join(missing)}")
    bad = [f"{n} {shapes[n]} (expected {s})" for n, s in expected.items() if s and n in shapes and shapes[n] != s]
    if bad:
        raise GivenHeadError(f"{where}/{weights.name}: {'; '.join(bad)}")


def shape_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """A head's config.json as its tensor shapes are read (``Head.expected_shapes``): one that names no aux layer ids
    (speculators' converter writes none unless told; vLLM then reads the target's three default layers) with three
    placeholder ids in their field, so that its ``fc`` is sized for three layers as vLLM sizes it."""
    key = methods.of_config(cfg).aux_ids_key
    return cfg if key in cfg else {**cfg, key: [0, 1, 2]}


def _read_speculators(path: Path, key: str, cfg: dict, weights: Path) -> GivenHead:
    where = f"{key} {os.fspath(path)}"
    if weights.suffix != ".safetensors":
        raise GivenHeadError(f"{where} is no head: speculators' format keeps its weights in model.safetensors")
    try:
        head = Head.of(path, cfg)
        expected = Head.of(path, shape_config(cfg)).expected_shapes()
        tl = cfg["transformer_layer_config"]
        vocab, draft_vocab = int(tl["vocab_size"]), int(cfg["draft_vocab_size"])
    except (HeadError, KeyError) as e:
        raise GivenHeadError(f"{key}: {e}" if isinstance(e, HeadError) else
                             f"{where}/config.json: no {e.args[0]} (read for a speculators head)") from None
    hidden, hidden_field = ((cfg["target_hidden_size"], "target_hidden_size") if cfg.get("target_hidden_size")
                            else (tl["hidden_size"], "transformer_layer_config.hidden_size"))
    shapes = _shapes(weights)
    _check_tensors(where, weights, shapes, expected)
    verifier = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("architectures")
    return GivenHead(path, key, "speculators", cfg, weights, shapes, head.method.name, head.layer.name, int(hidden),
                     vocab, draft_vocab, head.aux_layer_ids, tuple(verifier) if verifier else None,
                     {"hidden_size": hidden_field, "vocab_size": "transformer_layer_config.vocab_size",
                      "verifier": "speculators_config.verifier.architectures"})


def _read_eagle(path: Path, key: str, cfg: dict, weights: Path) -> GivenHead:
    where = f"{key} {os.fspath(path)}"
    missing = [f for f in ("hidden_size", "vocab_size", "draft_vocab_size") if f not in cfg]
    if missing:
        raise GivenHeadError(f"{where}/config.json: no {', '.join(missing)} (read for an EAGLE-3 head)")
    hidden, hidden_field = ((cfg["target_hidden_size"], "target_hidden_size") if cfg.get("target_hidden_size")
                            else (cfg["hidden_size"], "hidden_size"))
    aux = _eagle_aux_ids(cfg)
    n_aux = len(aux) if aux else 3
    shapes = _shapes(weights)
    _check_tensors(where, weights, shapes, {
        **{n: None for n in EAGLE_TENSORS}, "fc.weight": (cfg["hidden_size"], n_aux * hidden),
        "lm_head.weight": (cfg["draft_vocab_size"], cfg["hidden_size"]), "d2t": (cfg["draft_vocab_size"],),
        "t2d": (cfg["vocab_size"],)})
    return GivenHead(path, key, "eagle", cfg, weights, shapes, methods.DEFAULT_METHOD, methods.DEFAULT_LAYER,
                     int(hidden), int(cfg["vocab_size"]), int(cfg["draft_vocab_size"]),
                     tuple(aux) if aux else None, None, {"hidden_size": hidden_field, "vocab_size": "vocab_size"})


def target_problem(head: GivenHead, target_config: Mapping[str, Any] | None, target: str) -> str | None:
    """Why ``head`` is no head of the target whose config.json is ``target_config`` (a dict; None: not readable, the
    compat report checks it then), named ``target`` in the message (``target.path /models/x``): its hidden size,
    vocabulary or verifier architecture differ (both values and the file and field each came from), or its aux
    layer ids are not the target's layers. One line, or None.
    """
    if not target_config:
        return None
    text = target_config.get("text_config") if isinstance(target_config.get("text_config"), dict) else target_config
    mine = f"{head.key} {head.path}"
    cfg_file = f"{head.path}/config.json"
    for what, ours, theirs in (("hidden size", head.hidden_size, text.get("hidden_size")),
                               ("vocabulary", head.vocab_size, text.get("vocab_size"))):
        field_ = head.fields["hidden_size" if what == "hidden size" else "vocab_size"]
        if theirs is not None and ours != theirs:
            return (f"{mine} is a head for another target: its {what} {ours} ({cfg_file} {field_}) is not the target's "
                    f"{theirs} ({target}: config.json {'hidden_size' if what == 'hidden size' else 'vocab_size'})")
    arch = target_config.get("architectures")
    if head.verifier_architectures and arch and not set(head.verifier_architectures) & set(arch):
        return (f"{mine} is a head for another target: its verifier is a {', '.join(head.verifier_architectures)} "
                f"({cfg_file} {head.fields['verifier']}), the target a {', '.join(arch)} ({target}: config.json "
                "architectures)")
    n = num_decoder_layers(dict(target_config))
    if n is not None and head.aux_layer_ids is not None:
        try:
            check_aux_layer_ids(list(head.aux_layer_ids), n)
        except ValueError as e:
            return f"{mine}: the aux layer ids of its config.json: {e} ({target}: {n} decoder layers in its config.json)"
    return None


def draft_problem(head: GivenHead, method: str, layer: str) -> str | None:
    """Why ``head`` is not a head of the run's draft, config ``draft.method`` ``method`` and ``draft.layer``
    ``layer`` (the benchmark, pre-flight and serving read them as the head's); one line naming both, or None."""
    if head.method != method:
        return (f"{head.key} {head.path} is a {head.method} head ({head.path}/config.json) but draft.method is "
                f"{method}: set draft.method: {head.method}")
    if head.layer != layer:
        return (f"{head.key} {head.path} is a head of the {head.layer} draft layer ({head.path}/config.json) but "
                f"draft.layer is {layer}: set draft.layer: {head.layer}")
    return None


def as_speculators(head: GivenHead, target_dir: str | os.PathLike, work: str | os.PathLike) -> Path:
    """A folder holding ``head`` in speculators' format: its own folder (speculators' format), or (the EAGLE format)
    the one speculators' converter writes into the new folder ``work`` for the target ``target_dir`` (its config
    read there: no network), given the aux ids the head reads (``aux_ids_for`` the target's layers) and its
    ``norm_before_residual`` (the converter takes it as an argument; the other head flags it reads from the config
    itself). Tensors of the source that the converter's model has no place for but speculators' format keeps
    (``input_norm.weight`` of a ``norm_before_fc`` head: the converter's legacy model has no input norm) are carried
    into the converted file unchanged: the converter cannot, and vLLM would otherwise build that norm of ones.

    Raises:
        GivenHeadError: the converter fails (its error named).
    """
    if head.format == "speculators":
        return head.path
    target_config = json.loads((Path(target_dir) / "config.json").read_text())
    aux = head.aux_ids_for(num_decoder_layers(target_config))
    out = Path(work)
    try:
        from speculators.convert.eagle.eagle3_converter import Eagle3Converter

        Eagle3Converter().convert(head.path, out, os.fspath(target_dir), validate=False,
                                  norm_before_residual=bool(head.config.get("norm_before_residual", False)),
                                  eagle_aux_hidden_state_layer_ids=aux)
    except Exception as e:  # noqa: BLE001 - any failure of the converter is the finding
        raise GivenHeadError(f"{head.key} {head.path}: speculators' converter failed: {type(e).__name__}: {e}") from e
    _carry_tensors(head, out)
    return out


CARRIED = ("input_norm.weight",)  # what speculators' format keeps and the converter's legacy model drops


def _carry_tensors(head: GivenHead, out: Path) -> None:
    from safetensors.torch import load_file, save_file

    from .. import atomic

    if head.weights.suffix == ".safetensors":
        src = load_file(os.fspath(head.weights))
    else:
        import torch

        src = torch.load(head.weights, map_location="cpu", weights_only=True)
    carried = {k: v for k, v in src.items() if k in CARRIED}
    if not carried:
        return
    state = load_file(os.fspath(out / "model.safetensors"))
    carried = {k: v for k, v in carried.items() if k not in state}
    if carried:
        with atomic.atomic_path(out / "model.safetensors") as tmp:
            save_file({**state, **carried}, os.fspath(tmp), metadata={"format": "pt"})


def load_state(folder: str | os.PathLike) -> dict:
    """The tensors of a head folder in speculators' format (``as_speculators``'s): name -> torch tensor."""
    from safetensors.torch import load_file

    return load_file(os.fspath(Path(folder) / "model.safetensors"))
