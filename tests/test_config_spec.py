"""eagle3build.config.spec: each config key declared once, and what derives from the declarations: the config
schema (schemas/config.schema.yaml), the stage contracts' keys and params, the jobs' settings and TrainConfig."""
from __future__ import annotations

import dataclasses

import jsonschema
import pytest
import yaml
from smk import REPO

from eagle3build.config import spec as cs
from eagle3build.train.trainer import TrainConfig, train_config_class
from eagle3build.workflow.contract import CONTRACTS, PlanContext, build_contracts, job_settings, param_value

CONFIG = yaml.safe_load((REPO / "config.yaml").read_text())


def test_the_schema_file_is_the_generated_one():
    """schemas/config.schema.yaml is ``python -m eagle3build.config.spec``'s output, byte for byte."""
    assert (REPO / "schemas/config.schema.yaml").read_text() == cs.schema_yaml()


def test_config_yaml_holds_every_key_at_its_default():
    assert CONFIG == cs.defaults()
    jsonschema.validate(CONFIG, cs.json_schema())


def test_config_yaml_is_the_generated_one():
    """config.yaml is ``python -m eagle3build.config.spec --config-yaml``'s output, byte for byte: every key in
    declaration order with its declared doc as its comment, no line past 120 characters."""
    text = (REPO / "config.yaml").read_text()
    assert text == cs.config_yaml()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= cs.LINE_WIDTH
    assert "  checkpoint_every: 20              # steps between resumable training states (0 = none); resumed on the " \
           "same GPU count" in lines
    assert "                                    # or fewer" in lines


def test_config_yaml_comments_are_the_declared_docs():
    """Each key's line carries its doc, wrapped onto the comment lines below it (a doc edited in the declaration
    is what config.yaml says); a section's line carries its SECTION_DOCS entry; a new key gets its line."""
    keys = cs.KEYS + (cs.Key("train.label_smoothing", {"type": "number"}, 0.1, "label smoothing of the draft's loss "
                             "(0 = none), a doc long enough to be wrapped onto a second comment line of config.yaml",
                             {"train_draft": "trigger:train"}),)
    text = cs.config_yaml(keys, {"train": "the training", "train.sub": "unused"})
    assert yaml.safe_load(text) == cs.defaults(keys)
    lines = text.splitlines()
    i = lines.index("  label_smoothing: 0.1              # label smoothing of the draft's loss (0 = none), a doc long "
                    "enough to be wrapped")
    assert lines[i + 1] == " " * cs.COMMENT_COLUMN + "# onto a second comment line of config.yaml"
    assert "train:".ljust(cs.COMMENT_COLUMN) + "# the training" in lines
    assert "target:" in lines  # a section without a doc: no comment


def test_the_generator_prints_schema_and_config():
    import subprocess
    import sys

    def out(*args):
        return subprocess.run([sys.executable, "-m", "eagle3build.config.spec", *args], capture_output=True, text=True,
                              cwd=REPO)

    assert out().stdout == cs.schema_yaml()
    assert out("--config-yaml").stdout == cs.config_yaml()
    bad = out("--config")
    assert bad.returncode != 0 and "usage: python -m eagle3build.config.spec [--config-yaml]" in bad.stderr


def test_every_key_has_a_doc_a_type_and_a_stage():
    reached = {k for c in CONTRACTS.values() for k in (*c.triggers, *c.runtime, *c.files)}
    for k in cs.KEYS:
        assert k.doc and ("type" in k.schema or "oneOf" in k.schema), k.path
        assert k.path in reached, f"{k.path} reaches no stage"


def test_train_config_is_the_train_section():
    """The stage's settings object has the section's keys, config.yaml's values as defaults (the copies that
    drifted: lr, ttt_steps, epochs, total_seq_len) and its choices as checks."""
    fields = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    assert fields == CONFIG["train"]
    assert (TrainConfig().lr, TrainConfig().ttt_steps, TrainConfig().epochs, TrainConfig().total_seq_len) == (
        CONFIG["train"]["lr"], CONFIG["train"]["ttt_steps"], CONFIG["train"]["epochs"], CONFIG["train"]["total_seq_len"])
    with pytest.raises(ValueError, match=r"train.select 'first' is not one of \['best_simulated_tau', 'last'\]"):
        TrainConfig(select="first")


