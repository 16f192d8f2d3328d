"""The stage contracts (eagle3build.workflow.contract): every config key classified, entries that read only
their stage's settings, entries and groups that exist."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from eagle3build.workflow.contract import CONTRACTS, STAGE_GROUPS, Contract, Param, job_settings

REPO = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((REPO / "schemas/config.schema.yaml").read_text())
CONFIG = yaml.safe_load((REPO / "config.yaml").read_text())


def schema_leaves(node: dict, root: dict, prefix: str = "") -> set[str]:
    """The dotted paths of the leaf keys of JSON schema ``node`` (local ``$ref`` followed; an
    object with ``properties`` is a branch, anything else, arrays of objects included, a leaf)."""
    if "$ref" in node:
        name = node["$ref"].removeprefix("#/$defs/")
        node = {**root["$defs"][name], **{k: v for k, v in node.items() if k != "$ref"}}
    if "properties" not in node:
        return {prefix}
    return set().union(*(schema_leaves(sub, root, f"{prefix}.{k}" if prefix else k)
                         for k, sub in node["properties"].items()))


def classification_problems(contracts: dict[str, Contract], leaves: set[str]) -> list[str]:
    """Each schema leaf in no stage's contract, each stage key that is no schema leaf, and each key
    that one stage has both as trigger and as runtime-only."""
    declared = {k for c in contracts.values() for k in c.triggers + c.runtime + c.files}
    out = [f"{k}: in no stage's contract" for k in sorted(leaves - declared)]
    out += [f"{k}: not a key of the config schema" for k in sorted(declared - leaves)]
    for stage, c in sorted(contracts.items()):
        out += [f"{stage}: {k} is a trigger and runtime-only" for k in sorted(set(c.triggers) & set(c.runtime))]
    return out


LEAVES = schema_leaves(SCHEMA, SCHEMA)


def test_the_schema_walk_finds_the_leaves():
    assert {"run", "data.sources", "data.regenerate.max_tokens", "capture.aux_layer_ids",
            "resources.capture.gpu", "resources.cpu.threads"} <= LEAVES
    assert "resources.cpu.gpu" not in LEAVES and "data.regenerate" not in LEAVES and "data.sources.path" not in LEAVES


def test_every_config_key_is_classified_once_per_stage():
    assert classification_problems(CONTRACTS, LEAVES) == []


def test_the_classification_check_finds_a_bad_contract():
    bad = dict(CONTRACTS)
    c = CONTRACTS["build_vocab_map"]
    bad["build_vocab_map"] = Contract(c.stage, c.group, c.inputs, (Param("draft_vocab_size", ("vocab.draft_vocab_size",)),
                                                                   Param("typo", ("vocab.draft_vocab_sise",))),
                                      c.runtime + ("vocab.draft_vocab_size",), c.files, c.decisions, c.packages, c.entry)
    bad["benchmark"] = Contract("benchmark", "serve", (), (), (), (), (), (), "")
    problems = classification_problems(bad, LEAVES)
    assert "build_vocab_map: vocab.draft_vocab_size is a trigger and runtime-only" in problems
    assert "vocab.draft_vocab_sise: not a key of the config schema" in problems
    assert "benchmark.num_prompts: in no stage's contract" in problems
    assert "benchmark.near_tie_max_logprob_gap: in no stage's contract" in problems


def test_every_stage_has_a_contract_its_entry_and_its_group():
    assert set(CONTRACTS) == set(STAGE_GROUPS) and all(s == c.stage for s, c in CONTRACTS.items())
    for stage, c in CONTRACTS.items():
        module, function = c.entry.split(":")
        assert module == f"eagle3build.{c.group}.{stage}" == c.settings.split(":")[0], (c.entry, c.settings)
        tree = ast.parse((REPO / "eagle3build" / c.group / f"{stage}.py").read_text())
        # the entry, a function of the stage's module, and its settings class beside it (tests/test_stage_entries.py)
        assert function in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, c.entry
        assert c.settings.split(":")[1] in {n.name for n in tree.body if isinstance(n, ast.ClassDef)}, c.settings
        assert len({p.name for p in c.params}) == len(c.params), stage
        assert "settings" not in {p.name for p in c.params}, stage  # the job's settings param (rules/common.smk)


def test_job_settings_hold_the_declared_keys_only():
    s = job_settings("train_draft", CONFIG)
    assert s["train.lr"] == CONFIG["train"]["lr"] and s["resources.train.gpu"] == CONFIG["resources"]["train"]["gpu"]
    assert s["train"] == {k: CONFIG["train"][k] for k in sorted(CONFIG["train"])}
    with pytest.raises(KeyError, match="'benchmark.seed' is not a setting of stage train_draft"):
        s["benchmark.seed"]
    with pytest.raises(KeyError, match="'data' is not a setting"):
        s["data"]
    assert job_settings("capture_hidden_states", CONFIG)["capture.samples_per_shard"] == \
        CONFIG["capture"]["samples_per_shard"]


def test_settings_come_with_sorted_mapping_keys():
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["data"]["sources"] = [{"path": "x.jsonl", "max_samples": None}]
    assert list(job_settings("prepare_data", cfg)["data.sources"][0]) == ["max_samples", "path"]


def test_a_rule_whose_inputs_differ_from_its_contract_stops_the_parse(tmp_path):
    """workflow.plan.check_rules, run by the Snakefile at every parse."""
    import os
    import shutil
    import subprocess
    import sys

    for part in ("Snakefile", "config.yaml", "rules", "scripts", "schemas", "envs", "profiles", "eagle3build", "report"):
        src = REPO / part
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, tmp_path / part)
    contract = tmp_path / "eagle3build/workflow/contract.py"
    text = contract.read_text()
    edited = text.replace('Stage("preflight_bound", "compat", inputs=("target", "decisions"),',
                          'Stage("preflight_bound", "compat", inputs=("decisions",),')
    assert edited != text
    contract.write_text(edited)
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    p = subprocess.run([snakemake, "-l"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert p.returncode != 0
    assert "the inputs of preflight_bound, ['decisions', 'target'], are not its contract's ['decisions']" in p.stderr


def test_each_param_is_made_by_its_function():
    """A param is its keys' values passed to its ``make`` (no dispatch on strings): a value, a section, a
    setting as requested, the regenerated answers in place of the sources, the online states' settings."""
    from eagle3build.workflow import contract as c

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["data"]["regenerate"]["enabled"] = True
    ctx = c.PlanContext("prepare_data", decisions=None, regenerated="results/x/data/regenerated.jsonl")
    params = {p.name: c.param_value(p, cfg, ctx) for p in CONTRACTS["prepare_data"].params}
    assert params["sources"] == [{"max_samples": None, "path": "results/x/data/regenerated.jsonl"}]
    assert params["max_seq_len"] == cfg["data"]["max_seq_len"] and params["num_aux_layers"] == 3
    assert params["require_eval"] is (cfg["capture"]["num_eval_samples"] > 0)
    train = next(p for p in CONTRACTS["train_draft"].params if p.name == "train")
    # every train key but the runtime-only ones (train.compile, train.compile_breaks: how a step is computed)
    runtime = {k for k in cfg["train"] if f"train.{k}" in CONTRACTS["train_draft"].runtime}
    assert runtime == {"compile", "compile_breaks"}
    # train.init_from (issue 72) left out at its default, null: builds made before it keep their param
    assert c.param_value(train, cfg, ctx) == {k: cfg["train"][k] for k in sorted(cfg["train"])
                                              if k not in runtime and k != "init_from"}
    with_head = {**cfg, "train": {**cfg["train"], "init_from": "heads/h"}}
    assert c.param_value(train, with_head, ctx)["init_from"] == "heads/h"
    cfg["capture"].update(mode="online", num_train_samples=7)
    online = next(p for p in CONTRACTS["train_draft"].params if p.name == "online")
    assert c.param_value(online, cfg, ctx) == {
        "num_train_samples": 7, "num_eval_samples": cfg["capture"]["num_eval_samples"],
        "storage_dtype": cfg["capture"]["storage_dtype"], "tokens_per_batch": cfg["capture"]["tokens_per_batch"],
        "compute_dtype": cfg["capture"]["compute_dtype"]}
    # aux ids as requested: pinning what an earlier report chose under `auto` reads as `auto`
    recorded = {"capture": {"aux_layer_ids": [1, 2, 3], "aux_layer_ids_requested": "auto"}}
    aux = Param("aux_layer_ids", ("capture.aux_layer_ids",), c.requested)
    cfg["capture"]["aux_layer_ids"] = [1, 2, 3]
    assert c.param_value(aux, cfg, c.PlanContext("capture_hidden_states", decisions=recorded)) == "auto"
    cfg["capture"]["aux_layer_ids"] = [1, 2, 4]
    assert c.param_value(aux, cfg, c.PlanContext("capture_hidden_states", decisions=recorded)) == [1, 2, 4]
    assert c.param_value(Param("k", ("benchmark.ks", "preflight.max_k"), c.section), cfg, ctx) == {
        "ks": cfg["benchmark"]["ks"], "max_k": cfg["preflight"]["max_k"]}


