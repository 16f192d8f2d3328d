"""The draft-method registry (eagle3build.draft.methods): one object per method holds what the method changes,
one per draft layer what the layer changes (draft.layer, issue 54), the config's draft section is made from them,
and no code outside it branches on a method's or a layer's name (issue 52)."""
from __future__ import annotations

import ast
import re

import pytest
from smk import REPO

from eagle3build.config import spec as config_spec
from eagle3build.draft import methods as draft_methods
from eagle3build.draft.methods import LAYERS, METHODS

# the names no module branches on outside the registry: the methods' and the draft layers' (``llama`` | ``mla``)
NAMES = frozenset(METHODS) | frozenset(LAYERS)
REGISTRY = "eagle3build/draft/methods.py"


def _is_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in NAMES


def _names_in(node: ast.AST) -> bool:
    """A method's name, or a tuple, list or set literal holding one."""
    return _is_name(node) or (isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_is_name(e) for e in node.elts))


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


# Snakefile and rules/*.smk are not Python to ``ast``: a comparison with a quoted method name
SMK_BRANCH = re.compile(r"""(==|!=|\bin)\s*[\(\[]?\s*["'](%s)["']|["'](%s)["']\s*(==|!=)""" % ("|".join(NAMES),
                                                                                            "|".join(NAMES)))


def tree_branches() -> dict[str, list[int]]:
    """Every method-name branch in the project's code outside the registry: the package, the benchmark and
    script tools, the Snakefile and rules."""
    out = {}
    for p in sorted([*REPO.glob("eagle3build/**/*.py"), *REPO.glob("benchmarks/**/*.py"), *REPO.glob("scripts/*.py")]):
        rel = str(p.relative_to(REPO))
        if rel != REGISTRY and (lines := method_branches(p.read_text())):
            out[rel] = lines
    for p in [REPO / "Snakefile", *sorted(REPO.glob("rules/*.smk"))]:
        lines = [i for i, line in enumerate(p.read_text().splitlines(), 1) if SMK_BRANCH.search(line.split("#")[0])]
        if lines:
            out[str(p.relative_to(REPO))] = lines
    return out


def test_no_method_name_branch_outside_the_registry():
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


def test_the_smk_branch_pattern():
    assert SMK_BRANCH.search('if config["draft"]["method"] == "peagle":')
    assert SMK_BRANCH.search("x = 'dflash' != m")
    assert SMK_BRANCH.search('if config["draft"]["layer"] == "mla":')
    assert not SMK_BRANCH.search('method="|".join(config_spec.DRAFT_METHODS),')


def test_the_config_draft_section_is_the_registry():
    """draft.method's choices are the registry's names, its default the registry's, and each method's options are
    the keys draft.<method>.<option> with the option's default, in train_draft's train param as <method>_<option>."""
    keys = {k.path: k for k in config_spec.KEYS if k.section.startswith("draft")}
    assert keys["draft.method"].schema["enum"] == list(METHODS) == ["eagle3", "peagle", "dflash"]
    assert keys["draft.method"].default == draft_methods.DEFAULT_METHOD
    assert keys["draft.compare_methods"].schema["items"]["enum"] == list(METHODS)
    options = {p: (k.default, k.uses["train_draft"]) for p, k in keys.items() if p.count(".") == 2}
    assert options == {"draft.peagle.num_depths": (8, "trigger:train/peagle_num_depths"),
                       "draft.dflash.block_size": (8, "trigger:train/dflash_block_size"),
                       "draft.dflash.num_layers": (5, "trigger:train/dflash_num_layers")}


def test_each_method_says_what_it_changes():
    """Row shift, head flags, vLLM's speculative_config, the k schedule, trained positions and speculators' model
    arguments, per method, as speculators and vLLM need them."""
    e, p, d = METHODS["eagle3"], METHODS["peagle"], METHODS["dflash"]
    assert (e.shifted, p.shifted, d.shifted) == (True, True, False)
    variant = {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True, "fc_norm": False}
    assert e.head_flags(variant) == variant and d.head_flags(variant) == {}
    assert p.head_flags(variant) == {"norm_before_residual": True, "norm_before_fc": False, "norm_output": False,
                                     "fc_norm": False}
    assert e.speculative_config("/h", 3) == {"method": "eagle3", "model": "/h", "num_speculative_tokens": 3}
    assert p.speculative_config("/h", 2) == {"method": "eagle3", "parallel_drafting": True, "model": "/h",
                                             "num_speculative_tokens": 2}
    assert d.speculative_config("/h", 2)["method"] == "dflash"
    assert [m.one_k_schedule for m in (e, p, d)] == [False, True, False]
    cfg = {"speculators_config": {"proposal_methods": [{"speculative_tokens": 7}]}}
    assert (e.trained_positions(cfg), p.trained_positions(cfg), d.trained_positions(cfg)) == (None, 7, 7)
    assert d.spec({"num_layers": 2}) == {"arch": "qwen3", "layers": 2, "args": {
        "block_size": 8, "sliding_window_non_causal": True, "sample_from_anchor": False}}
    assert p.spec() == {"arch": "llama", "layers": 1, "args": {"num_depths": 8}}
    assert [m.recorded for m in (e, p, d)] == [False, True, True]  # an EAGLE-3 run's files keep their bytes
    assert d.export_problem({"sliding_window_non_causal": True, "sample_from_anchor": False}) == ""
    assert "sliding_window_non_causal" in d.export_problem({"sliding_window_non_causal": False})
    assert "norm_before_fc" in p.load_hint({"norm_before_fc": True}) and e.load_hint({"norm_before_fc": True}) == ""
    with pytest.raises(ValueError, match=r"\['num_depths'\] are not options of dflash"):
        d.spec({"num_depths": 4})
    with pytest.raises(ValueError, match="'medusa' is not one of"):
        draft_methods.get("medusa")
    assert draft_methods.of_config({}) is e  # a head config without speculators_model_type is EAGLE-3's


