"""Every workflow profile loads and plans: dry-runs with each, and the per-job resources they print."""
from __future__ import annotations

import importlib.util

import pytest
import yaml
from smk import REPO, planned_resources

PROFILES = ["default", "blackwell-8x", "slurm", "kubernetes"]
GPU_RULES = ("capture_hidden_states", "train_draft", "benchmark", "export_head")  # export: its vLLM load check
PLUGIN = {"slurm": "snakemake_executor_plugin_slurm", "kubernetes": "snakemake_executor_plugin_kubernetes"}


def profile(name):
    return yaml.safe_load((REPO / "profiles" / name / "profile.yaml").read_text())


KIMI = REPO / "examples/configs/kimi-k2.5-8x-rtx-pro-6000.yaml"
# What the config's `resources` section owns (the one source): a profile naming any of these for a
# job would override the config behind its back (Snakemake's set-resources / default-resources win).
CONFIG_OWNED = {"gpu", "gpu_model", "threads", "cpus_per_task", "mem_mb", "mem", "runtime", "time"}


@pytest.mark.parametrize("name", PROFILES)
def test_profile_file(name):
    """profile.yaml (what Snakemake >= 9.19 reads), commented, and only where jobs run: no resource the
    config's `resources` section owns, for any job or as a default."""
    text = (REPO / "profiles" / name / "profile.yaml").read_text()
    assert text.startswith("# ") and not (REPO / "profiles" / name / "config.yaml").exists()
    p = profile(name)
    assert p.get("executor", "local") == {"slurm": "slurm", "kubernetes": "kubernetes"}.get(name, "local")
    assert "set-resources" not in p and "set-threads" not in p
    assert not CONFIG_OWNED & set(p.get("default-resources") or {}), p.get("default-resources")


def dry_run(name, tmp_path, config=KIMI):
    if name in PLUGIN and importlib.util.find_spec(PLUGIN[name]) is None:
        pytest.skip(f"{PLUGIN[name]} is not installed (requirements.txt / requirements-executors.txt)")
    (tmp_path / "examples").symlink_to(REPO / "examples")  # the Kimi config names its target relative to the repo
    return planned_resources(["--profile", str(REPO / "profiles" / name), "--configfile", str(config)], tmp_path)


def test_default_plan_asks_for_no_gpus(tmp_path):
    jobs = dry_run("default", tmp_path, REPO / "config.yaml")
    assert {r: [j.get("gpu", "0") for j in jobs[r]] for r in GPU_RULES} == {
        "capture_hidden_states": ["0"] * 3, "train_draft": ["0"], "benchmark": ["0"], "export_head": ["0"]}
    assert jobs["train_draft"][0]["mem_mb"] == "8000" and jobs["benchmark"][0]["runtime"] == "60"
    # the CPU engine: vLLM's tensor-parallel size 1 (engine_layout of 0 GPUs)
    assert {(j["tensor_parallel_size"], j["pipeline_parallel_size"]) for j in jobs["benchmark"]} == {("1", "1")}
    assert not any("gpu_model" in j for js in jobs.values() for j in js)  # no model named: none asked for


def _kimi_resources():
    return yaml.safe_load(KIMI.read_text())["resources"]


def test_blackwell_8x_plan(tmp_path):
    """The config's resources reach every job unchanged through the profile."""
    assert profile("blackwell-8x")["resources"] == ["gpu=8"]  # the machine's cap on GPUs in use at once
    r = _kimi_resources()
    jobs = dry_run("blackwell-8x", tmp_path)
    for rule, job in (("capture_hidden_states", "capture"), ("train_draft", "train"), ("benchmark", "serve"),
                      ("export_head", "serve")):
        for j in jobs[rule]:
            assert (j["gpu"], j["gpu_model"], j["mem_mb"], j["runtime"]) == (
                str(r[job]["gpu"]), r["gpu_model"], str(r[job]["mem_mb"]), str(r[job]["runtime"])), rule
    assert "gpu" not in jobs["prepare_data"][0] and "gpu" not in jobs["build_vocab_map"][0]
    assert (jobs["prepare_data"][0]["mem_mb"], jobs["prepare_data"][0]["runtime"]) == (
        str(r["cpu"]["mem_mb"]), str(r["cpu"]["runtime"]))


def test_slurm_plan(tmp_path):
    jobs = dry_run("slurm", tmp_path)
    r = _kimi_resources()
    assert {j["slurm_partition"] for js in jobs.values() for j in js if j} == {"gpu"}
    for rule, job in (("capture_hidden_states", "capture"), ("train_draft", "train"), ("benchmark", "serve"),
                      ("export_head", "serve")):
        for j in jobs[rule]:
            assert (j["gpu"], j["gpu_model"], j["mem_mb"], j["runtime"]) == (
                str(r[job]["gpu"]), r["gpu_model"], str(r[job]["mem_mb"]), str(r[job]["runtime"])), rule
    assert "gpu" not in jobs["build_vocab_map"][0]


def test_kubernetes_plan(tmp_path):
    """Over the bundled target (inputs and outputs live in the profile's storage, where a path
    under examples/ is not), with the GPU jobs of the Kimi config."""
    overlay = tmp_path / "gpus.yaml"
    overlay.write_text(yaml.safe_dump({"resources": {k: v for k, v in _kimi_resources().items()
                                                     if k in ("capture", "train", "serve", "cpu")}}))
    jobs = dry_run("kubernetes", tmp_path, overlay)
    with_gpu = [(r, j) for r, js in jobs.items() for j in js if "gpu" in j]
    assert sorted({r for r, _ in with_gpu}) == sorted(GPU_RULES + ("preflight_bound",))
    # the plugin refuses a gpu resource without a manufacturer; scale=False sets limits = requests
    assert all((j["gpu"], j["gpu_manufacturer"], j["scale"]) == ("8", "nvidia", "False") for _, j in with_gpu)
    assert jobs["compat_report"][0]["mem_mb"] == str(_kimi_resources()["cpu"]["mem_mb"])
