"""Every stage's interface made from the key table by one adapter (issue 66 item 1): each stage's contract names its
entry, a function of one settings object, and that object's class, whose config fields the key table makes and whose
own fields come from the job as the contract's ``from_job`` says (eagle3build.workflow.job_fields); the one adapter
(``workflow.job.run_stage``) makes the object for every stage; no stage module reads a config key by hand."""
from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
from pathlib import Path

import pytest
import yaml
from test_settings import SETTINGS, attribute

from eagle3build.config import spec as cs
from eagle3build.config.settings import default_of
from eagle3build.formats.artifacts import minimal_decisions
from eagle3build.workflow import job
from eagle3build.workflow.contract import CONTRACTS, RULE_ENTRIES, STAGE_GROUPS, STAGE_OF_RULE, job_entry, job_settings
from eagle3build.workflow.job_fields import ABSENT, JobEntry, JobField, rule_problems

REPO = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((REPO / "config.yaml").read_text())
RULES = [*CONTRACTS, *STAGE_OF_RULE, *RULE_ENTRIES]


def own_fields(cls) -> dict[str, dataclasses.Field]:
    """The fields of settings class ``cls`` that are neither config nor section fields, by name."""
    return {f.name: f for f in dataclasses.fields(cls) if f.name not in cls.CONFIG_KEYS and f.name not in cls.SECTIONS}


def required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


@pytest.mark.parametrize("rule", RULES)
def test_each_entry_takes_one_settings_object_whose_own_fields_come_from_the_job(rule):
    """The entry takes one argument (any other has a default); the settings class is one made from the key table; the
    contract's ``from_job`` fills own fields only, every own field without a default among them."""
    e = job_entry(rule)
    fn, cls = attribute(e.entry), attribute(e.settings)
    params = list(inspect.signature(fn).parameters.values())
    assert params and all(p.default is not inspect.Parameter.empty for p in params[1:]), (rule, params)
    assert cls in SETTINGS and callable(getattr(cls, "from_settings", None))
    own = own_fields(cls)
    assert set(e.from_job) <= set(own), (rule, set(e.from_job) - set(own))
    assert {n for n, f in own.items() if required(f)} <= set(e.from_job), rule


def fake_job(rule: str, tmp_path: Path) -> dict:
    """A job of ``rule`` as the adapter gets it: each named input, output, param, wildcard and resource a
    ``from_job`` source names (a shard's range; a decisions.json valid under its schema), and the job's settings."""
    e = job_entry(rule)
    decisions = tmp_path / "decisions.json"
    decisions.write_text(json.dumps(minimal_decisions("fp", [1, 2, 3], 1000)))
    parts: dict[str, dict] = {c: {} for c in ("inputs", "outputs", "params", "wildcards", "resources")}
    for f in e.from_job.values():
        if f.channel in parts:
            parts[f.channel][f.path[0]] = f"<{f}>"
    parts["inputs"]["decisions"] = str(decisions)
    if "shard" in parts["params"]:
        parts["params"]["shard"] = {"start": 64, "num_samples": 64}
    if "draft" in parts["params"]:
        parts["params"]["draft"] = {"method": "eagle3"}
    parts["resources"] = {"gpu": 2}
    stage = STAGE_OF_RULE.get(rule, rule) if rule not in RULE_ENTRIES else "compat_report"
    return {**parts, "settings": job_settings(stage, CONFIG)}


@pytest.mark.parametrize("rule", RULES)
def test_the_adapter_makes_every_rules_settings_object(rule, tmp_path):
    """``job.stage_settings``: the config fields from the job's settings, the own fields from its files, params,
    wildcards, resources and decisions.json as ``from_job`` says; an optional field the job lacks keeps its default."""
    j = fake_job(rule, tmp_path)
    s = job.stage_settings(rule, **j)
    e = job_entry(rule)
    for name, path in type(s).CONFIG_KEYS.items():
        assert getattr(s, name) == j["settings"][path], (rule, name)
    for name, f in e.from_job.items():
        if f.channel == "decisions":
            want = f.read({"decisions": minimal_decisions("fp", [1, 2, 3], 1000)})
            assert getattr(s, name) == (default_of(type(s), name) if want is ABSENT else want), (rule, name)
        elif f.path[0] not in ("draft", "shard", "decisions") and f.channel != "resources":
            assert getattr(s, name) == f"<{f}>", (rule, name)
    if "gpus" in e.from_job:
        assert s.gpus == 2


def test_a_job_without_what_a_field_reads_fails_naming_it(tmp_path):
    j = fake_job("benchmark", tmp_path)
    del j["params"]["head_dir"]
    with pytest.raises(KeyError, match=r"benchmark: settings field head_dir: the job has no params.head_dir"):
        job.stage_settings("benchmark", **j)
    j = fake_job("benchmark", tmp_path)
    j["inputs"]["custom_prompts"], j["inputs"]["preflight"] = [], []  # the input functions gave nothing
    del j["params"]["method_heads"]  # absent
    s = job.stage_settings("benchmark", **j)
    assert (s.custom_prompts_path, s.preflight_path, s.method_heads) == (None, None, [])