def test_the_config_draft_layer_is_the_layer_registry():
    """draft.layer's choices are the layer registry's names, its default the registry's; it reaches training and
    the pre-flight (train_draft's train param as layer, preflight_bound's preflight param as draft_layer) and
    export_head's version param (the layer's format version)."""
    key = next(k for k in config_spec.KEYS if k.path == "draft.layer")
    assert key.schema["enum"] == list(LAYERS) == ["llama", "mla"]
    assert key.default == draft_methods.DEFAULT_LAYER == "llama" and key.quiet_default
    assert key.uses == {"train_draft": "trigger:train", "preflight_bound": "trigger:preflight/draft_layer",
                        "export_head": "trigger:version"}


def test_each_layer_says_what_it_changes():
    """Which methods a layer is built for, its head flags over the method's, how a head of it is recognised and
    named in benchmark.json, its tensors and its served config (MLA: vLLM's Eagle3DeepseekV3ForCausalLM config)."""
    e, p, d = METHODS["eagle3"], METHODS["peagle"], METHODS["dflash"]
    llama, mla = LAYERS["llama"], LAYERS["mla"]
    assert (e.layer_choices, p.layer_choices, d.layer_choices) == (("llama", "mla"), ("llama",), ("llama",))
    assert e.layer("mla") is mla and e.layer_for("mla") == "mla"
    assert p.layer_for("mla") == "llama" and d.layer_for("mla") == "llama"  # a compared method keeps its layer
    with pytest.raises(ValueError, match="draft.layer mla is built for draft.method eagle3 only, not 'dflash'"):
        d.layer("mla")
    with pytest.raises(ValueError, match="draft.layer 'gqa' is not one of"):
        e.layer_for("gqa")
    variant = {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True, "fc_norm": False}
    assert e.head_flags(variant, "mla") == {**variant, "norm_before_fc": False} and e.head_flags(variant) == variant
    assert (llama.recorded, mla.recorded) == (False, True)  # a llama run's files keep their bytes
    assert (llama.speculators_config, mla.speculators_config) == (True, False)
    # a checkpoint (speculators' config, a deepseek_v3 layer) and the exported head (vLLM's, deepseek_v2)
    tl = {"model_type": "deepseek_v3", "hidden_size": 8, "vocab_size": 32, "num_attention_heads": 2,
          "num_hidden_layers": 1, "intermediate_size": 16, "q_lora_rank": None, "kv_lora_rank": 4,
          "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 2, "max_position_embeddings": 64,
          "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}}
    ck = {"speculators_model_type": "eagle3", "transformer_layer_config": tl, "draft_vocab_size": 16,
          "eagle_aux_hidden_state_layer_ids": [0, 1]}
    served = mla.served(ck, [0, 1], "float32")
    assert served["model_type"] == "deepseek_v2" and served["architectures"] == ["Eagle3DeepseekV3ForCausalLM"]
    # the default rope with what vLLM 0.26 needs to read it as YaRN of factor 1 (tests/test_mla_rope.py)
    assert served["rope_parameters"] == {"rope_type": "default", "rope_theta": 500.0, "factor": 1.0,
                                         "original_max_position_embeddings": 64}
    for cfg in (ck, served):
        assert draft_methods.layer_of(cfg) is mla and draft_methods.of_config(cfg) is e
        assert e.draft_layer(cfg) == "mla"  # benchmark.json's draft_layer: the layer's name, not its model_type
        shapes = e.expected_shapes(cfg)
        assert shapes["layers.0.self_attn.kv_a_proj_with_mqa.weight"] == (4 + 2, 2 * 8)
        assert shapes["layers.0.self_attn.q_proj.weight"] == (2 * (2 + 2), 2 * 8) and shapes["fc.weight"] == (8, 16)
        assert "layers.0.self_attn.k_proj.weight" not in shapes
    llama_cfg = {"transformer_layer_config": {"model_type": "llama"}}
    assert draft_methods.layer_of(llama_cfg) is llama and e.draft_layer(llama_cfg) == "llama"
    assert d.draft_layer({"transformer_layer_config": {"model_type": "qwen3"}}) == "qwen3"
