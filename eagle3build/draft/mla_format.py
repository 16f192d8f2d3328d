"""The MLA draft head's format (``draft.layer: mla``, the ``MLA`` layer of eagle3build/draft/mla.py): its layer
config keys, tensor shapes, the ``config.json`` vLLM serves it from and what a target needs for it (shared layer; no
torch: planning and the head checks import it through the registry).

Trained, the head is speculators' EAGLE-3 checkpoint (``Eagle3DraftModel.save_pretrained``: ``config.json`` with
``speculators_model_type: eagle3`` and a ``deepseek_v3`` ``transformer_layer_config``; ``mla_layer`` registers the
layer). Exported, it is the layout vLLM's ``Eagle3DeepseekV3ForCausalLM`` loads (``served_config``), a plain
EAGLE-3 draft config rather than speculators' format: vLLM's speculators config parser serves EAGLE-3 heads of
llama and qwen3 layers only and refuses any other (vllm/transformers_utils/configs/speculators/algos.py,
``update_eagle3``: ``raise ValueError(f"Unsupported model_type {model_type} for Eagle3 speculator")``, line 45 in
vLLM 0.32; the same map in 0.26). A config without ``speculators_config`` is read by transformers' ``AutoConfig``
and wrapped in vLLM's ``EAGLEConfig`` for ``method: eagle3`` (vllm/transformers_utils/configs/eagle.py), whose
architecture ``Eagle3DeepseekV3ForCausalLM`` is vllm/model_executor/models/deepseek_eagle3.py. Its ``model_type`` is
``deepseek_v2`` (``SERVED_MODEL_TYPE``), not the layer's ``deepseek_v3``: vLLM turns every draft config of model type
``deepseek_v3`` into a DeepSeek MTP drafter (vllm/config/speculative.py, ``SpeculativeConfig.hf_config_override``,
lines 679-691 in 0.32: ``model_type = "deepseek_mtp"``, architectures ``["DeepSeekMTPModel"]``), and then refuses
it ("Model architectures ['Eagle3DeepSeekMTPModel'] are not supported"). ``deepseek_v2`` has the same MLA fields
(transformers' ``DeepseekV2Config``), is MLA to vLLM (transformers_utils/model_arch_config_convertor.py,
``is_deepseek_mla``) and is left as it is; the published Kimi-K2.5 MLA head (lightseekorg/kimi-k2.5-eagle3-mla)
takes ``kimi_k2``, which vLLM reads as its ``DeepseekV3Config`` (transformers_utils/config.py) but transformers
does not know. vLLM's MLA rope is the interleaved one transformers' ``rope_interleave`` trains
(deepseek_v2.py: ``get_rope(..., is_neox_style=False)``, whatever the model type).

The rope (``served_rope_parameters``) is written so that the two vLLM versions in use read what transformers trained:

- vLLM 0.26 (the GPU route) ignores ``rope_parameters`` in its DeepSeek EAGLE-3 layer: it reads the config's
  ``rope_scaling`` and, where that is truthy, serves ``rope_scaling`` with ``rope_type: deepseek_yarn`` (its
  ``factor`` and ``original_max_position_embeddings`` required); else ``{"rope_type": "default"}`` with get_rope's default base
  10000, whatever the config's theta (vllm/model_executor/models/deepseek_eagle3.py,
  ``DeepseekV2Eagle3DecoderLayer.__init__``, lines 61 and 72-77 in 0.26.0; layers/rotary_embedding/__init__.py,
  ``get_rope``: ``base = rope_parameters.get("rope_theta", 10000)``, line 64, and ``rope_parameters["factor"]``,
  line 285). Under transformers 5 ``rope_scaling`` is a property that returns ``rope_parameters``
  (transformers/configuration_utils.py, ``PreTrainedConfig.rope_scaling``, line 549 in 5.17), which holds at least
  ``rope_theta``: so 0.26 takes the YaRN branch for every head, and a head without ``factor`` fails there with
  ``KeyError: 'factor'`` (seen on an H100, 2026-12-06).
- vLLM 0.32 (the CPU build) reads ``rope_parameters``: ``default`` stays default, any other type becomes
  ``deepseek_yarn``, or ``deepseek_llama_scaling`` where ``attention_factor`` is 1.0 (deepseek_v2.py,
  ``DeepseekV2MLAAttention.__init__``, lines 1115-1120 in 0.32.0).

So a target without rope scaling keeps ``rope_type: default`` and its theta, and gains ``factor`` 1.0 and
``original_max_position_embeddings``: 0.32 serves the default rope; 0.26 serves YaRN of factor 1, which is the
default rope (the interpolated and extrapolated frequencies are the same, and every mscale is 1 at factor 1:
``yarn_get_mscale``), with the config's theta. A YaRN target (DeepSeek-V3, Kimi-K2/K2.5) keeps its YaRN
parameters whole (factor, original_max_position_embeddings, mscale, mscale_all_dim, beta_fast, beta_slow, theta),
which both versions serve as ``deepseek_yarn`` as transformers' ``yarn`` trained them (the same frequencies, cos/sin
scale and softmax mscale: modeling_rope_utils ``_compute_yarn_parameters``, deepseek_v3 ``yarn_apply_mscale``).
Other rope types are refused when the draft layer is built (``check_rope``).
"""