def test_a_key_added_reaches_schema_contract_and_settings(edited_stages):
    """A new ``Key`` (a train setting, which train_draft's ``train.*`` takes into its ``train`` param, and a benchmark
    setting read at run time only, the benchmark's ``STAGE`` line saying so over its ``benchmark.*`` triggers): it is
    in the schema (required, typed, bounded, documented), in the contracts (train_draft's ``train`` param and
    triggers; the benchmark's runtime keys, in no param) and in the jobs' settings and TrainConfig at its default."""
    keys = cs.KEYS + (
        cs.Key("train.label_smoothing", {"type": "number", "minimum": 0, "maximum": 1}, 0.1,
               "label smoothing of the draft's loss"),
        cs.Key("benchmark.warmup_prompts", {"type": "integer", "minimum": 0}, 2, "prompts decoded before timing"),
    )
    schema = cs.json_schema(keys)
    train = schema["properties"]["train"]
    assert train["properties"]["label_smoothing"] == {"type": "number", "minimum": 0, "maximum": 1,
                                                      "description": "label smoothing of the draft's loss"}
    assert "label_smoothing" in train["required"]
    config = cs.defaults(keys)
    jsonschema.validate(config, schema)
    with pytest.raises(jsonschema.ValidationError, match="is greater than the maximum"):
        jsonschema.validate({**config, "train": {**config["train"], "label_smoothing": 2}}, schema)

    edit = ('"benchmark.*": "trigger:benchmark",', '"benchmark.*": "trigger:benchmark", "benchmark.warmup_prompts": "runtime",')
    contracts = build_contracts(edited_stages("benchmark", *edit), keys)
    c = contracts["train_draft"]
    assert "train.label_smoothing" in c.triggers and "train.label_smoothing" not in CONTRACTS["train_draft"].triggers
    (train_param,) = [p for p in c.params if p.name == "train"]
    assert param_value(train_param, config, PlanContext("train_draft"))["label_smoothing"] == 0.1
    b = contracts["benchmark"]
    assert "benchmark.warmup_prompts" in b.runtime and "benchmark.warmup_prompts" not in b.triggers

    assert job_settings("train_draft", config, contracts)["train"]["label_smoothing"] == 0.1
    assert job_settings("benchmark", config, contracts)["benchmark.warmup_prompts"] == 2
    assert train_config_class(keys)().label_smoothing == 0.1
    # the other stages' contracts are those of the shipped declarations
    assert {s: x for s, x in contracts.items() if s not in ("train_draft", "benchmark")} == {
        s: x for s, x in CONTRACTS.items() if s not in ("train_draft", "benchmark")}


def test_a_bad_declaration_is_refused(edited_stages):
    edit = '"vocab.draft_vocab_size": "trigger"'
    with pytest.raises(ValueError, match="stage build_vocab_map: its key 'vocab.draft_vocab_sise' is no config key"):
        build_contracts(edited_stages("build_vocab_map", edit, '"vocab.draft_vocab_sise": "trigger"'))
    with pytest.raises(ValueError, match=r"roles \['rerun'\]"):
        build_contracts(edited_stages("build_vocab_map", edit, '"vocab.draft_vocab_size": "rerun"'))
    with pytest.raises(ValueError, match="two trigger keys named 'seed'"):
        build_contracts(edited_stages("regenerate_responses", '"data.seed": "trigger"',
                                      '"data.seed": "trigger", "capture.seed": "trigger"'),
                        cs.KEYS + (cs.Key("capture.seed", {"type": "integer"}, 1, "x"),))
    with pytest.raises(ValueError, match=r"computed params \['onlien'\]"):
        build_contracts(edited_stages("train_draft", '"online": "online"', '"online": "onlien"'))
    with pytest.raises(ValueError, match="train.lr: declared twice"):
        cs.json_schema(cs.KEYS + (cs.key("train.lr"),))


def test_upgrade_moves_a_renamed_key():
    """benchmark.dtype, from a config written before issue 39, becomes target.serve_dtype, over the default's."""
    cfg = cs.defaults()
    cfg["benchmark"]["dtype"] = "bfloat16"
    assert cs.upgrade(cfg) == [("benchmark.dtype", "target.serve_dtype")]
    assert cfg["target"]["serve_dtype"] == "bfloat16" and "dtype" not in cfg["benchmark"]
    jsonschema.validate(cfg, cs.json_schema())
    assert cs.upgrade(cfg) == []  # nothing left to move
    # the benchmark's section param names it `dtype` still: a build made before the rename is not replanned
    (bench,) = [p for p in CONTRACTS["benchmark"].params if p.name == "benchmark"]
    assert param_value(bench, cfg, PlanContext("benchmark"))["dtype"] == "bfloat16"



def test_dtype_keys_are_named_for_what_they_set():
    """Issue 52: target.dtype set the capture's compute dtype, export.dtype the exported weights'; their names now
    say so (capture.compute_dtype, export.weights_dtype), and a config of the old names is moved to the new ones,
    whose params keep the names they had (compute_dtype, dtype), so no build replans."""
    dtypes = sorted(k.path for k in cs.KEYS if k.name.endswith("dtype"))
    assert dtypes == ["capture.compute_dtype", "capture.storage_dtype", "export.weights_dtype", "target.serve_dtype"]
    cfg = cs.defaults()
    cfg["target"]["dtype"] = "float32"
    cfg["export"]["dtype"] = "float16"
    del cfg["export"]["weights_dtype"]
    assert cs.upgrade(cfg) == [("target.dtype", "capture.compute_dtype"), ("export.dtype", "export.weights_dtype")]
    assert (cfg["capture"]["compute_dtype"], cfg["export"]["weights_dtype"]) == ("float32", "float16")
    jsonschema.validate(cfg, cs.json_schema())
    values = {p.name: param_value(p, cfg, PlanContext(stage))
              for stage in ("capture_hidden_states", "export_head") for p in CONTRACTS[stage].params}
    assert (values["compute_dtype"], values["dtype"]) == ("float32", "float16")


def test_a_config_of_the_old_dtype_keys_plans_the_same(tmp_path):
    """The reduced test config written with target.dtype and export.dtype plans the params recorded for it
    (tests/plan_params/reduced.json): the upgrade moves both keys, and no job replans."""
    import json

    from test_no_replan import CONFIGS, RECORDED, plan_params

    cfg = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())
    cfg["target"]["dtype"] = cfg["capture"].pop("compute_dtype")
    cfg["export"]["dtype"] = "bfloat16"
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(cfg))
    CONFIGS["old-dtype-keys"] = str(tmp_path / "old.yaml")
    try:
        assert plan_params("old-dtype-keys", tmp_path) == json.loads((RECORDED / "reduced.json").read_text())
    finally:
        del CONFIGS["old-dtype-keys"]
