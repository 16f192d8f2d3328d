"""The workflow's plan (dry-runs) and its config validation."""
from __future__ import annotations

import copy

import pytest
import yaml
from smk import REPO, planned_jobs, run, write_config

FULL_PLAN = {
    "materialize_target": 1,
    "compat_report": 1,
    "compat_markdown": 1,
    "prepare_data": 1,
    "capture_hidden_states": 3,  # 128 train samples / 64 per shard = 2, plus 1 eval shard
    "build_vocab_map": 1,
    "train_draft": 1,
    "export_head": 1,
    "benchmark": 1,
    "plot_benchmark": 1,
    "all": 1,
}


def test_default_plan(tmp_path):
    assert planned_jobs([], tmp_path) == FULL_PLAN


def test_shard_count_follows_sample_count(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", capture={"num_train_samples": 200, "num_eval_samples": 130})
    jobs = planned_jobs(["--configfile", str(cfg)], tmp_path)
    assert jobs["capture_hidden_states"] == 4 + 3


def test_single_artifact_plans_only_its_inputs(tmp_path):
    jobs = planned_jobs(["results/default/vocab/vocab.json"], tmp_path)
    assert jobs == {"materialize_target": 1, "compat_report": 1, "prepare_data": 1, "build_vocab_map": 1}
    jobs = planned_jobs(["results/default/hidden_states/train/shard-00001.safetensors"], tmp_path)
    assert jobs == {"materialize_target": 1, "compat_report": 1, "prepare_data": 1, "capture_hidden_states": 1}


def test_user_target_dir_skips_materialize(tmp_path, tiny_target):
    cfg = write_config(tmp_path / "c.yaml", target={"path": str(tiny_target)})
    jobs = planned_jobs(["--configfile", str(cfg)], tmp_path)
    assert "materialize_target" not in jobs and jobs["capture_hidden_states"] == 3


def test_misspelled_key_stops_before_any_job(tmp_path):
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["train"]["learning_rate"] = 0.1
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    p = run(["-n", "--configfile", str(tmp_path / "c.yaml")], tmp_path)
    assert p.returncode != 0
    assert "learning_rate" in p.stdout + p.stderr
    assert "Job stats" not in p.stdout + p.stderr


@pytest.mark.parametrize("section, key", [("train", "lr"), ("capture", "storage_dtype"), (None, "benchmark")])
def test_missing_key_is_named(section, key):
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    validate(copy.deepcopy(cfg), str(REPO / "schemas/config.schema.yaml"))  # the default is valid
    del (cfg[section] if section else cfg)[key]
    with pytest.raises(WorkflowError, match=f"'{key}' is a required property"):
        validate(cfg, str(REPO / "schemas/config.schema.yaml"))


def test_rules_declare_resources_and_logs():
    """Every GPU-capable rule asks for gpu/threads/mem/runtime; every rule has a log (snakemake --lint clean)."""
    p = run(["--lint"])
    assert "Lints for" not in p.stdout + p.stderr, p.stdout + p.stderr
    text = "".join((REPO / "rules" / f"{r}.smk").read_text() for r in ("capture_hidden_states", "train_draft", "benchmark"))
    assert text.count("gpu=res(") == 3 and text.count("runtime=res(") == 3
    # memory: plain for training; growing with the attempt where a vLLM engine may run (rules/common.smk)
    assert text.count("mem_mb=res(") == 1 and text.count("mem_mb=attempt_mem_mb(res(") == 2
    vllm_rules = ("capture_hidden_states", "benchmark", "regenerate_responses", "export_head")
    for r in vllm_rules:
        assert "retries: VLLM_RETRIES" in (REPO / "rules" / f"{r}.smk").read_text(), r


def test_vllm_jobs_get_more_memory_on_a_retry():
    """attempt_mem_mb (rules/common.smk): the base at attempt 1, 1.5x at attempt 2, 2x at attempt 3."""
    from snakemake.common import FUNC_OVERWRITE_PARAMS_ATTR, get_function_params, overwrite_function_params

    ns = {"get_function_params": get_function_params, "overwrite_function_params": overwrite_function_params}
    src = (REPO / "rules/common.smk").read_text()
    for name in ("def signature_once", "def attempt_mem_mb"):
        start = src.index(name)
        exec(src[start:src.index("\n\n\n", start)], ns)
    f = ns["attempt_mem_mb"](12000)
    assert [f(None, a) for a in (1, 2, 3)] == [12000, 18000, 24000]
    # its signature is recorded once (Snakemake reads it for every job), as inspect gives it
    assert list(getattr(f, FUNC_OVERWRITE_PARAMS_ATTR)) == ["wildcards", "attempt"]
