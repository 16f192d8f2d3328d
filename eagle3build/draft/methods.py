"""The draft methods (config ``draft.method``): one ``DraftMethod`` per method holds everything it changes (shared
layer; no torch at import, planning reads it through ``config_spec``).

Each entry says, for its method as speculators and vLLM name it:

- its options (config ``draft.<method>.<option>``) with speculators' defaults, and the arguments of speculators'
  model it is built with (``arch``, ``layers``, ``args``): the one source of the config's ``draft`` section
  (``config_spec``) and of the model ``head_model`` builds;
- whether training rows are shifted (``shifted``) and which head flags it keeps (``head_flags``);
- speculators' class (``speculators_class``: the ``SpeculatorModel`` registry entry of its name) and what the
  model and a training forward are given beside the shared arguments (``model_kwargs``, ``uses_ttt_steps``);
- the tensors its exported head holds (``expected_shapes``) and the checks a checkpoint passes before export
  (``export_problem``, ``load_hint``);
- the ``speculative_config`` vLLM serves it with (``vllm_method``), whether vLLM sizes the drafter's ``fc`` from
  fields the exported config gets (``sizes_fc_from_fields``), and whether a k schedule may hold one k only
  (``one_k_schedule``);
- the draft positions it trains in one forward (``trained_positions``; None: one token a forward, any k);
- the decoder layers it may be built with (``layer_choices``, config ``draft.layer``: ``DraftLayer`` entries of
  ``LAYERS``, the second registry here; ``DEFAULT_LAYER`` is the layer speculators' CLI gives the method).

A ``DraftLayer`` holds what a decoder layer other than speculators' own changes: the head flags it forces, how its
layer config is built and registered in speculators (``layer_config``, ``register``), how its checkpoint and
exported head are recognised (``recognises``), the tensors it holds (``shapes``) and the config.json vLLM serves it
from (``served``). ``mla`` (eagle3 only) is DeepSeek-V3's multi-head latent attention (eagle3build/draft/mla_layer.py,
eagle3build/draft/mla_format.py).

The anchor is speculators' own split (speculators/train/config/schema.py: one typed group per method,
``PEagleArgs``, ``DFlashArgs``; each method's behaviour on its registered model class). A new method (one of
speculators' others) is one more ``DraftMethod`` here, a new decoder layer one more ``DraftLayer``. No module
branches on a method's or a layer's name outside this one (tests/test_draft_registry.py reads the tree for such
branches).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from . import mla_format

# The method of a head or run that names none: EAGLE-3, the only one before draft.method existed. Its saved
# states, train_meta.json and head_meta.json keep the bytes they had then (``recorded``).
DEFAULT_METHOD = "eagle3"
# The draft layer of a head or run that names none (config ``draft.layer``): the decoder layer speculators' CLI
# builds for the method (its ``arch``: llama for eagle3 and peagle, qwen3 for dflash). A run of it writes no
# ``layer`` into its saved states, train_meta.json and head_meta.json (their bytes from before draft.layer).
DEFAULT_LAYER = "llama"


@dataclass(frozen=True)
class DraftLayer:
    """A draft decoder layer (config ``draft.layer``; the module docstring). ``name``: the config's choice;
    ``summary``: the config doc's words for it. Every callable is None for ``DEFAULT_LAYER`` (speculators' own
    layer of the method's ``arch``)."""

    name: str
    summary: str
    flags: Mapping[str, bool] = field(default_factory=dict)  # head flags over the method's (vLLM reads no other)
    # (target_dir, num_layers, trust_remote_code) -> the draft's transformer_layer_config (imports torch)
    layer_config: Callable[[str, int, bool], Any] | None = None
    register: Callable[[], None] | None = None  # registers the layer in speculators' decoder components
    recognises: Callable[[Mapping[str, Any]], bool] | None = None  # a checkpoint's or exported head's config.json
    shapes: Callable[[Mapping[str, Any]], dict[str, tuple[int, ...]]] | None = None  # over the method's
    served: Callable[[Mapping[str, Any], list, str], dict] | None = None  # (cfg, aux ids, dtype) -> exported config
    # The version of ``served``'s format: export_head's ``version`` param carries it as ``layer_format`` where
    # draft.layer names this layer (contract.version), so a change re-exports its heads and no other build's.
    format_version: int = 0

    @property
    def recorded(self) -> bool:
        """Whether its runs write ``layer`` into saved states, train_meta.json and head_meta.json: every layer but
        ``DEFAULT_LAYER``."""
        return self.name != DEFAULT_LAYER

    @property
    def speculators_config(self) -> bool:
        """Whether its exported head's config.json is speculators' own (else vLLM's, ``served``; speculators then
        reloads the head with the checkpoint's config)."""
        return self.served is None


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


