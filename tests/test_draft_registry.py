"""The draft registries (eagle3build.draft.methods): one object per method, its own module, holds what the method
changes, one per draft layer what the layer changes (draft.layer, issue 54); the config's draft section and the
artifact schemas' enums are made from them; no code outside the draft package branches on a method's or a layer's
name (issue 52) or on the registry's constants (issue 59); a fourth method is its own class and a registry entry."""
from __future__ import annotations

import ast
import json
import re

import pytest
from smk import REPO

from eagle3build.config import artifact_schemas, spec
from eagle3build.draft import methods
from eagle3build.draft.choice import compare_draft, compare_note, compared, resolve
from eagle3build.draft.head_format import Head, expected_shapes
from eagle3build.draft.layer import DraftLayer
from eagle3build.draft.method import DraftMethod
from eagle3build.draft.methods import LAYERS, METHODS
from eagle3build.workflow.contract import CONTRACTS

# the names no module branches on outside the registry: the methods' and the draft layers' (``llama`` | ``mla``)
NAMES = frozenset(METHODS) | frozenset(LAYERS)
# the registry's constants no module outside eagle3build/draft/ branches on: its method and layer objects
# (EAGLE3, PEAGLE, DFLASH, LLAMA, MLA) and its defaults (DEFAULT_METHOD, DEFAULT_LAYER)
CONSTANTS = frozenset(n for n, v in vars(methods).items()
                      if isinstance(v, (DraftMethod, DraftLayer)) or n.startswith("DEFAULT_"))
REGISTRY = "eagle3build/draft/methods.py"
DRAFT_PACKAGE = "eagle3build/draft/"


def _is_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in NAMES


def _names_in(node: ast.AST) -> bool:
    """A method's name, or a tuple, list or set literal holding one."""
    return _is_name(node) or (isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_is_name(e) for e in node.elts))


def _is_constant(node: ast.AST) -> bool:
    """``EAGLE3``, ``methods.DEFAULT_LAYER``: a registry constant, by name or as an attribute."""
    return ((isinstance(node, ast.Name) and node.id in CONSTANTS)
            or (isinstance(node, ast.Attribute) and node.attr in CONSTANTS))


def _constants_in(node: ast.AST) -> bool:
    return any(_is_constant(n) for n in ast.walk(node))


