"""Example configs for real deployments: they validate, plan the right GPUs per job, and the compat
report's disk estimate for them (config-only targets, inspected on the meta device)."""
from __future__ import annotations

import dataclasses

import pytest
import yaml
from smk import REPO, planned_jobs, planned_resources

GPU_RULES = ("capture_hidden_states", "train_draft", "benchmark", "export_head")  # export: its vLLM load check
# config -> (GPUs per GPU job, capture jobs, bytes per captured token: 3 aux + 1 last state x H x 2 B, aux ids)
EXAMPLES = {
    "kimi-k2.5-8x-rtx-pro-6000": (8, 157 + 4, 4 * 7168 * 2, [2, 30, 58]),
    "llama-3.1-8b-1gpu": (1, 40 + 1, 4 * 4096 * 2, [2, 16, 29]),
}


def workdir(tmp_path):
    (tmp_path / "examples").symlink_to(REPO / "examples")  # the configs name their targets relative to the repo
    return tmp_path


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_plans_gpus_per_job(tmp_path, name):
    gpus, captures, _, _ = EXAMPLES[name]
    args = ["--configfile", str(REPO / f"examples/configs/{name}.yaml")]
    jobs = planned_resources(args, workdir(tmp_path))
    assert len(jobs["capture_hidden_states"]) == captures and "materialize_target" not in jobs
    for rule in GPU_RULES:
        assert {j["gpu"] for j in jobs[rule]} == {str(gpus)}, rule
    assert all("gpu" not in j for r in ("prepare_data", "build_vocab_map") for j in jobs[r])


@pytest.mark.parametrize("name, captures, gpus", [
    ("smollm2-8k-gpu", 4 + 1, dict.fromkeys(GPU_RULES, "1")),
    ("smollm2-full-gpu", 24 + 1, {**dict.fromkeys(GPU_RULES, "1"), "train_draft": "2"})])
def test_smollm2_gpu_examples_plan(tmp_path, name, captures, gpus):
    """The bundled target's GPU recipes (8,000 samples in shards of 2,000; 12,000 in shards of 500), one eval
    shard each, the GPUs each job asks for, the bundled target materialised first."""
    jobs = planned_resources(["--configfile", str(REPO / f"examples/configs/{name}.yaml")], workdir(tmp_path))
    assert len(jobs["capture_hidden_states"]) == captures and len(jobs["materialize_target"]) == 1
    assert {rule: {j["gpu"] for j in jobs[rule]} for rule in GPU_RULES} == {r: {g} for r, g in gpus.items()}


def test_kimi_with_blackwell_profile(tmp_path):
    """The 8-GPU profile over the Kimi config: every GPU job asks for the machine's 8 cards."""
    args = ["--profile", str(REPO / "profiles/blackwell-8x"),
            "--configfile", str(REPO / "examples/configs/kimi-k2.5-8x-rtx-pro-6000.yaml")]
    jobs = planned_resources(args, workdir(tmp_path))
    assert {(j["gpu"], j["gpu_model"]) for r in GPU_RULES for j in jobs[r]} == {("8", "rtx_pro_6000_blackwell")}
    assert planned_jobs(args, tmp_path)["capture_hidden_states"] == 161
    # each engine's layout in the plan, beside its GPUs: tensor-parallel over the job's 8 cards, one pipeline stage
    # (capture: backend auto may take vllm for this MoE target); no engine in training offline nor in the CPU jobs
    assert engine_layouts(jobs) == {**dict.fromkeys(ENGINE_RULES, {("8", "1")}), "train_draft": {None}}


ENGINE_RULES = ("capture_hidden_states", "preflight_bound", "export_head", "benchmark")


def engine_layouts(jobs):
    """Rule -> the set of (tensor_parallel_size, pipeline_parallel_size) of its planned jobs (None: not shown)."""
    layouts = {r: {(j["tensor_parallel_size"], j["pipeline_parallel_size"]) if "tensor_parallel_size" in j else None
                   for j in js} for r, js in jobs.items()}
    assert {r for r, v in layouts.items() if v != {None}} <= set(ENGINE_RULES)
    return {r: v for r, v in layouts.items() if r in (*ENGINE_RULES, "train_draft")}


