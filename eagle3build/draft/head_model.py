"""The EAGLE-3 draft head as a model: built for a target, and written as vLLM serves it (shared layer).

``build_model`` makes speculators' ``Eagle3DraftModel`` for a target (``train_draft`` trains it; the
pre-flight bound serves an untrained one to time a draft step); ``served_config`` turns the config
speculators saves into the one the exported head ships (``export_head``; the pre-flight bound's
untrained head), and ``write_untrained_head`` writes a head of random weights in that format.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from . import methods as draft_methods
from .head_format import HEAD_VARIANTS, aux_layer_ids, expected_shapes
from .methods import DEFAULT_LAYER, DEFAULT_METHOD
from .servable import head_config_fields


def resolved_options(method: str, options: Mapping[str, Any] | None = None) -> dict:
    """Every option of ``method`` (``draft_methods.DraftMethod.options``) with its value: ``options`` where given,
    else speculators' default (``method_spec``'s errors)."""
    return draft_methods.get(method).resolved_options(options)


def method_spec(method: str, options: Mapping[str, Any] | None = None) -> dict:
    """``{"arch", "layers", "args"}`` of ``method`` with the user's ``options`` (``draft.<method>.*``: P-EAGLE
    ``num_depths``; DFlash ``block_size``, ``num_layers``) in place of speculators' defaults (the registry,
    ``draft_methods``).

    Raises:
        ValueError: ``method`` is not a registered method, or an option is not one of the method's.
    """
    return draft_methods.get(method).spec(options)


def method_flags(method: str, head_variant: str, layer: str = DEFAULT_LAYER) -> dict[str, bool]:
    """The speculators config flags a head of ``method`` and draft layer ``layer`` (config ``draft.layer``) is
    built with for ``head_variant`` (a ``HEAD_VARIANTS`` key): the variant's with the method's own over them
    (``draft_methods.DraftMethod.flags``: P-EAGLE turns ``norm_output``, ``fc_norm`` and ``norm_before_fc`` off;
    DFlash has none) and the layer's over those (``draft_methods.DraftLayer.flags``: MLA turns ``norm_before_fc``
    off).

    Raises:
        KeyError: ``head_variant`` is not a ``HEAD_VARIANTS`` key.
        ValueError: ``method`` is not a registered method, or ``layer`` not one of its layers.
    """
    return draft_methods.get(method).head_flags(HEAD_VARIANTS[head_variant], layer)


def method_class(method: str):
    """speculators' model class of draft ``method``.

    Raises:
        ValueError: ``method`` is not a registered method.
    """
    return draft_methods.get(method).speculators_class()


def build_model(
    target_dir: str,
    aux_layer_ids: list[int],
    d2t: torch.Tensor,
    t2d: torch.Tensor,
    ttt_steps: int,
    head_variant: str,
    device: str,
    trust_remote_code: bool = False,
    method: str = DEFAULT_METHOD,
    method_options: Mapping[str, Any] | None = None,
    layer: str = DEFAULT_LAYER,
):
    """speculators' draft model of ``method`` (``draft_methods.METHODS``) for ``target_dir``, fp32 weights on ``device``, made
    by the class's own ``from_training_args``: ``eagle3`` (``Eagle3DraftModel``: 1 llama decoder layer, full
    attention), ``peagle`` (``PEagleDraftModel``: the same layer, all ``num_depths`` tokens in one forward; its
    embedding table trains), ``dflash`` (``DFlashDraftModel``: 5 qwen3 layers, bidirectional, a block of
    ``block_size`` tokens per forward; no embedding of its own). ``method_options``: the method's knobs in
    place of those defaults (``method_spec``).

    ``d2t`` (``[draft_vocab]`` int64, target id minus draft id) and ``t2d`` (``[target_vocab]``
    bool) are build_vocab_map's map; ``aux_layer_ids`` the target layers whose hidden states
    the ``fc`` fuses (EAGLE-3, arXiv:2503.01840 §3.2); ``head_variant`` a ``HEAD_VARIANTS`` key (its norm flags
    as ``method_flags`` gives them). The verifier's lm_head/norm are loaded from the target (frozen);
    the draft ``lm_head`` starts as the target's rows selected by ``t2d``. P-EAGLE and DFlash get speculators'
    ``resolve_mask_token_id`` (the tokenizer's mask token, an added one where the embedding has spare rows,
    else pad/eos/unk: SmolLM2 gets its pad token). ``ttt_steps`` reaches eagle3 only. ``layer`` (config
    ``draft.layer``, ``draft_methods.LAYERS``): ``llama`` (the decoder layer speculators' CLI gives the method) or
    ``mla`` (eagle3 only: the same ``Eagle3DraftModel`` with the MLA layer ``mla_layer`` registers in speculators'
    decoder components, its config made from the target's MLA fields by ``mla_layer.draft_layer_config``).

    Raises:
        KeyError: ``head_variant`` is not a ``HEAD_VARIANTS`` key.
        ValueError: ``method`` is not a registered method; ``layer`` not a registered layer, not one of the
            method's, or ``mla`` for a target without MLA.
    """
    m = draft_methods.get(method)
    lay = m.layer(layer)
    cls = m.speculators_class()
    spec = m.spec(method_options)
    flags = m.head_flags(HEAD_VARIANTS[head_variant], layer)
    tl = (lay.layer_config(target_dir, spec["layers"], trust_remote_code) if lay.layer_config
          else _cli_layer_config(target_dir, spec, trust_remote_code))
    kw = dict(verifier_config=tl, t2d=t2d, d2t=d2t, verifier_name_or_path=target_dir,
              draft_vocab_size=int(d2t.shape[0]), target_layer_ids=list(aux_layer_ids),
              draft_attn_impl="simple_flex_attention" if device.startswith("cuda") else "sdpa",
              trust_remote_code=trust_remote_code, **spec["args"])
    kw.update(flags)
    if m.uses_ttt_steps:
        kw["ttt_steps"] = ttt_steps
    else:
        from speculators.train.utils import resolve_mask_token_id

        kw["mask_token_id"] = resolve_mask_token_id(target_dir, tl.vocab_size, trust_remote_code=trust_remote_code)
    return cls.from_training_args(**kw).to(device)


def _cli_layer_config(target_dir: str, spec: dict, trust_remote_code: bool):
    """speculators' CLI layer config (``create_transformer_layer_config``) of the method's architecture and layer
    count (``spec``: ``method_spec``'s), every layer full attention."""
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
    # No sliding window anywhere, so no engine can read one from the exported config.
    tl.sliding_window = None
    tl.use_sliding_window = False
    return tl


def trainer_kwargs(method: str, ttt_steps: int, ttt_step_loss_decay: float, loss_implementation: str,
                   method_options: Mapping[str, Any] | None = None) -> dict:
    """The keyword arguments of a training forward of ``method``'s model (``net(**row, **these)``): eagle3's
    TTT steps and decay with the ``kl_div`` loss; P-EAGLE's and DFlash's from their class's own
    ``get_trainer_kwargs`` (speculators' CLI route, spec/train/cli.py) with ``kl_div`` and
    ``loss_implementation`` (``eager`` | ``fused``) and speculators' defaults for the rest (P-EAGLE: depths,
    down-sampling, no anchor cap; DFlash: γ 4, 512 anchors, fixed exponential decay per position), with
    ``method_options`` (``method_spec``) in place of the method's defaults.

    Raises:
        ValueError: ``method`` is not a registered method.
    """
    from speculators.losses import resolve_loss_config

    m = draft_methods.get(method)
    if m.uses_ttt_steps:
        return {"ttt_steps": ttt_steps, "ttt_step_loss_decay": ttt_step_loss_decay,
                "loss_config": resolve_loss_config("kl_div", implementation=loss_implementation)}
    train_kw, _ = m.speculators_class().get_trainer_kwargs(loss_fn="kl_div", loss_implementation=loss_implementation,
                                                           **m.spec(method_options)["args"])
    return train_kw


def served_config(cfg: dict, served_name: str, dtype: str) -> dict:
    """The exported head's ``config.json`` from the one speculators' ``save_pretrained`` writes (``cfg``, not
    changed): the verifier named by ``served_name`` (no local path), ``transformer_layer_config`` with the aux
    layer count vLLM sizes the draft's ``fc`` from (``serving.head_config_fields``), no ``auto_map`` (it names a
    ``config.py`` that is not shipped; vLLM and speculators do not need it) and ``dtype`` (``bfloat16`` |
    ``float16`` | ``float32``). A head of a layer with a config of its own (``draft_methods.DraftLayer.served``:
    MLA, whose layer vLLM's speculators parser refuses) gets that instead: vLLM's ``Eagle3DeepseekV3ForCausalLM``
    config (``mla_format.served_config``), which names no verifier."""
    lay = draft_methods.layer_of(cfg)
    if lay.served:
        return lay.served(cfg, aux_layer_ids(cfg), dtype)
    out = json.loads(json.dumps(cfg))
    out["speculators_config"]["verifier"]["name_or_path"] = served_name
    if draft_methods.of_config(out).sizes_fc_from_fields:  # vLLM's DFlash sizes its fc from the aux ids themselves
        out["transformer_layer_config"].update(head_config_fields(aux_layer_ids(out)))
    out.pop("auto_map", None)
    out["dtype"] = dtype
    return out


TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def write_untrained_head(target_dir: str, out_dir: str | os.PathLike, *, aux_layer_ids: list[int],
                         draft_vocab_size: int, head_variant: str, served_name: str, dtype: str,
                         trust_remote_code: bool = False, seed: int = 0, layer: str = DEFAULT_LAYER) -> Path:
    """Write to the new folder ``out_dir`` an EAGLE-3 head for ``target_dir`` with random weights (``seed``), in
    the exported format (``config.json`` from ``served_config`` and ``model.safetensors`` in ``dtype``): the
    shapes and kernels of a trained head, so vLLM's step with it costs what a trained head's step costs, while
    its drafts are almost never accepted (τ near 1). Its draft vocabulary is the target's first
    ``draft_vocab_size`` token ids (``d2t`` zeros, ``t2d`` true below ``draft_vocab_size``). ``layer``: the draft
    layer (config ``draft.layer``, ``build_model``). Returns ``out_dir``.

    Raises:
        ValueError: ``draft_vocab_size`` outside 1..the target's vocab size; ``layer`` as ``build_model``.
        KeyError: ``head_variant`` is not a ``HEAD_VARIANTS`` key; ``dtype`` not in ``TORCH_DTYPES``.
    """
    import tempfile

    from safetensors.torch import load_file, save_file

    from ..target import load_config, text_config

    vocab = text_config(load_config(target_dir, trust_remote_code)).vocab_size
    if not 1 <= draft_vocab_size <= vocab:
        raise ValueError(f"draft vocab size {draft_vocab_size} is not within 1..{vocab} (the vocab of {target_dir})")
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[:draft_vocab_size] = True
    torch.manual_seed(seed)
    model = build_model(target_dir, aux_layer_ids, torch.zeros(draft_vocab_size, dtype=torch.int64), t2d,
                        ttt_steps=1, head_variant=head_variant, device="cpu", trust_remote_code=trust_remote_code,
                        layer=layer)
    out = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="eagle3-head-") as tmp:
        model.save_pretrained(tmp)
        cfg = json.loads((Path(tmp) / "config.json").read_text())
        state = load_file(str(Path(tmp) / "model.safetensors"))
    cfg = served_config(cfg, served_name, dtype)
    keep = expected_shapes(cfg)  # the exported tensors (no verifier copies)
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_file({k: (v.to(TORCH_DTYPES[dtype]) if v.is_floating_point() else v).contiguous()
               for k, v in state.items() if k in keep}, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