def method_branches(source: str) -> list[int]:
    """Lines of ``source`` (Python) that branch on a draft method's or layer's name: a comparison with one
    (``m == "peagle"``, ``m != "eagle3"``, ``m in ("eagle3", "peagle")``, ``layer == "mla"``), or a dispatch table
    of two or more of them (``{"eagle3": a, "peagle": b}``)."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Compare) and any(_names_in(x) for x in [n.left, *n.comparators]):
            out.append(n.lineno)
        elif isinstance(n, ast.Dict) and sum(_is_name(k) for k in n.keys if k is not None) >= 2:
            out.append(n.lineno)
    return sorted(set(out))


def constant_branches(source: str) -> list[int]:
    """Lines of ``source`` (Python) that branch on a registry constant: a comparison one side of which holds one
    (``layer != DEFAULT_LAYER``, ``m is methods.EAGLE3``, ``layers != [methods.DEFAULT_LAYER]``,
    ``lay.name == methods.DEFAULT_LAYER``)."""
    return sorted({n.lineno for n in ast.walk(ast.parse(source))
                   if isinstance(n, ast.Compare) and any(_constants_in(x) for x in [n.left, *n.comparators])})


# Snakefile and rules/*.smk are not Python to ``ast``: a comparison with a quoted method name or a registry constant
SMK_BRANCH = re.compile(r"""(==|!=|\bin|\bis)\s*[\(\[]?\s*["'](%s)["']|["'](%s)["']\s*(==|!=)""" % ("|".join(NAMES),
                                                                                                "|".join(NAMES)))
SMK_CONSTANT = re.compile(r"""(==|!=|\bin|\bis(\s+not)?)\s*[\(\[]?\s*[\w.]*\b(%s)\b|\b(%s)\s*(==|!=)"""
                          % ("|".join(CONSTANTS), "|".join(CONSTANTS)))


def tree_branches() -> dict[str, list[int]]:
    """Every method-name branch in the project's code outside the registry, and every registry-constant branch
    outside the draft package: the package, the benchmark and script tools, the Snakefile and rules."""
    out = {}
    for p in sorted([*REPO.glob("eagle3build/**/*.py"), *REPO.glob("benchmarks/**/*.py"), *REPO.glob("scripts/*.py")]):
        rel = str(p.relative_to(REPO))
        source = p.read_text()
        lines = (method_branches(source) if rel != REGISTRY else []) + \
            (constant_branches(source) if not rel.startswith(DRAFT_PACKAGE) else [])
        if lines:
            out[rel] = sorted(set(lines))
    for p in [REPO / "Snakefile", *sorted(REPO.glob("rules/*.smk"))]:
        lines = [i for i, line in enumerate(p.read_text().splitlines(), 1)
                 if SMK_BRANCH.search(line.split("#")[0]) or SMK_CONSTANT.search(line.split("#")[0])]
        if lines:
            out[str(p.relative_to(REPO))] = lines
    return out


def test_no_method_name_or_registry_constant_branch_outside_the_registry():
    assert tree_branches() == {}


@pytest.mark.parametrize("src, lines", [
    ('if method == "peagle":\n    pass\n', [1]),
    ('x = m != "eagle3"\n', [1]),
    ('shift = method in ("eagle3", "peagle")\n', [1]),
    ('x = "dflash" == method_of(cfg)\n', [1]),
    ('if layer != "llama":\n    pass\nmla = layer in ("mla",)\n', [1, 3]),  # a draft layer's name
    ('build = {"llama": cli, "mla": mla}[layer]\n', [1]),
    ('out = {"eagle3": 1, "peagle": 2, "dflash": 3}[method]\n', [1]),
    ('variant = "eagle3.1" if ok else "eagle3"\nflags = {"eagle3": 1, "eagle3.1": 2}\n', []),  # head variants
    ('sc = {"method": "eagle3", "model": m}\nif v == "auto":\n    pass\n', []),  # a literal value is no branch
])
def test_the_branch_finder_finds_a_comparison_or_a_dispatch_on_a_method_name(src, lines):
    assert method_branches(src) == lines


@pytest.mark.parametrize("src, lines", [
    # the pre-flight's branches before issue 59 (compat/preflight_bound.py)
    ('return [lay.name] if lay.name == methods.DEFAULT_LAYER else [lay.name, methods.DEFAULT_LAYER]\n',
     [1]),
    ('if layers != [methods.DEFAULT_LAYER]:\n    pass\n', [1]),
    ('if m is EAGLE3 or layer != DEFAULT_LAYER:\n    pass\n', [1]),
    ('x = methods.MLA in chosen\n', [1]),
    # a constant as a value, a default or an argument is no branch
    ('layer = values.get("draft.layer", methods.DEFAULT_LAYER)\nd = Draft(EAGLE3, LLAMA)\n', []),
    ('def f(layer=DEFAULT_LAYER):\n    return get_layer(layer).version_param()\n', []),
])
def test_the_constant_finder_finds_a_comparison_with_a_registry_constant(src, lines):
    assert {"EAGLE3", "PEAGLE", "DFLASH", "LLAMA", "MLA", "DEFAULT_METHOD", "DEFAULT_LAYER"} <= CONSTANTS
    assert constant_branches(src) == lines


def test_the_smk_branch_patterns():
    assert SMK_BRANCH.search('if config["draft"]["method"] == "peagle":')
    assert SMK_BRANCH.search("x = 'dflash' != m")
    assert SMK_BRANCH.search('if config["draft"]["layer"] == "mla":')
    assert not SMK_BRANCH.search('method="|".join(spec.DRAFT_METHODS),')
    assert SMK_CONSTANT.search('if config["draft"]["layer"] != methods.DEFAULT_LAYER:')
    assert SMK_CONSTANT.search("if DRAFT.method is EAGLE3:")
    assert not SMK_CONSTANT.search('layer = config["draft"].get("layer", DEFAULT_LAYER)')


def test_the_config_draft_section_is_the_registry():
    """draft.method's choices are the registry's names, its default the registry's, and each method's options are
    the keys draft.<method>.<option> with the option's default, in train_draft's train param as <method>_<option>."""
    keys = {k.path: k for k in spec.KEYS if k.section.startswith("draft")}
    assert keys["draft.method"].schema["enum"] == list(METHODS) == ["eagle3", "peagle", "dflash"]
    assert keys["draft.method"].default == methods.DEFAULT_METHOD
    assert keys["draft.compare_methods"].schema["items"]["enum"] == list(METHODS)
    (train,) = [p for p in CONTRACTS["train_draft"].params if p.name == "train"]
    options = {p: (k.default, dict(train.make.names).get(p)) for p, k in keys.items() if p.count(".") == 2}
    assert options == {"draft.peagle.num_depths": (8, "peagle_num_depths"),
                       "draft.dflash.block_size": (8, "dflash_block_size"),
                       "draft.dflash.num_layers": (5, "dflash_num_layers")}


def test_each_method_says_what_it_changes():
    """Row shift, head flags, what its model and forward get, vLLM's speculative_config, its k schedule, trained
    positions, the hidden states it reads and speculators' model arguments, per method, as behaviour of its object
    (eagle3build/draft/{eagle3,peagle,dflash}.py)."""
    e, p, d = METHODS["eagle3"], METHODS["peagle"], METHODS["dflash"]
    assert (type(e).__module__, type(p).__module__, type(d).__module__) == (
        "eagle3build.draft.eagle3", "eagle3build.draft.peagle", "eagle3build.draft.dflash")
    assert (e.shifted, p.shifted, d.shifted) == (True, True, False)
    variant = {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True, "fc_norm": False}
    assert e.head_flags(variant, {}) == variant and d.head_flags(variant, {"norm_before_fc": False}) == {}
    assert p.head_flags(variant, {}) == {"norm_before_residual": True, "norm_before_fc": False, "norm_output": False,
                                         "fc_norm": False}
    assert e.model_kwargs("/t", 10, 3, False) == {"ttt_steps": 3}  # the others: a mask token (needs the tokenizer)
    assert e.speculative_config("/h", 3) == {"method": "eagle3", "model": "/h", "num_speculative_tokens": 3}
    assert p.speculative_config("/h", 2) == {"method": "eagle3", "parallel_drafting": True, "model": "/h",
                                             "num_speculative_tokens": 2}
    assert d.speculative_config("/h", 2)["method"] == "dflash"
    sweep, target = {1: {1: 150.0}, 3: {1: 190.0}}, {1: 100.0}
    assert (e.schedule_k(sweep, [1], target), p.schedule_k(sweep, [1], target), d.schedule_k(sweep, [1], target)) == (
        None, 3, None)  # P-EAGLE's schedule holds one k beside 0
    cfg = {"speculators_config": {"proposal_methods": [{"speculative_tokens": 7}]},
           "eagle_aux_hidden_state_layer_ids": [1, 2, 3], "aux_hidden_state_layer_ids": [4, 5]}
    assert (e.trained_positions(cfg), p.trained_positions(cfg), d.trained_positions(cfg)) == (None, 7, 7)
    assert (e.aux_layer_ids(cfg), p.aux_layer_ids(cfg), d.aux_layer_ids(cfg)) == ([1, 2, 3], [1, 2, 3], [4, 5])
    assert (e.fc_fields([1, 2]), d.fc_fields([1, 2])) == ({"num_aux_hidden_states": 2}, {})
    assert d.spec({"num_layers": 2}) == {"arch": "qwen3", "layers": 2, "args": {
        "block_size": 8, "sliding_window_non_causal": True, "sample_from_anchor": False}}
    assert p.spec() == {"arch": "llama", "layers": 1, "args": {"num_depths": 8}}
    assert [m.recorded for m in (e, p, d)] == [False, True, True]  # an EAGLE-3 run's files keep their bytes
    assert [m.peer_route_type for m in (e, p, d)] == ["eagle3", None, None]
    assert d.export_problem({"sliding_window_non_causal": True, "sample_from_anchor": False}) == ""
    assert "sliding_window_non_causal" in d.export_problem({"sliding_window_non_causal": False})
    assert "norm_before_fc" in p.load_hint({"norm_before_fc": True}) and e.load_hint({"norm_before_fc": True}) == ""
    with pytest.raises(ValueError, match=r"\['num_depths'\] are not options of dflash"):
        d.spec({"num_depths": 4})
    with pytest.raises(ValueError, match="'medusa' is not one of"):
        methods.get("medusa")
    assert methods.of_config({}) is e  # a head config without speculators_model_type is EAGLE-3's


def test_the_config_draft_layer_is_the_layer_registry():
    """draft.layer's choices are the layer registry's names, its default the registry's; it reaches training and
    the pre-flight (train_draft's train param as layer, preflight_bound's preflight param as draft_layer) and
    export_head's version param (the layer's format version)."""
    key = next(k for k in spec.KEYS if k.path == "draft.layer")
    assert key.schema["enum"] == list(LAYERS) == ["llama", "mla"]
    assert key.default == methods.DEFAULT_LAYER == "llama" and key.quiet_default
    reached = {s: [p.name for p in c.params if "draft.layer" in p.keys] for s, c in CONTRACTS.items()}
    assert {s: names for s, names in reached.items() if names} == {
        "train_draft": ["train"], "preflight_bound": ["preflight"], "export_head": ["version"]}
    (preflight,) = [p for p in CONTRACTS["preflight_bound"].params if p.name == "preflight"]
    assert dict(preflight.make.names)["draft.layer"] == "draft_layer"


def test_each_layer_says_what_it_changes():
    """Which methods a layer is built for, its head flags over the method's, how a head of it is recognised and
    named in benchmark.json, its tensors, its served config (MLA: vLLM's Eagle3DeepseekV3ForCausalLM config), the
    version it adds to export's param and what a target needs for it."""
    e, p, d = METHODS["eagle3"], METHODS["peagle"], METHODS["dflash"]
    llama, mla = LAYERS["llama"], LAYERS["mla"]
    assert (e.layer_choices, p.layer_choices, d.layer_choices) == (("llama", "mla"), ("llama",), ("llama",))
    assert methods.methods_with_layer(mla) == ["eagle3"]
    variant = {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True, "fc_norm": False}
    assert resolve({"layer": "mla"}).head_flags(variant) == {**variant, "norm_before_fc": False}
    assert resolve().head_flags(variant) == variant
    assert (llama.recorded, mla.recorded) == (False, True)  # a llama run's files keep their bytes
    assert (llama.speculators_config_dir("/head", "/ck"), mla.speculators_config_dir("/head", "/ck")) == ("/head", "/ck")
    assert (llama.version_param(), mla.version_param()) == ({}, {"layer_format": 2})
    assert llama.target_problem({"model_type": "llama"}) is None
    assert "no multi-head latent attention" in mla.target_problem({"model_type": "llama"})
    assert mla.target_problem({"text_config": {"kv_lora_rank": 512}}) is None  # a multimodal wrapper's text model
    assert "rope_type 'linear'" in mla.target_problem({"kv_lora_rank": 8, "rope_scaling": {"type": "linear"}})
    # a checkpoint (speculators' config, a deepseek_v3 layer) and the exported head (vLLM's, deepseek_v2)
    tl = {"model_type": "deepseek_v3", "hidden_size": 8, "vocab_size": 32, "num_attention_heads": 2,
          "num_hidden_layers": 1, "intermediate_size": 16, "q_lora_rank": None, "kv_lora_rank": 4,
          "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 2, "max_position_embeddings": 64,
          "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}}
    ck = {"speculators_model_type": "eagle3", "transformer_layer_config": tl, "draft_vocab_size": 16,
          "eagle_aux_hidden_state_layer_ids": [0, 1]}
    served = resolve({"layer": "mla"}).served_config(ck, "org/kimi", "float32")
    assert served["model_type"] == "deepseek_v2" and served["architectures"] == ["Eagle3DeepseekV3ForCausalLM"]
    # the default rope with what vLLM 0.26 needs to read it as YaRN of factor 1 (tests/test_mla_rope.py)
    assert served["rope_parameters"] == {"rope_type": "default", "rope_theta": 500.0, "factor": 1.0,
                                         "original_max_position_embeddings": 64}
    for cfg in (ck, served):
        head = Head.of("/h", cfg)
        assert (head.layer, head.method, head.kv_layers, head.aux_layer_ids) == (mla, e, 1, (0, 1))
        assert head.draft_layer == "mla"  # benchmark.json's draft_layer: the layer's name, not its model_type
        shapes = expected_shapes(cfg)
        assert shapes == head.expected_shapes()
        assert shapes["layers.0.self_attn.kv_a_proj_with_mqa.weight"] == (4 + 2, 2 * 8)
        assert shapes["layers.0.self_attn.q_proj.weight"] == (2 * (2 + 2), 2 * 8) and shapes["fc.weight"] == (8, 16)
        assert "layers.0.self_attn.k_proj.weight" not in shapes
    llama_cfg = {"transformer_layer_config": {"model_type": "llama", "num_hidden_layers": 1}}
    assert methods.layer_of(llama_cfg) is llama and Head.of("/h", llama_cfg).draft_layer == "llama"
    dflash_cfg = {"speculators_model_type": "dflash", "transformer_layer_config": {"model_type": "qwen3",
                                                                                  "num_hidden_layers": 5},
                  "speculators_config": {"proposal_methods": [{"speculative_tokens": 7}]}}
    assert Head.of("/h", dflash_cfg).described() == {"method": "dflash", "draft_layer": "qwen3", "trained_positions": 7}


def test_a_draft_is_resolved_once_and_travels_as_its_section():
    """A Draft holds the method object, every option with its value and the layer object; its section (the jobs'
    draft param, torchrun's argument) gives it back; saved states and train_meta.json name what is not the default;
    draft.compare_methods' heads keep their own layer beside a layer their method is not built with."""
    d = resolve({"method": "dflash", "layer": "llama", "dflash": {"block_size": 4}, "compare_methods": []})
    assert (d.method, d.layer, dict(d.options)) == (METHODS["dflash"], LAYERS["llama"], {"block_size": 4, "num_layers": 5})
    assert d.section() == {"method": "dflash", "layer": "llama", "dflash": {"block_size": 4, "num_layers": 5}}
    assert resolve(d.section()) == d and resolve(json.loads(json.dumps(d.section()))) == d
    assert d.state_fields() == {"method": "dflash", "method_options": {"block_size": 4, "num_layers": 5}}
    assert resolve({"method": "dflash"}).state_fields() == {"method": "dflash"}  # speculators' defaults: no options
    assert d.meta_fields() == {"method": "dflash"}
    assert resolve().state_fields() == resolve().meta_fields() == {}  # an EAGLE-3 llama run's files keep their bytes
    mla = resolve({"layer": "mla"})
    assert mla.meta_fields() == mla.state_fields() == {"layer": "mla"}
    section = {"layer": "mla", "compare_methods": ["peagle", "dflash"], "peagle": {"num_depths": 4}}
    others = compared(section, mla)
    assert [(o.method.name, o.layer.name, dict(o.options)) for o in others] == [
        ("peagle", "llama", {"num_depths": 4}), ("dflash", "llama", {"block_size": 8, "num_layers": 5})]
    assert compare_draft(section, mla, "eagle3") == mla  # a method built with the run's layer keeps it
    assert compare_note(mla, others) == (
        "config: draft.compare_methods ['peagle', 'dflash'] beside draft.layer: mla: the run's eagle3 head gets the mla "
        "layer, peagle's the llama layer, dflash's the llama layer (draft.layer mla is built for draft.method eagle3 "
        "only); benchmark.json names each run's draft_layer")
    assert compare_note(resolve(), compared({"compare_methods": ["peagle"]}, resolve())) is None


def test_the_artifact_schemas_enums_are_the_registrys():
    """train_meta, head_meta and benchmark schemas hold the registry's names, written by
    ``python -m eagle3build.config.artifact_schemas``: the shipped files are the generated ones, byte for byte."""
    for name in artifact_schemas.ENUMS:
        assert (artifact_schemas.SCHEMA_DIR / name).read_text() == artifact_schemas.generated(name), name
    train = json.loads((artifact_schemas.SCHEMA_DIR / "train_meta.schema.json").read_text())
    assert train["properties"]["method"]["enum"] == ["peagle", "dflash"]  # eagle3 is the absent default
    assert train["properties"]["layer"]["enum"] == ["mla"]
    bench = json.loads((artifact_schemas.SCHEMA_DIR / "benchmark.schema.json").read_text())
    assert bench["$defs"]["served_head"]["properties"]["method"]["enum"] == list(METHODS)
    assert artifact_schemas.main(["--check"]) == 0


def test_a_fourth_method_is_its_class_and_a_registry_entry(tmp_path, monkeypatch):
    """speculators' Medusa (its heads read the target's last hidden state, no aux layers) as a fourth method: one
    DraftMethod subclass and its entry in the registry reach the config's draft section, its option's key, the
    jobs' Draft, the artifact schemas' enums and a head folder's reading, with no other file touched."""

    class Medusa(DraftMethod):
        name = "medusa"
        summary = "medusa (heads over the last hidden state)"
        vllm_method = {"method": "medusa"}
        aux_ids_key = "medusa_unused"  # reads no aux layers

        def aux_layer_ids(self, cfg):
            return []

        def trained_positions(self, cfg):
            return int(cfg["num_heads"])

    monkeypatch.setitem(METHODS, "medusa", Medusa())
    monkeypatch.setattr(methods, "NAMES", tuple(METHODS))
    keys = {k.path: k for k in spec.draft_keys()}
    assert keys["draft.method"].schema["enum"] == ["eagle3", "peagle", "dflash", "medusa"]
    assert "medusa (heads over the last hidden state)" in keys["draft.method"].doc
    d = resolve({"method": "medusa"})
    assert d.section() == {"method": "medusa", "layer": "llama"} and d.meta_fields() == {"method": "medusa"}
    for name in artifact_schemas.ENUMS:
        (tmp_path / name).write_text((artifact_schemas.SCHEMA_DIR / name).read_text())
    assert json.loads(artifact_schemas.generated("train_meta.schema.json", tmp_path))["properties"]["method"][
        "enum"] == ["peagle", "dflash", "medusa"]
    assert artifact_schemas.stale(tmp_path) == list(artifact_schemas.ENUMS)  # the command then rewrites all three
    head = Head.of(tmp_path, {"speculators_model_type": "medusa", "num_heads": 4,
                              "transformer_layer_config": {"num_hidden_layers": 1}})
    assert head.described() == {"method": "medusa", "draft_layer": "llama", "trained_positions": 4}
    assert head.speculative_config(2) == {"method": "medusa", "model": str(tmp_path), "num_speculative_tokens": 2}