from __future__ import annotations

MODEL_TYPE = "deepseek_v3"  # the MLA layer config's model_type in training (transformers' DeepseekV3Config)
SERVED_MODEL_TYPE = "deepseek_v2"  # the exported head's (the module docstring says why)
SERVED_ARCHITECTURE = "Eagle3DeepseekV3ForCausalLM"  # vllm/model_executor/models/registry.py
# The target's multi-head latent attention config fields the draft layer copies (DeepSeek-V2/V3, Kimi-K2/K2.5)
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# The head flags vLLM's DeepSeek EAGLE-3 model reads (deepseek_eagle3.py: norm_before_residual, fc_norm,
# norm_output); it has no ``input_norm``, so ``norm_before_fc`` is always off for an MLA head (the registry's
# ``MLA.flags``).
SERVED_FLAGS = ("norm_before_residual", "fc_norm", "norm_output")
# The rope types an MLA draft is trained with and served as (the module docstring says why no other).
ROPE_TYPES = ("default", "yarn")
# YaRN's keys that vLLM's deepseek_yarn rope reads (vllm/model_executor/layers/rotary_embedding/__init__.py, get_rope)
YARN_KEYS = ("factor", "original_max_position_embeddings", "mscale", "mscale_all_dim", "beta_fast", "beta_slow")


def layer_config(cfg: dict) -> dict:
    """The decoder layer config of a head's ``config.json`` ``cfg``: speculators' ``transformer_layer_config``
    (a trained checkpoint, a llama head), or the config itself (an exported MLA head, ``served_config``)."""
    return cfg.get("transformer_layer_config", cfg)


def is_mla_config(cfg: dict) -> bool:
    """Whether a head's or checkpoint's ``config.json`` ``cfg`` is of an MLA layer: its layer config
    (``layer_config``) has a ``kv_lora_rank`` (multi-head latent attention)."""
    return bool(layer_config(cfg).get("kv_lora_rank"))