@dataclass(frozen=True)
class DraftMethod:
    """One draft method (the module docstring). ``name``: speculators' and vLLM's name (``speculators_model_type``
    of its head's config.json); ``summary``: the config doc's words for it."""

    name: str
    summary: str
    arch: str  # speculators' draft_arch of its decoder layers (speculators.train.cli.create_transformer_layer_config)
    args: Mapping[str, Any]  # speculators' method arguments that no option sets
    layers: int = 1  # decoder layers, where no option sets them
    options: tuple[Option, ...] = ()
    shifted: bool = True  # trained on shift_batch'ed rows (speculators/train/cli.py)
    flags: Mapping[str, bool] | None = field(default_factory=dict)  # head flags over the variant's; None: no flags
    uses_ttt_steps: bool = False  # ttt_steps reaches the model and its forward (else a mask token and the class's
    # own trainer kwargs: speculators' get_trainer_kwargs)
    vllm_method: Mapping[str, Any] = field(default_factory=dict)  # vLLM's speculative_config, less model and k
    sizes_fc_from_fields: bool = True  # vLLM sizes its fc from transformer_layer_config fields (serving.py)
    one_k_schedule: bool = False  # a k schedule may hold one k > 0 only (serve.k_schedule.parallel_k)
    fills_positions: bool = False  # drafts several positions in one forward (``trained_positions``)
    peer_route: bool = False  # speculators' own CLI trains it from this build's data (benchmarks/peer_route.py)
    shapes: Callable[[Mapping[str, Any]], dict[str, tuple[int, ...]]] | None = None
    problem: Callable[[Mapping[str, Any]], str] | None = None  # a config vLLM would serve otherwise than trained
    hint: Callable[[Mapping[str, Any]], str] | None = None  # why vLLM may fail to load a head of an older build
    layer_choices: tuple[str, ...] = (DEFAULT_LAYER,)  # config draft.layer values it is built with (``LAYERS``)

    @property
    def recorded(self) -> bool:
        """Whether its runs write the method into saved states, train_meta.json and head_meta.json: every method
        but ``DEFAULT_METHOD``, whose files keep the bytes they had before methods existed."""
        return self.name != DEFAULT_METHOD

    def spec(self, options: Mapping[str, Any] | None = None) -> dict:
        """``{"arch", "layers", "args"}`` with the user's ``options`` (``draft.<method>.*``) in place of the
        defaults.

        Raises:
            ValueError: an option is not one of the method's.
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

    def head_flags(self, variant_flags: Mapping[str, bool], layer: str = DEFAULT_LAYER) -> dict[str, bool]:
        """The speculators config flags its head is built with for a head variant of flags ``variant_flags``
        (``head_format.HEAD_VARIANTS``) and draft layer ``layer``: the variant's with the method's own over them
        and the layer's over those (MLA: ``norm_before_fc`` off); ``{}`` where the method's config has no such
        flags.

        Raises:
            ValueError: ``layer`` is not one of the method's (``layer``).
        """
        lay = self.layer(layer)
        return {} if self.flags is None else {**variant_flags, **self.flags, **lay.flags}

    def layer(self, name: str) -> DraftLayer:
        """The draft layer ``name`` (config ``draft.layer``) for a head of this method.

        Raises:
            ValueError: no such layer, or the method is not built with it (``layer_choices``).
        """
        lay = get_layer(name)
        if name not in self.layer_choices:
            raise ValueError(f"draft.layer {name} is built for draft.method "
                             f"{' or '.join(m.name for m in METHODS.values() if name in m.layer_choices)} only, "
                             f"not {self.name!r}")
        return lay

    def layer_for(self, name: str) -> str:
        """The draft layer a head of this method gets where the config says ``draft.layer: name``: ``name`` where
        the method is built with it, else ``DEFAULT_LAYER`` (a P-EAGLE or DFlash head of ``draft.compare_methods``
        beside an MLA eagle3 head keeps its own layer).

        Raises:
            ValueError: ``name`` is no registered layer.
        """
        get_layer(name)
        return name if name in self.layer_choices else DEFAULT_LAYER

    def speculators_class(self):
        """speculators' model class of the method (its ``SpeculatorModel`` registry entry; imports speculators),
        with each of its layers (``layer_choices``) registered in speculators' decoder components."""
        import speculators.models  # noqa: F401 - registers the model classes
        from speculators.model import SpeculatorModel

        for name in self.layer_choices:
            if LAYERS[name].register:
                LAYERS[name].register()
        return SpeculatorModel.registry[self.name]

    def speculative_config(self, model: str, k: int) -> dict:
        """vLLM's ``speculative_config`` serving a head of the method in folder ``model`` with ``k`` draft tokens
        a step."""
        return {**self.vllm_method, "model": model, "num_speculative_tokens": k}

    def trained_positions(self, cfg: Mapping[str, Any]) -> int | None:
        """Draft positions a head of speculators config ``cfg`` was trained to fill in one forward (its
        ``speculators_config.proposal_methods[0].speculative_tokens``: P-EAGLE ``num_depths``, DFlash
        ``block_size - 1``); None for a method of one token a forward, which serves any k.

        Raises:
            KeyError: ``cfg`` lacks the field.
        """
        if not self.fills_positions:
            return None
        return int(cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"])

    def draft_layer(self, cfg: Mapping[str, Any]) -> str:
        """The decoder layer of a head of config ``cfg`` (benchmark.json's ``draft_layer``): the name of its
        registered layer where that is not ``DEFAULT_LAYER`` (``mla``: the config's ``draft.layer`` choice, not
        the layer's model_type, which is ``deepseek_v3`` trained and ``deepseek_v2`` exported), else its
        ``transformer_layer_config.model_type`` (the architecture speculators built the layer as: ``llama``;
        ``qwen3`` for DFlash), else the method's ``arch``."""
        lay = layer_of(cfg)
        if lay.recorded:
            return lay.name
        return (cfg.get("transformer_layer_config") or {}).get("model_type") or self.arch

    def expected_shapes(self, cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape a head of config ``cfg`` must hold (``head_format.expected_shapes``): its layer's
        layout where the layer has its own (``DraftLayer.shapes``), else the method's."""
        lay = layer_of(cfg)
        return lay.shapes(cfg) if lay.shapes else self.shapes(cfg)

    def export_problem(self, cfg: Mapping[str, Any]) -> str:
        """Why a checkpoint of config ``cfg`` would be served otherwise than trained; ``""`` where it would not."""
        return self.problem(cfg) if self.problem else ""

    def load_hint(self, cfg: Mapping[str, Any]) -> str:
        """A hint for a head of config ``cfg`` that vLLM fails to load (a head of an older build); ``""``."""
        return self.hint(cfg) if self.hint else ""


def aux_layer_ids(cfg: Mapping[str, Any]) -> list[int]:
    """The aux layer ids of a head's speculators ``config.json`` ``cfg``: ``eagle_aux_hidden_state_layer_ids``
    (eagle3, peagle) or ``aux_hidden_state_layer_ids`` (dflash).

    Raises:
        KeyError: ``cfg`` holds neither.
    """
    if "eagle_aux_hidden_state_layer_ids" in cfg:
        return list(cfg["eagle_aux_hidden_state_layer_ids"])
    return list(cfg["aux_hidden_state_layer_ids"])


def _dims(cfg: Mapping[str, Any]) -> tuple:
    tl = cfg["transformer_layer_config"]
    H, heads = tl["hidden_size"], tl["num_attention_heads"]
    return (H, tl["vocab_size"], cfg["draft_vocab_size"], len(aux_layer_ids(cfg)), heads, tl["num_key_value_heads"],
            tl.get("head_dim") or H // heads, tl["intermediate_size"])


def _eagle3_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """speculators' ``Eagle3DraftModel`` (speculators/models/eagle3.py): H = ``transformer_layer_config.hidden_size``,
    V = its ``vocab_size`` (the target's), D = ``draft_vocab_size``, A = the number of aux layers: ``fc.weight``
    (H, A*H), ``lm_head.weight`` (D, H), ``d2t`` (D,) int64, ``t2d`` (V,) bool, one decoder layer whose attention
    reads [embed, hidden] (2H wide), ``input_norm.weight`` (A*H,) only with ``norm_before_fc``."""
    H, V, D, A, heads, kv, hd, inter = _dims(cfg)
    shapes = {
        "fc.weight": (H, A * H), "norm.weight": (H,), "lm_head.weight": (D, H), "d2t": (D,), "t2d": (V,),
        "embed_tokens.weight": (V, H),
        # the first draft layer attends over [embed, hidden] (2H wide)
        "layers.0.self_attn.q_proj.weight": (heads * hd, 2 * H), "layers.0.self_attn.k_proj.weight": (kv * hd, 2 * H),
        "layers.0.self_attn.v_proj.weight": (kv * hd, 2 * H), "layers.0.self_attn.o_proj.weight": (H, heads * hd),
        "layers.0.mlp.gate_proj.weight": (inter, H), "layers.0.mlp.up_proj.weight": (inter, H),
        "layers.0.mlp.down_proj.weight": (H, inter), "layers.0.input_layernorm.weight": (H,),
        "layers.0.hidden_norm.weight": (H,), "layers.0.post_attention_layernorm.weight": (H,),
    }
    if cfg.get("norm_before_fc"):
        shapes["input_norm.weight"] = (A * H,)
    return shapes


def _peagle_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """EAGLE-3's tensors and ``mask_hidden`` (1, 1, A*H), the state of its masked depths
    (speculators/models/peagle/core.py; vLLM's loader raises without it)."""
    H, _, _, A, *_ = _dims(cfg)
    return {**_eagle3_shapes(cfg), "mask_hidden": (1, 1, A * H)}


def _dflash_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """``fc.weight`` (H, A*H), ``hidden_norm.weight``, ``norm``, ``lm_head``, ``d2t``, ``t2d``, no embedding, and
    per layer of ``num_hidden_layers`` a qwen3 decoder layer over H (q/k norms of the head dim)
    (speculators/models/dflash/model_definitions.py)."""
    H, V, D, A, heads, kv, hd, inter = _dims(cfg)
    shapes = {"fc.weight": (H, A * H), "hidden_norm.weight": (H,), "norm.weight": (H,), "lm_head.weight": (D, H),
              "d2t": (D,), "t2d": (V,)}
    for i in range(cfg["transformer_layer_config"]["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (heads * hd, H), p + "self_attn.k_proj.weight": (kv * hd, H),
            p + "self_attn.v_proj.weight": (kv * hd, H), p + "self_attn.o_proj.weight": (H, heads * hd),
            p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (inter, H), p + "mlp.up_proj.weight": (inter, H),
            p + "mlp.down_proj.weight": (H, inter), p + "input_layernorm.weight": (H,),
            p + "post_attention_layernorm.weight": (H,)})
    return shapes


def _dflash_problem(cfg: Mapping[str, Any]) -> str:
    # vLLM applies dflash_config.causal = not sliding_window_non_causal to every layer, while training keeps
    # full-attention layers bidirectional (docs/design/peagle_dflash.md §3.3): only this layout serves as trained
    if cfg.get("sliding_window_non_causal") and not cfg.get("sample_from_anchor"):
        return ""
    return (f"a DFlash head must have sliding_window_non_causal true and sample_from_anchor false (got "
            f"{cfg.get('sliding_window_non_causal')}, {cfg.get('sample_from_anchor')}): vLLM would serve it "
            "otherwise than it was trained")


def _peagle_hint(cfg: Mapping[str, Any]) -> str:
    # a P-EAGLE head trained before its flags turned norm_before_fc off (PEAGLE.flags)
    if not cfg.get("norm_before_fc"):
        return ""
    return (" (this P-EAGLE head has norm_before_fc, which vLLM 0.26's parallel drafting cannot load on a GPU: "
            "llm_base_proposer.py's load_model runs its CUDA rms_norm on the 1-D mask_hidden. Heads trained "
            "now leave it off; retrain this one: snakemake --forcerun train_draft)")


EAGLE3 = DraftMethod(
    name="eagle3",
    summary="eagle3 (one token a forward, training-time test)",
    arch="llama", args={},
    uses_ttt_steps=True,
    vllm_method={"method": "eagle3"},
    peer_route=True,
    shapes=_eagle3_shapes,
    layer_choices=(DEFAULT_LAYER, "mla"),
)
# P-EAGLE: llama layers (speculators' CLI gives it qwen3; vLLM 0.26/0.32 serve it as ``PeagleLlamaForCausalLM``),
# speculators' num_depths 8 (peagle/core.py). Its flags: ``norm_output`` and ``fc_norm`` off, the two that vLLM's
# P-EAGLE config parser drops (vllm transformers_utils/configs/speculators/algos.py ``update_peagle``, 0.26 and 0.32:
# it keeps ``norm_before_residual`` and ``norm_before_fc`` only), so the head is served as trained, and
# ``norm_before_fc`` off too (speculators' own P-EAGLE default, models/peagle/core.py): vLLM 0.26 cannot load a
# parallel-drafting head with it on a GPU. Its drafter's ``load_model`` (vllm/v1/spec_decode/llm_base_proposer.py:1416)
# passes the 1-D ``mask_hidden.view(-1)`` through ``combine_hidden_states``, whose ``input_norm``
# (vllm/model_executor/models/llama_eagle3.py:368) runs vLLM's CUDA ``rms_norm`` (vllm/kernels/vllm_c.py:40) on a
# 1-D tensor: "Dimension out of range (expected to be in range of [-1, 0], but got -2)" (H200, 2026-12-04,
# benchmarks/gpu/kimi_h200.md). vLLM has no peagle method: its speculators parser serves it as EAGLE-3 with
# parallel drafting (vLLM 0.26-0.32 transformers_utils/configs/speculators/base.py).
PEAGLE = DraftMethod(
    name="peagle",
    summary="peagle (P-EAGLE: all k tokens in one forward)",
    arch="llama", args={},
    options=(Option("num_depths", {"type": "integer", "minimum": 2}, 8,
                    "P-EAGLE: draft positions trained in one forward (speculators' num_depths, models/peagle/core.py); "
                    "read where draft.method is peagle (changing it retrains under any method: it is in train_draft's "
                    "param)"),),
    flags={"norm_output": False, "fc_norm": False, "norm_before_fc": False},
    vllm_method={"method": "eagle3", "parallel_drafting": True},
    one_k_schedule=True,
    fills_positions=True,
    shapes=_peagle_shapes,
    hint=_peagle_hint,
)
# DFlash: 5 qwen3 layers (speculators' CLI default), block_size 8 (dflash/core.py); built bidirectional in every
# layer (all full attention, ``sliding_window_non_causal``), the one layout vLLM serves as trained
# (docs/design/peagle_dflash.md §3.3), and without ``sample_from_anchor`` (vLLM 0.26 does not read it). Rows are not
# shifted; its config has no head flags; vLLM's DFlash sizes its fc from the aux ids themselves (qwen3_dflash.py).
DFLASH = DraftMethod(
    name="dflash",
    summary="dflash (a block of tokens in one forward over the target's context)",
    arch="qwen3", args={"sliding_window_non_causal": True, "sample_from_anchor": False},
    options=(Option("block_size", {"type": "integer", "minimum": 2}, 8,
                    "DFlash: tokens per drafted block, the anchor and block_size - 1 drafts (speculators' block_size, "
                    "models/dflash/core.py); read where draft.method is dflash (changing it retrains under any "
                    "method)"),
             Option("num_layers", {"type": "integer", "minimum": 1}, 5,
                    "DFlash: decoder layers of the draft (speculators' CLI default 5); read where draft.method is "
                    "dflash (changing it retrains under any method)", goes_to="layers")),
    shifted=False,
    flags=None,
    vllm_method={"method": "dflash"},
    sizes_fc_from_fields=False,
    fills_positions=True,
    shapes=_dflash_shapes,
    problem=_dflash_problem,
)

METHODS: dict[str, DraftMethod] = {m.name: m for m in (EAGLE3, PEAGLE, DFLASH)}
NAMES: tuple[str, ...] = tuple(METHODS)


def _mla_layer_config(target_dir: str, num_layers: int, trust_remote_code: bool):
    from . import mla_layer  # torch and speculators: only where a head is built

    return mla_layer.draft_layer_config(target_dir, num_layers, trust_remote_code)


def _mla_register() -> None:
    from . import mla_layer  # noqa: F401 - its import registers the layer (mla_layer.register)


LLAMA = DraftLayer(name=DEFAULT_LAYER, summary="llama (speculators' layer of the method: llama; qwen3 for dflash)")
# MLA: the eagle3 head with DeepSeek-V3's multi-head latent attention built from the target's MLA config
# (eagle3build/draft/mla_layer.py), exported as vLLM's Eagle3DeepseekV3ForCausalLM loads it (mla_format.served_config:
# vLLM's speculators parser refuses the layer). vLLM's DeepSeek EAGLE-3 model has no input_norm: norm_before_fc off.
MLA = DraftLayer(
    name="mla",
    summary="mla (eagle3 only: DeepSeek-V3 multi-head latent attention from the target's MLA config, for "
            "DeepSeek-V3/Kimi targets; served by vLLM as Eagle3DeepseekV3ForCausalLM; the pre-flight bound then "
            "times both layers)",
    flags={"norm_before_fc": False},
    layer_config=_mla_layer_config,
    register=_mla_register,
    recognises=mla_format.is_mla_config,
    shapes=lambda cfg: mla_format.expected_shapes(cfg, len(aux_layer_ids(cfg))),
    served=mla_format.served_config,
    format_version=2,  # 2: rope_parameters as vLLM 0.26 and 0.32 both read them (issue 58)
)

LAYERS: dict[str, DraftLayer] = {x.name: x for x in (LLAMA, MLA)}
LAYER_NAMES: tuple[str, ...] = tuple(LAYERS)
assert all(set(m.layer_choices) <= set(LAYERS) and DEFAULT_LAYER in m.layer_choices for m in METHODS.values())


def get_layer(name: str) -> DraftLayer:
    """The draft layer named ``name`` (config ``draft.layer``).

    Raises:
        ValueError: no such layer.
    """
    if name not in LAYERS:
        raise ValueError(f"draft.layer {name!r} is not one of {list(LAYERS)}")
    return LAYERS[name]


def layer_of(cfg: Mapping[str, Any]) -> DraftLayer:
    """The draft layer of a checkpoint's or exported head's ``config.json`` ``cfg``: the registered layer that
    recognises it (``DraftLayer.recognises``: MLA where its layer config has a ``kv_lora_rank``), else
    ``DEFAULT_LAYER``'s."""
    return next((x for x in LAYERS.values() if x.recognises and x.recognises(cfg)), LAYERS[DEFAULT_LAYER])

def get(name: str) -> DraftMethod:
    """The method named ``name`` (``draft.method``, a head's ``speculators_model_type``).

    Raises:
        ValueError: no such method.
    """
    if name not in METHODS:
        raise ValueError(f"draft.method {name!r} is not one of {list(METHODS)}")
    return METHODS[name]


def of_config(cfg: Mapping[str, Any]) -> DraftMethod:
    """The method of a head's speculators ``config.json`` ``cfg``: its ``speculators_model_type`` (a head without
    one is ``DEFAULT_METHOD``'s).

    Raises:
        ValueError: a type no method has.
    """
    return get(cfg.get("speculators_model_type", DEFAULT_METHOD))
