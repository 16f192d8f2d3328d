"""The workflow's plan (dry-runs) and its config validation."""
from __future__ import annotations

import copy
import re

import pytest
import yaml
from smk import REPO, plan_params, planned_jobs, planned_resources, run, write_config

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
    "serve_config": 1,  # the serving files: every build writes them
    "all": 1,
}


def test_default_plan(tmp_path):
    assert planned_jobs([], tmp_path) == FULL_PLAN


def test_the_server_check_is_a_target_of_its_own(tmp_path):
    """serve_check (it starts vLLM's server) is not in rule all: asked for, it plans the whole build, the serving files
    and the check, whose two logs are the job's and the server's."""
    jobs = planned_jobs(["results/default/serve/serve_check.json"], tmp_path)
    assert jobs == {**{k: v for k, v in FULL_PLAN.items() if k not in ("all", "plot_benchmark", "compat_markdown")},
                    "serve_check": 1}
    p = run(["-n", "results/default/serve/serve_check.json"], tmp_path)
    block = p.stdout.split("rule serve_check:", 1)[1].split("\n\n", 1)[0]
    assert "log: logs/default/serve_check.log, logs/default/serve_check_server.log" in block
    assert "tensor_parallel_size=1, pipeline_parallel_size=1" in block


def test_shard_count_follows_sample_count(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", capture={"num_train_samples": 200, "num_eval_samples": 130})
    jobs = planned_jobs(["--configfile", str(cfg)], tmp_path)
    assert jobs["capture_hidden_states"] == 4 + 3


def test_single_artifact_plans_only_its_inputs(tmp_path):
    jobs = planned_jobs(["results/default/vocab/vocab.json"], tmp_path)
    assert jobs == {"materialize_target": 1, "compat_report": 1, "prepare_data": 1, "build_vocab_map": 1}
    jobs = planned_jobs(["results/default/hidden_states/train/shard-00001.safetensors"], tmp_path)
    assert jobs == {"materialize_target": 1, "compat_report": 1, "prepare_data": 1, "capture_hidden_states": 1}


def test_online_mode_plans_no_shards(tmp_path):
    """capture.mode online: no capture job; train_draft reads the tokens files (and the dry-run says so)."""
    cfg = write_config(tmp_path / "c.yaml", capture={"mode": "online"})
    jobs = planned_jobs(["--configfile", str(cfg)], tmp_path)
    assert jobs == {k: v for k, v in FULL_PLAN.items() if k != "capture_hidden_states"}
    p = run(["-n", "results/default/checkpoint/config.json", "--configfile", str(cfg)], tmp_path)
    block = (p.stdout + p.stderr).split("rule train_draft:", 1)[1].split("\n\n", 1)[0]
    inputs = block.split("input: ", 1)[1].split("\n", 1)[0].split(", ")
    assert "results/default/data/train.safetensors" in inputs and "results/default/data/eval.safetensors" in inputs
    assert not any("hidden_states" in f for f in inputs)


def test_compared_heads_are_inputs_of_the_benchmark(tmp_path):
    """benchmark.compare_heads: each head's config.json and model.safetensors are the benchmark's inputs (another
    run's head retrained reruns it); a head that is not there stops the plan, named."""
    other = tmp_path / "other" / "head"
    other.mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        (other / f).write_text("{}")
    cfg = write_config(tmp_path / "c.yaml", benchmark={"compare_heads": [{"name": "peagle", "path": str(other)}]})
    p = run(["-n", "results/default/benchmark.json", "--configfile", str(cfg)], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    block = (p.stdout + p.stderr).split("rule benchmark:", 1)[1].split("\n\n", 1)[0]
    inputs = block.split("input: ", 1)[1].split("\n", 1)[0].split(", ")
    assert f"{other}/config.json" in inputs and f"{other}/model.safetensors" in inputs
    (other / "model.safetensors").unlink()
    p = run(["-n", "results/default/benchmark.json", "--configfile", str(cfg)], tmp_path)
    assert p.returncode != 0 and f"{other}/model.safetensors" in p.stdout + p.stderr
    for heads, why in (([{"name": "head", "path": str(other)}], "each must be unique and not 'head'"),
                       ([{"name": "a", "path": str(other)}, {"name": "a", "path": str(other)}], "each must be unique"),
                       ([{"name": "a", "path": "results/default/head/"}], "lists results/default/head, the run's own")):
        bad = write_config(tmp_path / "bad.yaml", benchmark={"compare_heads": heads})
        p = run(["-n", "--configfile", str(bad)], tmp_path)
        assert p.returncode != 0 and why in p.stdout + p.stderr, heads


def test_compare_methods_train_from_the_run_shards_into_its_benchmark(tmp_path):
    """draft.compare_methods: each listed method gets a training and an export job of its own under
    results/<run>/methods/<method>/, from the run's shards and vocab map (no second capture), whose params are the
    run's own training's with that method; the benchmark serves them (its inputs, its `benchmark` param).
    A listed method that is the run's own, or a name benchmark.compare_heads already uses, stops the plan."""
    cfg = write_config(tmp_path / "c.yaml", draft={"compare_methods": ["peagle", "dflash"]})
    jobs = planned_jobs(["--configfile", str(cfg)], tmp_path)
    assert jobs == {**FULL_PLAN, "train_draft_method": 2, "export_head_method": 2}
    p = run(["-n", "results/default/benchmark.json", "--configfile", str(cfg)], tmp_path)
    block = (p.stdout + p.stderr).split("rule benchmark:", 1)[1].split("\n\n", 1)[0]
    inputs = block.split("input: ", 1)[1].split("\n", 1)[0].split(", ")
    for m in ("peagle", "dflash"):
        assert f"results/default/methods/{m}/head/model.safetensors" in inputs
    p = run(["-n", "results/default/methods/peagle/checkpoint/config.json", "--configfile", str(cfg)], tmp_path)
    block = (p.stdout + p.stderr).split("rule train_draft_method:", 1)[1].split("\n\n", 1)[0]
    assert "results/default/hidden_states/train/shard-00000.safetensors" in block
    assert "results/default/vocab/d2t.npy" in block and "log: logs/default/train_draft_peagle.log" in block

    wd = tmp_path / "wd"
    wd.mkdir()
    params = plan_params(cfg, wd)
    own = params["train_draft[]"]
    (own_train,) = [v for v in own if isinstance(v, dict) and "lr" in v]
    assert "method" not in own_train
    for m in ("peagle", "dflash"):
        theirs = params[f"train_draft_method[method={m}]"]
        # the run's own training's params, but the `train` section names the method
        (train,) = [v for v in theirs if isinstance(v, dict) and "lr" in v]
        assert train == {**own_train, "method": m}
        assert [v for v in theirs if v is not train] == [v for v in own if v is not own_train]
        assert params[f"export_head_method[method={m}]"] == params["export_head[]"]
    assert any(isinstance(v, dict) and v.get("compare_methods") == ["peagle", "dflash"] for v in params["benchmark[]"])

    for draft, heads, why in (({"method": "peagle", "compare_methods": ["peagle"]}, [], "and not draft.method ('peagle')"),
                              ({"compare_methods": ["dflash"]}, [{"name": "dflash", "path": str(tmp_path)}],
                               "both name ['dflash']")):
        bad = write_config(tmp_path / "bad.yaml", draft=draft, benchmark={"compare_heads": heads})
        p = run(["-n", "--configfile", str(bad)], tmp_path)
        assert p.returncode != 0 and why in p.stdout + p.stderr, draft


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


def test_every_rule_has_a_log_and_lint_is_clean():
    p = run(["--lint"])
    assert "Lints for" not in p.stdout + p.stderr, p.stdout + p.stderr


# Distinct values per job kind: each planned job must show its own kind's.
KINDS = {"materialize": (3, 1001, 11, 0), "cpu": (1, 1002, 12, 0), "capture": (5, 1003, 13, 2),
         "train": (6, 1004, 14, 3), "serve": (7, 1005, 15, 4)}
RULE_KIND = {"materialize_target": "materialize", "compat_report": "cpu", "prepare_data": "cpu",
             "build_vocab_map": "cpu", "capture_hidden_states": "capture", "train_draft": "train",
             "export_head": "serve", "benchmark": "serve"}


def test_every_job_takes_its_resources_from_the_config(tmp_path):
    """A dry-run over a config with distinct resources per job kind: every job asks for its kind's GPUs,
    threads, memory and runtime, and GPU jobs for the config's gpu_model (the config is the one source)."""
    res = {"gpu_model": "model_x"}
    for kind, (threads, mem, runtime, gpu) in KINDS.items():
        res[kind] = {"threads": threads, "mem_mb": mem, "runtime": runtime}
        if kind not in ("materialize", "cpu"):
            res[kind]["gpu"] = gpu
    (tmp_path / "res.yaml").write_text(yaml.safe_dump({"resources": res}))
    jobs = planned_resources(["--cores", "8", "--configfile", str(tmp_path / "res.yaml")], tmp_path)  # threads unscaled
    for rule, kind in RULE_KIND.items():
        threads, mem, runtime, gpu = KINDS[kind]
        for j in jobs[rule]:
            assert (j.get("threads", "1"), j["mem_mb"], j["runtime"], j.get("gpu", "0")) == (
                str(threads), str(mem), str(runtime), str(gpu)), rule
            assert j.get("gpu_model") == ("model_x" if gpu else None), rule


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


def _export_benchmarked_by(tmp_path, targets, **dag):
    """export_head's ``benchmarked_by`` param in the default config's plan of ``targets`` (Snakemake's API, as
    tests/plan_params.py builds a plan: nothing is run)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
        wf = api.workflow(resource_settings=ResourceSettings(cores=2), snakefile=REPO / "Snakefile", workdir=tmp_path,
                          config_settings=ConfigSettings(configfiles=[REPO / "config.yaml"]))
        workflow = wf.dag(dag_settings=DAGSettings(targets=set(targets), **dag)).workflow_api._workflow
        workflow._prepare_dag(forceall=True, ignore_incomplete=True, lock_warn_only=True, nolock=True)
        workflow._build_dag()
        (job,) = [j for j in workflow.dag.jobs if j.rule.name == "export_head"]
        return job.params.benchmarked_by, job.non_derived_params


def test_export_leaves_its_load_check_to_the_benchmark_of_the_same_plan(tmp_path):
    """Issue 65: where the plan builds the run's benchmark (the default target, benchmark.json or what is made from it)
    export_head is told so (``benchmarked_by``: its engines load the head, export's own vLLM load check is left out);
    asked for the head alone, or a plan cut by --until, it is not. The param is derived: the same params are compared
    either way, so asking for the head, then for the whole run, replans nothing."""
    from eagle3build.workflow.plan import benchmark_in_plan

    full, params = _export_benchmarked_by(tmp_path, [])
    assert full == "results/default/benchmark.json"
    head, params_head = _export_benchmarked_by(tmp_path, ["results/default/head/config.json"])
    assert head is None and params_head == params
    assert _export_benchmarked_by(tmp_path, ["results/default/serve/serve_check.json"])[0] == full
    r = "results/default"
    assert benchmark_in_plan({"./results/default/report/benchmark.png"}, r) == full
    assert benchmark_in_plan({"plot_benchmark"}, r) == full and benchmark_in_plan({"export_head"}, r) is None
    assert benchmark_in_plan(set(), r, until={"export_head"}) is None
    assert benchmark_in_plan(set(), r, target_jobs={"export_head:"}) is None  # a cluster job's own Snakemake


def test_a_failed_build_ends_with_each_failed_jobs_own_error_line(tmp_path, tiny_target):
    """Issue 67: a job that fails (prepare_data on an empty conversation file) ends the build's output with what failed:
    the rule, its own one-line error (the last line of its log: the stage's message, which names the file) and its log's
    path, after Snakemake's generic "did not complete" lines."""
    (tmp_path / "empty.jsonl").write_text("  \n")
    cfg = write_config(tmp_path / "c.yaml", target={"path": str(tiny_target)},
                       data={"sources": [{"path": str(tmp_path / "empty.jsonl"), "max_samples": None}]})
    p = run(["results/default/data/data_report.json", "--configfile", str(cfg)], tmp_path / "wd")
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    tail = out[out.rindex("What failed:"):].splitlines()
    assert tail[1].startswith("  prepare_data: prepare_data failed: ") and "empty.jsonl" in tail[1], tail
    assert "file is empty" in tail[1] and tail[2] == "    log: logs/default/prepare_data.log", tail
    log = (tmp_path / "wd/logs/default/prepare_data.log").read_text().splitlines()
    assert log[-1].endswith(tail[1].split("prepare_data: ", 1)[1])


def test_aux_layer_ids_a_target_cannot_take_are_refused_at_planning(tmp_path, tiny_target):
    """Issue 67: the 6-layer target plans with the default (three distinct layers: the compat report's [1, 3, 4]),
    and ids its layers cannot take stop the plan in one line naming the key and the layer count, before any job."""
    auto = write_config(tmp_path / "auto.yaml", target={"path": str(tiny_target)})
    assert planned_jobs(["--configfile", str(auto)], tmp_path / "a")["capture_hidden_states"] == 3
    for ids, why in (([2, 3, 3], "ids must be unique"), ([1, 6], r"\[6\] out of range \[0, 5\]")):
        bad = write_config(tmp_path / "bad.yaml", target={"path": str(tiny_target)}, capture={"aux_layer_ids": ids})
        p = run(["-n", "--configfile", str(bad)], tmp_path / "b")
        out = p.stdout + p.stderr
        assert p.returncode != 0 and "Job stats" not in out
        assert re.search(rf"^config: capture\.aux_layer_ids \[.*\]: {why}.* \(target\.path {tiny_target}: 6 decoder "
                         r"layers in its config\.json\)$", out, re.M), out
