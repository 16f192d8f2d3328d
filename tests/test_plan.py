"""The planning policy as a module (eagle3build.workflow.plan, issue 66 item 2), without Snakemake: what the plan
refuses and in which order, the drafts it resolves once, the switches it reads from the config, the rules' check
against their contracts. The same policy through the workflow: tests/test_workflow_plan.py, test_target_dir.py,
test_draft_choice.py, test_prompt_sets.py."""
from __future__ import annotations

import copy
import json
import types
from pathlib import Path

import pytest
import yaml

from eagle3build.formats import target_files
from eagle3build.workflow import plan
from eagle3build.workflow.contract import CONTRACTS, RULE_ENTRIES, STAGE_OF_RULE, stage_of

REPO = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((REPO / "config.yaml").read_text())
KIMI_SHAPE = REPO / "examples/targets/kimi-k2.5-shape"  # config.json only: a DeepSeek-V3 text model (MLA)
RES = "results/default"


def config(**sections) -> dict:
    """config.yaml with each section's keys of ``sections`` set (nested mappings merged one level down)."""
    cfg = copy.deepcopy(CONFIG)
    for name, values in sections.items():
        for k, v in values.items():
            cfg[name][k] = {**cfg[name][k], **v} if isinstance(v, dict) and isinstance(cfg[name].get(k), dict) else v
    return cfg


def test_the_target_folder_and_its_inputs():
    assert plan.target_folder(CONFIG) == "resources/targets/smollm2-135m-instruct"
    assert plan.target_folder(config(target={"path": "/models/x"})) == "/models/x"
    bundled = plan.target_inputs(CONFIG, "resources/targets/smollm2-135m-instruct")
    assert bundled == [f"resources/targets/smollm2-135m-instruct/{f}" for f in target_files.MATERIALIZED_FILES]
    shape = str(REPO / "examples/targets/llama-3.1-8b-instruct-shape")
    assert plan.target_inputs(config(target={"path": shape}), shape) == target_files.content_files(shape)


