"""The EAGLE-3 draft head as a model: built for a target, and written as vLLM serves it (shared layer).

``build_model`` makes speculators' model of a ``choice.Draft`` for a target (``train_draft`` trains it; the
pre-flight bound serves an untrained one to time a draft step), and ``write_untrained_head`` writes a head of
random weights in the exported format (``Draft.served_config``, the config export writes).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from .choice import Draft, resolve
from .head_format import HEAD_VARIANTS, Head, expected_shapes


def build_model(
    target_dir: str,
    aux_layer_ids: list[int],
    d2t: torch.Tensor,
    t2d: torch.Tensor,
    ttt_steps: int,
    head_variant: str,
    device: str,
    *,
    trust_remote_code: bool,
    draft: Draft | None = None,
):
    """speculators' draft model of ``draft`` (a ``choice.Draft``; None: the default, eagle3 with the llama layer)
    for ``target_dir``, fp32 weights on ``device``, made by the method's class's own ``from_training_args``:
    ``eagle3`` (``Eagle3DraftModel``: 1 llama decoder layer, full attention), ``peagle`` (``PEagleDraftModel``: the
    same layer, all ``num_depths`` tokens in one forward; its embedding table trains), ``dflash``
    (``DFlashDraftModel``: 5 qwen3 layers, bidirectional, a block of ``block_size`` tokens per forward; no
    embedding of its own), with the draft's options in place of those defaults (``Draft.spec``).

    ``d2t`` (``[draft_vocab]`` int64, target id minus draft id) and ``t2d`` (``[target_vocab]``
    bool) are build_vocab_map's map; ``aux_layer_ids`` the target layers whose hidden states
    the ``fc`` fuses (EAGLE-3, arXiv:2503.01840 §3.2); ``head_variant`` a ``HEAD_VARIANTS`` key (its norm flags
    as ``Draft.head_flags`` gives them). The verifier's lm_head/norm are loaded from the target (frozen);
    the draft ``lm_head`` starts as the target's rows selected by ``t2d``. Beside the shared arguments the model
    gets its method's ``model_kwargs``: eagle3 the TTT steps (``ttt_steps``), P-EAGLE and DFlash speculators'
    ``resolve_mask_token_id`` (the tokenizer's mask token, an added one where the embedding has spare rows, else
    pad/eos/unk: SmolLM2 gets its pad token). The decoder layer is the draft's (``DraftLayer.layer_config``):
    speculators' CLI layer of the method (llama), or the MLA layer ``mla_layer`` registers in speculators' decoder
    components, its config made from the target's MLA fields by ``mla_layer.draft_layer_config``.
    ``trust_remote_code``: the job's ``target.trust_remote_code`` (no default: the key's declaration is above this
    package).

    Raises:
        KeyError: ``head_variant`` is not a ``HEAD_VARIANTS`` key.
        ValueError: ``mla`` for a target without MLA, or with a rope it is not served with.
    """
    draft = draft or resolve()
    cls = draft.speculators_class()
    spec = draft.spec()
    tl = draft.layer.layer_config(spec, target_dir, trust_remote_code)
    kw = dict(verifier_config=tl, t2d=t2d, d2t=d2t, verifier_name_or_path=target_dir,
              draft_vocab_size=int(d2t.shape[0]), target_layer_ids=list(aux_layer_ids),
              draft_attn_impl="simple_flex_attention" if device.startswith("cuda") else "sdpa",
              trust_remote_code=trust_remote_code, **spec["args"])
    kw.update(draft.head_flags(HEAD_VARIANTS[head_variant]))
    kw.update(draft.method.model_kwargs(target_dir, tl.vocab_size, ttt_steps, trust_remote_code))
    return cls.from_training_args(**kw).to(device)


TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def write_untrained_head(target_dir: str, out_dir: str | os.PathLike, *, aux_layer_ids: list[int],
                         draft_vocab_size: int, head_variant: str, served_name: str, dtype: str,
                         trust_remote_code: bool, seed: int, draft: Draft | None = None) -> Head:
    """Write to the new folder ``out_dir`` an EAGLE-3 head for ``target_dir`` with random weights (``seed``), in
    the exported format (``config.json`` from ``Draft.served_config`` and ``model.safetensors`` in ``dtype``): the
    shapes and kernels of a trained head, so vLLM's step with it costs what a trained head's step costs, while
    its drafts are almost never accepted (τ near 1). Its draft vocabulary is the target's first
    ``draft_vocab_size`` token ids (``d2t`` zeros, ``t2d`` true below ``draft_vocab_size``). ``draft``: the head's
    kind (``build_model``; the pre-flight's: ``Draft.bound_drafts``). Returns the written head (``Head``, of the
    config written: not read again).

    Raises:
        ValueError: ``draft_vocab_size`` outside 1..the target's vocab size; the draft's layer as ``build_model``.
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
                        draft=draft)
    out = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="eagle3-head-") as tmp:
        model.save_pretrained(tmp)
        cfg = json.loads((Path(tmp) / "config.json").read_text())
        state = load_file(str(Path(tmp) / "model.safetensors"))
    cfg = (draft or resolve()).served_config(cfg, served_name, dtype)
    keep = expected_shapes(cfg)  # the exported tensors (no verifier copies)
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_file({k: (v.to(TORCH_DTYPES[dtype]) if v.is_floating_point() else v).contiguous()
               for k, v in state.items() if k in keep}, str(out / "model.safetensors"), metadata={"format": "pt"})
    return Head.of(out, cfg)
