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


@pytest.mark.parametrize("name", PROFILES)
def test_profile_file(name):
    """profile.yaml (what Snakemake >= 9.19 reads), commented, and a GPU rule's set-resources names its GPUs."""
    text = (REPO / "profiles" / name / "profile.yaml").read_text()
    assert text.startswith("# ") and not (REPO / "profiles" / name / "config.yaml").exists()
    p = profile(name)
    assert p.get("executor", "local") == {"slurm": "slurm", "kubernetes": "kubernetes"}.get(name, "local")
    if name != "default":
        assert {r: p["set-resources"][r]["gpu"] for r in GPU_RULES} == {r: 8 for r in GPU_RULES}


def dry_run(name, tmp_path):
    if name in PLUGIN and importlib.util.find_spec(PLUGIN[name]) is None:
        pytest.skip(f"{PLUGIN[name]} is not installed (requirements.txt / requirements-executors.txt)")
    return planned_resources(["--profile", str(REPO / "profiles" / name)], tmp_path)


def test_default_plan_asks_for_no_gpus(tmp_path):
    jobs = dry_run("default", tmp_path)
    assert {r: [j.get("gpu", "0") for j in jobs[r]] for r in GPU_RULES} == {
        "capture_hidden_states": ["0"] * 3, "train_draft": ["0"], "benchmark": ["0"], "export_head": ["0"]}
    assert jobs["train_draft"][0]["mem_mb"] == "8000" and jobs["benchmark"][0]["runtime"] == "60"


def test_blackwell_8x_plan(tmp_path):
    assert profile("blackwell-8x")["resources"] == ["gpu=8"]  # the machine's cap on GPUs in use at once
    jobs = dry_run("blackwell-8x", tmp_path)
    for rule, runtime in (("capture_hidden_states", "240"), ("train_draft", "1440"), ("benchmark", "180"),
                          ("export_head", "60")):
        for j in jobs[rule]:
            assert (j["gpu"], j["gpu_model"], j["mem_mb"], j["runtime"]) == ("8", "rtx_pro_6000_blackwell", "256000", runtime)
    assert len(jobs["capture_hidden_states"]) == 3
    assert "gpu" not in jobs["prepare_data"][0] and "gpu" not in jobs["build_vocab_map"][0]


def test_slurm_plan(tmp_path):
    jobs = dry_run("slurm", tmp_path)
    assert {j["slurm_partition"] for js in jobs.values() for j in js if j} == {"gpu"}
    for rule, cpus, runtime in (("capture_hidden_states", "16", "240"), ("train_draft", "32", "1440"),
                                ("benchmark", "16", "180"), ("export_head", "16", "60")):
        for j in jobs[rule]:
            assert (j["gpu"], j["gpu_model"], j["cpus_per_task"], j["mem_mb"], j["runtime"]) == (
                "8", "rtx_pro_6000", cpus, "256000", runtime)
    assert (jobs["prepare_data"][0]["cpus_per_task"], jobs["prepare_data"][0]["mem_mb"]) == ("2", "8000")
    assert "gpu" not in jobs["build_vocab_map"][0]


def test_kubernetes_plan(tmp_path):
    jobs = dry_run("kubernetes", tmp_path)
    with_gpu = [(r, j) for r, js in jobs.items() for j in js if "gpu" in j]
    assert sorted({r for r, _ in with_gpu}) == sorted(GPU_RULES)
    # the plugin refuses a gpu resource without a manufacturer; scale=False sets limits = requests
    assert all((j["gpu"], j["gpu_manufacturer"], j["scale"]) == ("8", "nvidia", "False") for _, j in with_gpu)
    assert jobs["compat_report"][0]["mem_mb"] == "8000"
