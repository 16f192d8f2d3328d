"""The GPU record overlays under benchmarks/gpu/ validate against the config schema, merged as
benchmarks/gpu/run_h200.sh merges them (config.yaml, then h200_8k.yaml, then the overlay), so that a
lent device's minutes are not spent on a typo'd key (the schema refuses unknown keys)."""
from __future__ import annotations

import copy
import json
import sys

import pytest
import yaml
from smk import REPO
from snakemake.utils import validate

sys.path.insert(0, str(REPO / "benchmarks"))
from recipe_sweep import merged_config  # noqa: E402  (config.yaml, a base, overrides: Snakemake's own merge)

GPU = REPO / "benchmarks/gpu"
BASES = ("h200_8k.yaml", "h200_online.yaml")  # records of their own; every other overlay goes over h200_8k.yaml


def merged(*names: str) -> dict:
    """config.yaml, then ``names[0]``, then each further overlay in order (run_h200.sh's --configfile order), its
    renamed keys moved as the Snakefile moves them."""
    from snakemake.utils import update_config

    from eagle3build.config_spec import upgrade

    base, *over = names
    cfg = merged_config(GPU / base, {})
    for name in over:
        update_config(cfg, yaml.safe_load((GPU / name).read_text()))
    upgrade(cfg)  # as the Snakefile does: a recorded overlay may name a key renamed since (config_spec.RENAMED)
    return cfg


@pytest.mark.parametrize("name", sorted(p.name for p in GPU.glob("*.yaml")))
def test_overlay_validates(name):
    names = (name,) if name in BASES else ("h200_8k.yaml", name)
    cfg = merged(*names)
    validate(copy.deepcopy(cfg), str(REPO / "schemas/config.schema.yaml"))
    assert cfg["run"]


def test_overlays_set_what_their_records_say():
    b = merged("h200_8k.yaml", "c16_64.yaml")["benchmark"]
    assert (b["concurrency"], b["num_prompts"], b["ks"]) == (16, 64, [1, 2, 3, 5])
    assert merged("h200_8k.yaml", "c16.yaml")["benchmark"]["num_prompts"] == 16
    assert merged("h200_8k.yaml", "ks25.yaml")["benchmark"]["ks"] == [2, 5]
    b = merged("h200_8k.yaml", "kschedule.yaml")["benchmark"]
    assert (b["k_schedule_concurrencies"], b["num_prompts"], b["ks"]) == ([1, 4, 16], 64, [1, 2, 3, 5])
    with pytest.raises(Exception, match="concurrenc"):
        bad = merged("h200_8k.yaml")
        bad["benchmark"]["concurrencyy"] = 16
        validate(bad, str(REPO / "schemas/config.schema.yaml"))


def test_gpu_records_keep_ttt_steps_3():
    """The GPU records and sweeps were made with 3 TTT steps, config.yaml's default then; the CPU default is
    1 since (served at k = 1: benchmarks/cpu_default_ttt_steps.json), so each pins 3 and a rerun trains the
    recorded head, while the CPU default itself trains 1."""
    assert merged_config(REPO / "config.yaml", {})["train"]["ttt_steps"] == 1
    assert merged("h200_8k.yaml")["train"]["ttt_steps"] == 3
    assert merged("h200_online.yaml")["train"]["ttt_steps"] == 3
    assert merged("h200_8k.yaml", "row_vocab32k.yaml")["train"]["ttt_steps"] == 3
    for sweep in ("base_4k.yaml", "full_16k.yaml"):
        assert merged_config(REPO / "benchmarks/sweep" / sweep, {})["train"]["ttt_steps"] == 3


def test_best_recipe_example_is_the_recorded_overlays():
    """examples/configs/smollm2-8k-gpu.yaml is what h200_8k.yaml + row_vocab32k.yaml + row_ttt5.yaml +
    row_epochs4.yaml (+ resumable.yaml, which does not change the head) built on the H200 and tau_guard.py
    served (h200_8k_vocab32k_ttt5_epochs4_tau_guard.json): every key that shapes the head, and the
    benchmark's settings; its tau reference is that run's."""
    example = merged_config(REPO / "examples/configs/smollm2-8k-gpu.yaml", {})
    record = merged("h200_8k.yaml", "row_vocab32k.yaml", "row_ttt5.yaml", "row_epochs4.yaml", "resumable.yaml")
    validate(copy.deepcopy(example), str(REPO / "schemas/config.schema.yaml"))
    for key in ("target", "data", "capture", "vocab", "train", "export"):
        assert example[key] == record[key], key
    t = example["train"]
    assert (example["vocab"]["draft_vocab_size"], t["ttt_steps"], t["ttt_step_loss_decay"], t["epochs"]) == (
        32000, 5, 0.8, 4)
    served = merged("h200_8k.yaml", "ks3.yaml")["benchmark"]
    assert example["benchmark"] == served
    assert {r: example["resources"][r]["gpu"] for r in ("capture", "train", "serve")} == {
        "capture": 1, "train": 1, "serve": 1}
    guard = json.loads((GPU / "h200_8k_vocab32k_ttt5_epochs4_tau_guard.json").read_text())
    reference = json.loads((GPU / "h200_8k_vocab32k_ttt5_epochs4_tau_reference.json").read_text())
    assert (guard["run"]["k"], guard["run"]["num_prompts"], guard["run"]["max_tokens"]) == (
        served["ks"][0], served["num_prompts"], served["max_tokens"])
    assert reference["tau"] == {s: round(v, 4) for s, v in guard["run"]["tau"].items()}
    assert min(reference["tau"].values()) >= 2.6  # issue 23's goal, on both sets