def test_run_stage_calls_the_entry_with_the_settings_object(tmp_path, monkeypatch):
    """One call for every stage: the entry gets the object ``stage_settings`` makes, the job's settings taken out of
    its params; the capture job's aux ids, fingerprint and backend are decisions.json's."""
    from eagle3build.capture import capture_hidden_states as cap

    seen = []
    monkeypatch.setattr(cap, "capture_shard", lambda s: seen.append(s) or "done")
    j = fake_job("capture_hidden_states", tmp_path)
    params = {**j["params"], "settings": j["settings"], "version": {"output": 1}}
    assert job.run_stage("capture_hidden_states", inputs=j["inputs"], outputs=j["outputs"], params=params,
                         wildcards={"split": "eval"}, resources={"gpu": 0}) == "done"
    (s,) = seen
    assert (s.aux_layer_ids, s.target_fingerprint, s.backend) == ([1, 2, 3], "fp", "hooks")
    assert (s.start, s.count, s.split, s.device, s.gpus) == (64, 64, "eval", "cpu", 0)
    assert s.split_samples == CONFIG["capture"]["num_eval_samples"]


def test_job_field_sources():
    f = JobField.parse("params.shard.start")
    assert (f.channel, f.path, f.optional, str(f)) == ("params", ("shard", "start"), False, "params.shard.start")
    assert f.read({"params": {"shard": {"start": 3}}}) == 3
    opt = JobField.parse("inputs.custom_prompts?")
    assert opt.read({"inputs": {"custom_prompts": []}}) is ABSENT and opt.read({}) is ABSENT
    assert opt.read({"inputs": {"custom_prompts": "p.jsonl"}}) == "p.jsonl"
    with pytest.raises(KeyError, match="the job has no params.shard.start"):
        f.read({"params": {}})
    for bad in ("config.train", "inputs", "params..x", "settings.train.lr"):
        with pytest.raises(ValueError, match="expected <channel>.<name>"):
            JobField.parse(bad)


def test_a_source_the_rule_does_not_name_is_refused():
    """When the workflow is parsed (``rule_problems``); an input or decisions.json field a field reads is the stage's by
    that field (``contract.build_contracts``)."""
    e = JobEntry.of("m:f", "m:C", {"a": "inputs.tokens", "c": "outputs.json", "d": "params.x?"})
    assert rule_problems("r", e, outputs=["png"], params=[]) == [
        "rule r: its settings field c reads outputs.json, which the rule does not name"]
    assert CONTRACTS["capture_hidden_states"].inputs == ("tokens", "decisions")
    assert CONTRACTS["capture_hidden_states"].decisions == ("capture.aux_layer_ids", "target.fingerprint",
                                                            "capture.backend", "target.quantization.scheme")


# The stage subpackages' modules: no config key read by hand there (the settings objects read them).
STAGE_MODULES = sorted(p for g in sorted(set(STAGE_GROUPS.values())) for p in (REPO / "eagle3build" / g).glob("*.py"))
KEY_PATHS = frozenset(k.path for k in cs.KEYS)
SECTIONS = frozenset(k.path.rsplit(".", i)[0] for k in cs.KEYS for i in range(1, k.path.count(".") + 1))
SETTINGS_NAMES = ("settings", "s", "config", "cfg")  # names a job's settings or config go by


def _is_key(text: str, value: ast.AST) -> bool:
    """``text`` names config keys: a declared key's dotted path or a section holding keys; a key or section of one part
    (``train``, ``run``) only where it is read from a name of ``SETTINGS_NAMES``."""
    if "." in text:
        return text in KEY_PATHS or text in SECTIONS
    return (text in KEY_PATHS or text in SECTIONS) and isinstance(value, ast.Name) and value.id in SETTINGS_NAMES


def _key_text(node: ast.AST) -> str | None:
    """A string constant's text, or an f-string's leading literal where it names a section (``capture.num_{x}``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        head = node.values[0].value
        return head.rsplit(".", 1)[0] if "." in head else None
    return None


def hand_read_keys(source: str) -> list[str]:
    """``line: code`` of each place ``source`` reads a config key by hand: a subscript, or a ``get``/``pop`` call's
    first argument, of a key's or a section's path (``_is_key``)."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Subscript):
            value, arg = n.value, n.slice
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("get", "pop")
              and n.args):
            value, arg = n.func.value, n.args[0]
        else:
            continue
        text = _key_text(arg)
        if text is not None and _is_key(text, value):
            found.append(f"{n.lineno}: {ast.unparse(n)}")
    return found


def test_no_stage_module_reads_a_config_key_by_hand():
    """A stage subpackage's module reads its settings from its settings object (``s.port``), never by a key's path
    (``settings["serve.port"]``, ``s["train"]``, ``settings[f"capture.num_{split}_samples"]``); and none takes the
    job's raw settings (``contract.StageSettings``)."""
    found = {str(p.relative_to(REPO)): hand_read_keys(p.read_text()) for p in STAGE_MODULES}
    assert {p: hits for p, hits in found.items() if hits} == {}
    assert [str(p.relative_to(REPO)) for p in STAGE_MODULES if "StageSettings" in p.read_text()] == []


def test_the_scan_finds_a_key_read_by_hand():
    source = ('def run_job(settings, report, split):\n    s = settings\n'
              '    a = s["target.served_name"], settings["capture.mode"], settings["train"], s["capture.online"]\n'
              '    b = settings[f"capture.num_{split}_samples"], settings.get("serve.port"), s.get("run")\n'
              '    c = report["capture"], report["target"]["fingerprint"], report["k"], settings["not.a.key"]\n')
    assert [re.sub(r"^\d+: ", "", h) for h in hand_read_keys(source)] == [
        "s['target.served_name']", "settings['capture.mode']", "settings['train']", "s['capture.online']",
        "settings[f'capture.num_{split}_samples']", "settings.get('serve.port')", "s.get('run')"]
