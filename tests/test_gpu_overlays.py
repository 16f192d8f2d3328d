"""The overlays beside benchmarks/gpu/record.py: each is used by one of its records, and each record's config files,
merged as the workflow merges them, validate against the config schema, so that a lent device's minutes are not spent
on a typo'd key (the schema refuses unknown keys)."""
from __future__ import annotations

import sys

import pytest
from benchlab.benchkit import load_config
from smk import REPO

sys.path.insert(0, str(REPO / "benchmarks/gpu"))
import record  # noqa: E402  (the GPU record driver: its RECORDS table)

GPU = REPO / "benchmarks/gpu"


@pytest.mark.parametrize("name", sorted(record.RECORDS))
def test_record_configs_validate(name):
    cfg = load_config([REPO / f for f in record.RECORDS[name].configfiles])
    assert cfg["run"] == record.run_name(record.RECORDS[name].configfiles)


def test_every_overlay_is_a_records():
    used = {f for r in record.RECORDS.values() for f in r.configfiles} | set(record.PREPARE_OVERLAYS)
    # every YAML file there is a config overlay but the card-time table (card_time.py)
    overlays = {f"benchmarks/gpu/{p.name}" for p in GPU.glob("*.yaml") if p.name != "card_seconds.yaml"}
    assert overlays <= used, f"overlays no record uses: {sorted(overlays - used)}"
    assert all((REPO / f).exists() for f in used)


def test_overlays_set_what_their_records_say():
    recipe = "examples/configs/smollm2-8k-gpu.yaml"
    # int4-ab: its prepare step's bf16 side and its own INT4 side, both the recipe at 2 epochs, the bf16 head compared
    a = load_config([recipe, record.INT4_BF16, record.NO_PREFLIGHT])
    b = load_config([REPO / f for f in record.RECORDS["int4-ab"].configfiles])
    assert (a["run"], a["train"]["epochs"], b["train"]["epochs"]) == ("smollm2-8k-e2", 2, 2)
    assert b["target"]["path"] == record.INT4_TARGET
    assert b["benchmark"]["compare_heads"] == [{"name": "bf16-trained", "path": f"results/{a['run']}/head"}]
    b = load_config([recipe, "benchmarks/gpu/c16_64.yaml"])["benchmark"]
    assert (b["concurrency"], b["num_prompts"]) == (16, 64)
    assert load_config([recipe, "benchmarks/gpu/ks5.yaml"])["benchmark"]["ks"] == [5]
    b = load_config([recipe, "benchmarks/gpu/kschedule.yaml"])["benchmark"]
    assert (b["k_schedule_concurrencies"], b["ks"], b["num_prompts"]) == ([1, 4, 16, 64], [3], 32)  # 64 prompts
    with pytest.raises(ValueError, match="concurrencyy"):
        load_config([recipe], {"benchmark": {"concurrencyy": 16}})


def test_the_recipe_is_the_recorded_head():
    """examples/configs/smollm2-8k-gpu.yaml is the head of records recipe_h200 and recipe_h100: the keys that shape
    it (32,000-token draft vocab, 5 TTT steps with decay 0.8, 4 epochs, the fused loss on CUDA) and the benchmark
    served (k = 3, 16 prompts a set, 256 tokens, one request in flight), on one GPU per stage. The GPU records pin 3+
    TTT steps, while the CPU default trains 1 (served at k = 1)."""
    example = load_config(["examples/configs/smollm2-8k-gpu.yaml"])
    t = example["train"]
    assert (example["vocab"]["draft_vocab_size"], t["ttt_steps"], t["ttt_step_loss_decay"], t["epochs"]) == (
        32000, 5, 0.8, 4)
    # the fused Triton KL on the card, eager on a CPU rehearsal; the step compiled as train.compile's auto says
    assert (t["loss_implementation"], t["compile"], t["compile_breaks"]) == ("auto", "auto", "auto")
    b = example["benchmark"]
    assert (b["ks"], b["num_prompts"], b["max_tokens"], b["concurrency"]) == ([3], 16, 256, 1)
    assert {r: example["resources"][r]["gpu"] for r in ("capture", "train", "serve")} == {
        "capture": 1, "train": 1, "serve": 1}
    assert load_config([])["train"]["ttt_steps"] == 1
    for name in ("dense", "kimi"):
        assert load_config([REPO / f for f in record.RECORDS[name].configfiles])["train"]["ttt_steps"] == 3
    for sweep in ("base_4k.yaml", "full_16k.yaml"):
        assert load_config([REPO / "benchmarks/sweep" / sweep])["train"]["ttt_steps"] == 3


def test_a_preflight_record_plans_no_benchmark():
    """kimi-mla-preflight builds the pre-flight alone (its figures come from preflight.json); recipe builds the
    benchmark."""
    assert record.plan_targets(record.RECORDS["kimi-mla-preflight"]) == ["results/kimi-k25-card/preflight.json"]
    assert record.plan_targets(record.RECORDS["recipe"]) == ["results/smollm2-8k/benchmark.json"]