def test_a_setting_of_a_set_not_run_changes_no_param():
    """Key.only_with: benchmark.mtbench.* shape the benchmark only where benchmark.sets has mtbench; elsewhere the
    benchmark's param leaves them out, so a config that sets them for a set it does not run (the GPU recipe over the
    reduced build's [chat, humaneval]) replans nothing; where mtbench runs they are in it once off their default."""
    import copy

    import yaml

    from eagle3build.workflow import contract

    base = yaml.safe_load((REPO / "config.yaml").read_text())
    p = next(x for x in contract.CONTRACTS["benchmark"].params if x.name == "benchmark")

    def param(sets, per_category, turns=1):
        cfg = copy.deepcopy(base)
        cfg["benchmark"].update(sets=sets, mtbench={"per_category": per_category, "turns": turns})
        return contract.param_value(p, cfg, contract.PlanContext("benchmark"))

    two = ["chat", "humaneval"]
    assert param(two, 10, 2) == param(two, 1) and "mtbench_per_category" not in param(two, 10)
    assert "mtbench_per_category" not in param(["chat", "mtbench"], 1)  # the default: quiet
    assert param(["chat", "mtbench"], 10)["mtbench_per_category"] == 10
    assert param(["chat", "mtbench"], 1, 2)["mtbench_turns"] == 2