def test_the_plan_shows_the_layout_the_engines_are_given(tmp_path):
    """The Kimi example with two pipeline stages (target.pipeline_parallel_size) and its capture pinned to the hooks
    backend: the plan shows each serving engine's layout as engine_args gives it to vLLM, and no capture
    engine."""
    from eagle3build.vllm.engine_args import engine_args

    over = tmp_path / "pp2.yaml"
    over.write_text(yaml.safe_dump({"target": {"pipeline_parallel_size": 2}, "capture": {"backend": "hooks"}}))
    (tmp_path / "wd").mkdir()
    jobs = planned_resources(["--configfile", str(REPO / "examples/configs/kimi-k2.5-8x-rtx-pro-6000.yaml"), str(over)],
                             workdir(tmp_path / "wd"))
    eng = engine_args(str(REPO / "examples/targets/kimi-k2.5-shape"), gpus=int(jobs["benchmark"][0]["gpu"]),
                      served_name="m", max_model_len=8, seed=0, pipeline_parallel_size=2)
    assert (eng["tensor_parallel_size"], eng["pipeline_parallel_size"]) == (8, 2)
    assert engine_layouts(jobs) == {"capture_hidden_states": {None}, "preflight_bound": {("8", "2")},
                                    "export_head": {("8", "2")}, "benchmark": {("8", "2")}, "train_draft": {None}}


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_disk_and_gpu_plan(tmp_path, name):
    """The compat report's plans, its settings made from the config as the job's are, with the hooks backend:
    the plans do not depend on it, and an example's ``auto`` on the Kimi MoE would start the vLLM capture probe's
    engine (~17 s; make check starts none: test_vllm_capture.py runs the probe)."""
    from snakemake.utils import update_config

    from eagle3build.compat import compat_report as cr
    from eagle3build.config import spec
    from eagle3build.workflow.contract import job_settings

    _, _, bpt, aux = EXAMPLES[name]
    cfg = yaml.safe_load((REPO / f"examples/configs/{name}.yaml").read_text())
    cap, res = cfg["capture"], cfg["resources"]
    tokens = (cap["num_train_samples"] + cap["num_eval_samples"]) * cfg["data"]["max_seq_len"]
    config = spec.defaults()
    update_config(config, cfg)  # over config.yaml, as the Snakefile reads it
    s = cr.CompatSettings.from_settings(job_settings("compat_report", config),
                                        target_dir=str(REPO / cfg["target"]["path"]), results_dir=str(tmp_path))
    assert s.job_gpus == {"capture": res["capture"]["gpu"], "serve": res["serve"]["gpu"]}
    r = cr.build_report(dataclasses.replace(s, backend="hooks"))
    assert r["capture"]["aux_layer_ids"] == aux and r["capture"]["bytes_per_token"] == bpt
    disk = r["plans"]["disk"]
    assert (disk["planned_tokens"], disk["needed_bytes"]) == (tokens, bpt * tokens)
    assert disk["needed_bytes"] == {"kimi-k2.5-8x-rtx-pro-6000": 1_204_469_891_072,  # 1.20 TB
                                    "llama-3.1-8b-1gpu": 344_134_254_592}[name]       # 344 GB
    g = r["plans"]["gpus"]
    assert g["status"] == "ok" and g["gpus_needed_per_job"] == {"kimi-k2.5-8x-rtx-pro-6000": 8,
                                                                "llama-3.1-8b-1gpu": 1}[name]


def test_kimi_online_plans_no_shards_and_splits_the_cards(tmp_path):
    """The Kimi config trained online on 8 B200s: no capture job, training on the 8 cards beside the target; the
    compat report's split fits there (target 91.9 of 108 GB per card: the INT4 checkpoint's 595 GB, issue 74; trainer
    47.9 of 72 GB) and is refused,
    with the numbers, on the 96 GB cards of the offline example."""
    from eagle3build.compat import compat_report as cr
    from eagle3build.compat.probes import inspect_target

    kimi, online = (str(REPO / f"examples/configs/{n}.yaml") for n in ("kimi-k2.5-8x-rtx-pro-6000",
                                                                          "kimi-k2.5-online-8x-b200"))
    jobs = planned_resources(["--configfile", kimi, online], workdir(tmp_path))
    assert "capture_hidden_states" not in jobs and [j["gpu"] for j in jobs["train_draft"]] == ["8"]
    cfg = yaml.safe_load(open(kimi))
    target_dir = str(REPO / cfg["target"]["path"])
    target = inspect_target(target_dir)
    plan = {"gpus": 8, "total_seq_len": cfg["train"]["total_seq_len"], "ttt_steps": cfg["train"]["ttt_steps"],
            "draft_vocab_size": cfg["vocab"]["draft_vocab_size"], "tokens_per_batch": cfg["capture"]["tokens_per_batch"],
            "max_seq_len": cfg["data"]["max_seq_len"]}
    capture = {"aux_layer_ids": [2, 30, 58], "backend": "vllm"}
    ok = cr.plan_online(target_dir, target, capture, {**plan, "target_memory_fraction": 0.6}, int(180e9))
    assert ok["status"] == "ok" and ok["message"] == "target 91.9 of 108.0 GB per GPU, trainer 47.9 of 72.0 GB"
    bad = cr.plan_online(target_dir, target, capture, {**plan, "target_memory_fraction": 0.9}, int(96e9))
    assert bad["status"] == "fail" and bad["message"] == (
        "the target needs 91.9 GB per GPU (weights 74.4 GB x 1.2 + KV cache) but capture.online.target_memory_fraction "
        "0.9 of 96 GB gives it 86.4 GB; the trainer needs 47.9 GB (states 18.6, activations 29.3) but the rest of a "
        "96 GB GPU after the target's share is 9.6 GB")