def expected_shapes(cfg: dict, num_aux: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of an MLA head with config ``cfg`` (a checkpoint's or an exported head's
    ``config.json``) and ``num_aux`` aux layers. H hidden, V the target vocab, D ``draft_vocab_size``, A
    ``num_aux``, n heads, r_q / r_kv the q / kv LoRA ranks, d_nope / d_rope / d_v the head dims, I the MLP width:
    ``fc.weight`` (H, A*H), ``norm.weight`` (H,), ``lm_head.weight`` (D, H), ``d2t`` (D,), ``t2d`` (V,),
    ``embed_tokens.weight`` (V, H), and layer 0 (vLLM's names, deepseek_eagle3.py, with its ``midlayer.`` as
    ``layers.0.``): ``self_attn.q_a_proj`` (r_q, 2H), ``q_a_layernorm`` (r_q,), ``q_b_proj`` (n*(d_nope+d_rope),
    r_q) (``q_proj`` (n*(d_nope+d_rope), 2H) without a q rank), ``kv_a_proj_with_mqa`` (r_kv+d_rope, 2H),
    ``kv_a_layernorm`` (r_kv,), ``kv_b_proj`` (n*(d_nope+d_v), r_kv), ``o_proj`` (H, n*d_v), the dense
    ``mlp.gate_proj``/``up_proj`` (I, H) and ``down_proj`` (H, I), ``input_layernorm``, ``hidden_norm`` and
    ``post_attention_layernorm`` (H,).
    """
    tl = layer_config(cfg)
    H, V, D, A = tl["hidden_size"], tl["vocab_size"], cfg["draft_vocab_size"], num_aux
    n, inter = tl["num_attention_heads"], tl["intermediate_size"]
    rq, rkv = tl.get("q_lora_rank"), tl["kv_lora_rank"]
    nope, rope, v = tl["qk_nope_head_dim"], tl["qk_rope_head_dim"], tl["v_head_dim"]
    p = "layers.0."
    shapes = {"fc.weight": (H, A * H), "norm.weight": (H,), "lm_head.weight": (D, H), "d2t": (D,), "t2d": (V,),
              "embed_tokens.weight": (V, H),
              p + "self_attn.kv_a_proj_with_mqa.weight": (rkv + rope, 2 * H),
              p + "self_attn.kv_a_layernorm.weight": (rkv,), p + "self_attn.kv_b_proj.weight": (n * (nope + v), rkv),
              p + "self_attn.o_proj.weight": (H, n * v),
              p + "mlp.gate_proj.weight": (inter, H), p + "mlp.up_proj.weight": (inter, H),
              p + "mlp.down_proj.weight": (H, inter),
              p + "input_layernorm.weight": (H,), p + "hidden_norm.weight": (H,),
              p + "post_attention_layernorm.weight": (H,)}
    if rq:
        shapes.update({p + "self_attn.q_a_proj.weight": (rq, 2 * H), p + "self_attn.q_a_layernorm.weight": (rq,),
                       p + "self_attn.q_b_proj.weight": (n * (nope + rope), rq)})
    else:
        shapes[p + "self_attn.q_proj.weight"] = (n * (nope + rope), 2 * H)
    return shapes


def rope_problem(rope: dict | None) -> str | None:
    """Why an MLA draft layer cannot be trained and served with the rope parameters ``rope`` (a transformers
    config's ``rope_parameters``, or a legacy ``rope_scaling`` with ``type``), in words; None where it can
    (``check_rope``'s conditions)."""
    rope = dict(rope or {})
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind not in ROPE_TYPES:
        return (f"rope_type {kind!r} is not one an MLA draft is served with by vLLM's DeepSeek EAGLE-3 layer "
                f"({', '.join(ROPE_TYPES)})")
    if kind == "yarn":
        missing = [k for k in ("factor", "original_max_position_embeddings") if rope.get(k) is None]
        if missing:
            return f"YaRN rope_parameters without {', '.join(missing)}"
    if "attention_factor" in rope:
        return (f"rope_parameters.attention_factor {rope['attention_factor']!r}: vLLM 0.26 and 0.32 read it "
                "differently (deepseek_yarn against deepseek_llama_scaling)")
    return None


def check_rope(rope: dict | None, where: str) -> dict:
    """The rope parameters ``rope`` (a transformers config's standardised ``rope_parameters``: ``rope_type``,
    ``rope_theta`` and the type's keys) of an MLA draft layer, with a legacy ``type`` key folded into
    ``rope_type``: a copy.

    Raises:
        ValueError: a rope type other than ``default`` or ``yarn`` (``ROPE_TYPES``), a YaRN without ``factor`` or
            ``original_max_position_embeddings``, or an ``attention_factor`` (vLLM 0.32 would serve YaRN with
            attention factor 1.0 as llama scaling, 0.26 as YaRN): ``rope_problem``; ``where`` names the config.
    """
    problem = rope_problem(rope)
    if problem:
        raise ValueError(f"{where}: {problem}; use draft.layer llama")
    rope = dict(rope or {})
    legacy = rope.pop("type", None)
    rope.setdefault("rope_type", legacy or "default")
    return rope


def served_rope_parameters(layer: dict) -> dict:
    """The exported MLA head's ``rope_parameters`` for its trained layer config ``layer`` (a dict with
    ``rope_parameters``, ``max_position_embeddings``): the trained ones (``check_rope``), and for ``default`` also
    ``factor`` 1.0 and ``original_max_position_embeddings`` = ``max_position_embeddings``, the identity YaRN that
    vLLM 0.26 serves as the default rope (the module docstring gives both versions' rules, file and line).

    Raises:
        ValueError: as ``check_rope``.
    """
    rope = check_rope(layer.get("rope_parameters"), "the MLA draft layer config")
    rope.setdefault("rope_theta", layer.get("rope_theta", 10000.0))
    if rope["rope_type"] == "default":
        rope.update(factor=1.0, original_max_position_embeddings=int(layer["max_position_embeddings"]))
    return rope


# Keys of the speculators-saved layer config that describe this process's training, not the head.
_TRAINING_ONLY = ("_attn_implementation", "_attn_implementation_autoset", "_name_or_path", "torch_dtype",
                  "transformers_version", "use_cache")


def served_config(cfg: dict, aux_layer_ids: list[int], dtype: str) -> dict:
    """The exported MLA head's ``config.json`` from the speculators checkpoint's ``cfg`` (not changed): its layer
    config (the MLA ranks, one dense layer) at the top level as ``SERVED_MODEL_TYPE``, ``architectures``
    ``[SERVED_ARCHITECTURE]``, ``draft_vocab_size``, the aux layers as vLLM's model runner reads them
    (``eagle_aux_hidden_state_layer_ids``, v1/worker/gpu_model_runner.py) and as the draft sizes its ``fc``
    (``num_aux_hidden_states``, ``target_hidden_size``: deepseek_eagle3.py), the flags it reads
    (``SERVED_FLAGS``) and ``norm_before_fc`` false, ``dtype``, and the rope as both vLLM versions read it
    (``served_rope_parameters``). No verifier: the config names no path (``head_meta.json`` records the served name).

    Raises:
        ValueError: a rope vLLM's DeepSeek EAGLE-3 layer cannot serve as trained (``check_rope``).
    """
    tl = {k: v for k, v in layer_config(cfg).items() if k not in _TRAINING_ONLY and k not in ("rope_scaling", "rope_theta")}
    tl["rope_parameters"] = served_rope_parameters(layer_config(cfg))
    out = {**tl, "architectures": [SERVED_ARCHITECTURE], "model_type": SERVED_MODEL_TYPE,
           "draft_vocab_size": cfg["draft_vocab_size"], "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
           "num_aux_hidden_states": len(aux_layer_ids), "target_hidden_size": tl["hidden_size"],
           "norm_before_fc": False, "dtype": dtype}
    out.update({k: bool(cfg.get(k, False)) for k in SERVED_FLAGS})
    return out


def target_problem(target_config: dict) -> str | None:
    """Why an MLA draft layer cannot be built for a target of ``config.json`` ``target_config`` (read as JSON at
    planning; a multimodal wrapper's ``text_config``, Kimi-K2.5's, is the text model's): no multi-head latent
    attention (no ``kv_lora_rank``), or a rope the layer is not served with (``rope_problem`` of its
    ``rope_parameters``, else its legacy ``rope_scaling``); None where it can be built."""
    text = target_config.get("text_config") if isinstance(target_config.get("text_config"), dict) else target_config
    if not text.get("kv_lora_rank"):
        return "has no multi-head latent attention (no kv_lora_rank in its config.json)"
    problem = rope_problem(text.get("rope_parameters") or text.get("rope_scaling"))
    return f"has a rope the MLA draft layer is not served with: {problem}" if problem else None