def test_a_folder_that_is_no_model_is_refused_and_one_without_weights_warns(tmp_path):
    """A ``target.path`` without config.json is refused at planning, naming the folder; one with config.json and no
    weight files plans (its problem returned), and a build that reads the weights is refused before its first job,
    naming the rules that read them; a bundled target is neither."""
    with pytest.raises(plan.PlanError, match=r"no config.json"):
        plan.check_target(config(target={"path": str(tmp_path)}), str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    problem = plan.check_target(config(target={"path": str(tmp_path)}), str(tmp_path))
    assert f"target.path {tmp_path} holds config.json but no weight files" in problem
    assert plan.check_target(CONFIG, str(tmp_path)) is None
    plan.check_weights(problem, ["compat_report", "prepare_data"])  # no job reads the weights: it may run
    plan.check_weights(None, ["train_draft"])
    with pytest.raises(plan.PlanError, match=r"the planned jobs of export_head_method, train_draft read them: nothing "
                                             "was run$"):
        plan.check_weights(problem, ["prepare_data", "train_draft", "export_head_method"])
    assert set(STAGE_OF_RULE) <= plan.READS_TARGET_WEIGHTS and "compat_report" not in plan.READS_TARGET_WEIGHTS


@pytest.mark.parametrize("sets, prompts_file, check_set, why", [
    (["chat", "custom"], None, "auto", "benchmark.sets lists 'custom' exactly when data.prompts_file names"),
    (["chat"], "p.jsonl", "auto", "got benchmark.sets=['chat'] and data.prompts_file='p.jsonl'"),
    (["chat", "humaneval"], None, "mtbench", "serve.check_set 'mtbench' is not in benchmark.sets ['chat', 'humaneval']"),
    (["chat", "custom"], "p.jsonl", "custom", None),
    (["humaneval"], None, "auto", None),
])
def test_the_set_rules(sets, prompts_file, check_set, why):
    cfg = config(benchmark={"sets": sets}, data={"prompts_file": prompts_file}, serve={"check_set": check_set})
    if why is None:
        plan.check_sets(cfg)
    else:
        with pytest.raises(plan.PlanError, match=why.replace("[", r"\[").replace("]", r"\]")):
            plan.check_sets(cfg)


@pytest.mark.parametrize("heads, why", [
    ([{"name": "head", "path": "x"}], "each must be unique and not 'head'"),
    ([{"name": "a", "path": "x"}, {"name": "a", "path": "y"}], "each must be unique"),
    ([{"name": "a", "path": "results/default/head/"}], "lists results/default/head, the run's own head"),
    ([{"name": "a", "path": "x"}, {"name": "b", "path": "results/other/head"}], None),
])
def test_the_compare_heads_rules(heads, why):
    cfg = config(benchmark={"compare_heads": heads})
    if why is None:
        plan.check_compare_heads(cfg, RES)
    else:
        with pytest.raises(plan.PlanError, match=why):
            plan.check_compare_heads(cfg, RES)


def test_the_drafts_are_resolved_once_with_the_compared_methods():
    """draft.compare_methods: each method's draft (the run's layer where the method is built with it), their heads'
    folders under results/<run>/methods/ in the listed order, the config each of their jobs reads; a method asked for
    by its path only is built too."""
    d = plan.resolve_drafts(config(draft={"compare_methods": ["peagle", "dflash"]}), RES, None)
    assert (d.own.method.name, d.own.layer.name) == ("eagle3", "llama") and list(d.compared) == ["peagle", "dflash"]
    assert d.method_heads == ({"name": "peagle", "path": f"{RES}/methods/peagle/head"},
                              {"name": "dflash", "path": f"{RES}/methods/dflash/head"})
    assert d.note is None and d.of("dflash") is d.compared["dflash"]
    cfg = config(draft={"compare_methods": ["peagle"]})
    one = plan.resolve_drafts(cfg, RES, None)
    assert one.of("dflash").method.name == "dflash" and "dflash" not in one.compared
    assert one.config_of(cfg, "peagle")["draft"] == {**cfg["draft"], "method": "peagle", "layer": "llama"}
    assert one.config_of(cfg, "peagle")["train"] is cfg["train"]


def test_compared_methods_beside_an_mla_head_get_their_own_layer():
    target = json.loads((KIMI_SHAPE / "config.json").read_text())
    cfg = config(draft={"layer": "mla", "compare_methods": ["peagle"]})
    d = plan.resolve_drafts(cfg, RES, target, f"target.path {KIMI_SHAPE}")
    assert (d.own.layer.name, d.compared["peagle"].layer.name) == ("mla", "llama")
    assert d.note.startswith("config: draft.compare_methods ['peagle'] beside draft.layer: mla")
    assert d.config_of(cfg, "peagle")["draft"]["layer"] == "llama"


@pytest.mark.parametrize("draft, heads, why", [
    ({"method": "peagle", "compare_methods": ["peagle"]}, [], r"and not draft.method \('peagle'\)"),
    ({"compare_methods": ["dflash"]}, [{"name": "dflash", "path": "x"}], r"both name \['dflash'\]"),
    ({"method": "dflash", "layer": "mla"}, [], "draft.layer"),
])
def test_a_draft_that_cannot_be_built_is_refused_in_one_line(draft, heads, why):
    with pytest.raises(plan.PlanError, match=why) as e:
        plan.resolve_drafts(config(draft=draft, benchmark={"compare_heads": heads}), RES, None)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("enabled, gpus, on", [("auto", 0, False), ("auto", 1, True), ("always", 0, True),
                                               ("never", 8, False)])
def test_the_preflight_switch(enabled, gpus, on):
    """The pre-flight bound is a GPU job: ``auto`` plans it where the serve jobs get GPUs (benchmarks/gpu/record.py
    reads the switch from here too)."""
    assert plan.preflight_enabled(config(preflight={"enabled": enabled}, resources={"serve": {"gpu": gpus}})) is on


@pytest.mark.parametrize("backend, decided, may", [("vllm", None, True), ("hooks", None, False), ("auto", None, True),
                                                   ("auto", "hooks", False), ("auto", "vllm", True),
                                                   ("vllm", "hooks", True)])
def test_the_capture_backend_guess_from_the_recorded_decisions(backend, decided, may):
    decisions = {"capture": {"backend": decided}} if decided else None
    assert plan.capture_may_use_vllm(config(capture={"backend": backend}), decisions) is may


def test_exports_resources_follow_its_load_check():
    serve = {"gpu": 2, "threads": 8, "mem_mb": 64000, "runtime": 90}
    on = config(resources={"serve": serve})
    assert plan.export_loads_in_vllm(on) and plan.export_resources(on) == serve
    off = config(resources={"serve": serve}, export={"vllm_load_check": "never"})
    assert not plan.export_loads_in_vllm(off)
    assert plan.export_resources(off) == {"gpu": 0, "threads": 1, "mem_mb": 4000, "runtime": 30}


def test_the_gpu_resources_a_job_shows():
    cfg = config(resources={"gpu_model": "h100", "serve": {"gpu": 4}}, target={"pipeline_parallel_size": 2})
    assert plan.gpu_model_resources(cfg, "serve") == {"gpu_model": "h100"}
    assert plan.gpu_model_resources(cfg, "cpu") == {} and plan.gpu_model_resources(cfg, None) == {}
    assert plan.gpu_model_resources(CONFIG, "serve") == {}
    assert plan.engine_layout_resources(cfg, "serve") == {"tensor_parallel_size": 4, "pipeline_parallel_size": 2}
    assert plan.engine_layout_resources(cfg, "serve", starts_engine=False) == {}


def test_the_plan_of_the_default_config():
    p = plan.Plan.of(CONFIG, RES)
    assert (p.target, p.weights_problem, p.preflight, p.capture_vllm, p.export_vllm) == (
        "resources/targets/smollm2-135m-instruct", None, False, True, True)
    assert p.drafts.own.method.name == "eagle3" and p.drafts.method_heads == ()
    assert plan.Plan.of(CONFIG, RES, {"capture": {"backend": "hooks"}}).capture_vllm is False


def test_the_plan_refuses_in_order_one_line_each(tmp_path):
    """The target first, then the sets, the compared heads, the aux ids against the target's layers, the draft."""
    bad_sets = {"benchmark": {"sets": ["custom"]}}
    with pytest.raises(plan.PlanError, match="no config.json"):
        plan.Plan.of(config(target={"path": str(tmp_path)}, **bad_sets), RES)
    with pytest.raises(plan.PlanError, match="benchmark.sets lists 'custom'"):
        plan.Plan.of(config(benchmark={"sets": ["custom"], "compare_heads": [{"name": "head", "path": "x"}]}), RES)
    kimi = {"target": {"path": str(KIMI_SHAPE)}, "draft": {"method": "dflash", "layer": "mla"}}
    with pytest.raises(plan.PlanError, match=r"capture.aux_layer_ids \[1, 99, 2\]: \[99\] out of range \[0, 60\]"):
        plan.Plan.of(config(capture={"aux_layer_ids": [1, 99, 2]}, **kimi), RES)
    with pytest.raises(plan.PlanError, match="the mla layer is built for draft.method eagle3 only, not dflash"):
        plan.Plan.of(config(**kimi), RES)


def rules_namespace(drop_input=None, drop_param=None):
    """Snakemake's ``rules`` as ``plan.check_rules`` reads it: each rule's named inputs (its contract's), outputs and
    params (those its settings object reads), one of them dropped where asked."""
    out = {}
    for name in [*CONTRACTS, *STAGE_OF_RULE, *RULE_ENTRIES]:
        stage = stage_of(name)
        inputs = set(CONTRACTS[stage].inputs) if stage in CONTRACTS else {"json", "preflight"}
        e = plan.job_entry(name)
        outputs = {f.path[0] for f in e.fields_of("outputs").values()}
        params = {f.path[0] for f in e.fields_of("params").values()} | {"settings"}
        if name == drop_input:
            inputs.discard(sorted(inputs)[0])
        if drop_param and name == drop_param[0]:
            params.discard(drop_param[1])
        out[name] = types.SimpleNamespace(input=dict.fromkeys(inputs), output=dict.fromkeys(outputs),
                                          params=dict.fromkeys(params))
    return types.SimpleNamespace(**out)


def test_the_rules_are_checked_against_their_contracts():
    plan.check_rules(rules_namespace())
    with pytest.raises(ValueError, match=r"the inputs of benchmark, \[.*\], are not its contract's"):
        plan.check_rules(rules_namespace(drop_input="benchmark"))
    with pytest.raises(ValueError, match=r"rule export_head: its settings field out_dir reads "
                                         r"params.out_dir, which the rule does not name"):
        plan.check_rules(rules_namespace(drop_param=("export_head", "out_dir")))
    plan.check_rules(rules_namespace(drop_param=("export_head", "checkpoint_dir")))  # a given head's export has none
    plan.check_rules(rules_namespace(drop_param=("export_head", "benchmarked_by")))  # optional: the job goes without


def test_record_py_reads_the_preflight_switch_from_the_plan():
    """benchmarks/gpu/record.py's plan_targets calls the package's switch rather than restating it."""
    text = (REPO / "benchmarks/gpu/record.py").read_text()
    assert "plan.preflight_enabled(" in text and '== "always" or' not in text


def test_head_inputs_are_the_given_heads_files_in_place_of_trainings():
    """Plan.head_inputs: with draft.head, the compat report reads its config.json and export its files and the report's
    decisions, nothing of training; with train.init_from, the vocab map and training read that head's files; with
    neither, every list is empty and export reads training's files."""
    from types import SimpleNamespace

    from eagle3build.workflow.plan import Plan

    base = dict(target="t", weights_problem=None, drafts=None, preflight=False, capture_vllm=False, export_vllm=False,
                export_resources={})
    head = SimpleNamespace(files=["h/config.json", "h/model.safetensors"])
    given = Plan(**base, given_head=head).head_inputs("results/r/decisions.json")
    assert (given.compat_config, given.given, given.given_decisions, given.init_from) == (
        ["h/config.json"], ["h/config.json", "h/model.safetensors"], ["results/r/decisions.json"], [])
    assert given.trained("results/r/vocab/d2t.npy") == []
    init = Plan(**base, init_head=head).head_inputs("results/r/decisions.json")
    assert (init.compat_config, init.given, init.given_decisions, init.init_from) == (
        [], [], [], ["h/config.json", "h/model.safetensors"])
    assert init.trained("results/r/vocab/d2t.npy") == "results/r/vocab/d2t.npy"
    none = Plan(**base).head_inputs("results/r/decisions.json")
    assert (none.compat_config, none.given, none.given_decisions, none.init_from) == ([], [], [], [])
