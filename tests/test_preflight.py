"""The pre-flight speed-up bound: its table, the benchmark's check against it, the draft-cost stand-in, the plan
(which configs run it), and the engine measurement on vLLM's CPU backend."""
from __future__ import annotations

import pytest
from smk import planned_jobs, write_config

from eagle3build import step_costs
from eagle3build.compat import compat_render, preflight_bound

MEASURED = {"by_concurrency": {
    # a dense target: verifying more tokens costs almost nothing
    "1": {"decode_step_s": 0.002, "forward_s": {"1": 0.003, "2": 0.003, "3": 0.0031, "4": 0.0031}},
    # an MoE target at 16 in flight: each verified token adds experts
    "16": {"decode_step_s": 0.004, "forward_s": {"1": 0.005, "2": 0.007, "3": 0.009, "4": 0.011}},
}}


def test_verify_slope_is_the_median_pairwise_slope_beyond_one_token():
    # n = 1 (the decode path) is left out; one noisy shape (n = 6) does not set the slope
    fwd = {"1": 0.0029, "2": 0.0067, "3": 0.0062, "4": 0.0064, "5": 0.0071, "6": 0.0114}
    assert step_costs.verify_slope(fwd) == pytest.approx(0.000575, abs=1e-9)
    assert step_costs.verify_slope({"1": 0.001, "2": 0.003}) == pytest.approx(0.002)  # two shapes: their difference
    with pytest.raises(ValueError, match="two shapes"):
        step_costs.verify_slope({"1": 0.001})


def test_bound_table_arithmetic():
    rows = step_costs.bound_table(MEASURED, {"1": 0.0005, "16": 0.001}, [1, 3])
    by = {(r["concurrency"], r["k"]): r for r in rows}
    assert sorted(by) == [(1, 1), (1, 3), (16, 1), (16, 3)]
    r = by[(1, 3)]  # slope 0.05 ms (median of 0.1, 0.05, 0); verify = 2 + 3 x 0.05; step = 2.15 + 3 x 0.5 = 3.65 ms
    assert r["verify_ms_per_token"] == pytest.approx(0.05) and r["verify_step_ms"] == pytest.approx(2.15)
    assert r["step_ms"] == pytest.approx(3.65) and r["step_cost_ratio"] == pytest.approx(1.825)
    assert r["target_verify_ratio"] == pytest.approx(1.075)
    assert r["tau_break_even"] == pytest.approx(1.825) and r["tau_for_1_5x"] == pytest.approx(2.7375, abs=1e-3)
    assert r["speedup_1_5x_reachable"] and r["max_speedup_at_tau_k_plus_1"] == pytest.approx(4 / 1.825, abs=1e-3)
    r = by[(16, 3)]  # slope 2 ms: verify = 4 + 6 = 10 ms; step = 13 ms = 3.25 decode steps: 1.5x needs tau 4.875 > 4
    assert r["target_verify_ratio"] == pytest.approx(2.5) and r["step_cost_ratio"] == pytest.approx(3.25)
    assert r["break_even_reachable"] and not r["speedup_1_5x_reachable"]


def _benchmark(concurrency, tpot_base, runs):
    return {"settings": {"concurrency": concurrency, "sets": {"chat": {"num_prompts": 8}}},
            "baseline": {"time_per_output_token_s": {"mean": tpot_base}},
            "eagle3": [{"num_speculative_tokens": k, "mean_acceptance_length": tau,
                        "time_per_output_token_s": {"mean": tpot}} for k, tau, tpot in runs]}


def test_compare_benchmark_against_the_table():
    pre = {"table": step_costs.bound_table(MEASURED, {"1": 0.0005, "16": 0.001}, [1, 3])}
    # k = 3 at tau 2: measured step = 2 x 1.9 ms = 3.8 ms over a 2 ms baseline step = 1.9 (table: 1.825, +4.1 %)
    # k = 1 at tau 1.5: 1.5 x 2.4 = 3.6 ms = 1.8 steps (table: (2 + 0.05 + 0.5) / 2 = 1.275: +41 %)
    res = step_costs.compare_benchmark(_benchmark(1, 0.002, [(3, 2.0, 0.0019), (1, 1.5, 0.0024)]), pre)
    assert res["concurrency_used"] == 1 and res["tolerance"] == 0.15
    k3, k1 = res["rows"]
    assert k3["measured_step_cost_ratio"] == pytest.approx(1.9) and k3["predicted_step_cost_ratio"] == pytest.approx(1.825)
    assert k3["relative_error"] == pytest.approx(0.075 / 1.825, abs=1e-4) and k3["within_tolerance"] is True
    assert k1["predicted_step_cost_ratio"] == pytest.approx(1.275) and k1["within_tolerance"] is False
    # concurrency 0 = all 8 prompts at once: the nearest table is c = 1 (|8 - 1| < |8 - 16|); a k without a row
    res = step_costs.compare_benchmark(_benchmark(0, 0.002, [(2, 2.0, 0.002)]), pre)
    assert res["concurrency_used"] == 1 and res["rows"][0]["predicted_step_cost_ratio"] is None
    assert res["rows"][0]["within_tolerance"] is None
    assert step_costs.compare_benchmark(_benchmark(12, 0.002, []), pre)["concurrency_used"] == 16


def test_draft_stand_in_runs_for_grouped_and_full_attention():
    small = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32, intermediate_size=128)
    wide = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=4, head_dim=64, intermediate_size=512)
    t_small = preflight_bound.draft_step_seconds(small, 512, batch=2, context_tokens=64, device="cpu", dtype="float32")
    t_wide = preflight_bound.draft_step_seconds(wide, 4096, batch=2, context_tokens=64, device="cpu", dtype="float32")
    assert t_small > 0 and t_wide > 0  # seconds (no comparison: timings on a shared CPU are no test)


def test_head_layer_shapes_of_the_kimi_shape():
    """The draft layer speculators builds for a DeepSeek-V3 text model under the K2.5 wrapper (config only)."""
    from pathlib import Path

    kimi = Path(__file__).resolve().parents[1] / "examples/targets/kimi-k2.5-shape"
    shapes = preflight_bound.head_layer_shapes(str(kimi))
    assert shapes == {"hidden_size": 7168, "num_attention_heads": 64, "num_key_value_heads": 64, "head_dim": 64,
                      "intermediate_size": 18432}


def test_compat_md_renders_the_table():
    pre = {"settings": {"dtype": "bfloat16", "tensor_parallel_size": 1, "context_tokens": 256},
           "hardware": {"processor": "x86_64", "gpus": ["NVIDIA H200"]},
           "draft_estimate": {"method": "pytorch eager stand-in"},
           "table": step_costs.bound_table(MEASURED, {"1": 0.0005, "16": 0.001}, [3])}
    md = "\n".join(compat_render.render_preflight(pre))
    assert "NVIDIA H200" in md
    assert "| 1 | 3 | 2.000 | 1.07 | 0.500 | 1.82 | 1.82 | 2.74 |" in md
    assert "| 16 | 3 | 4.000 | 2.50 | 1.000 | 3.25 | 3.25 | 4.88 (unreachable) |" in md


def test_plan_runs_it_only_where_serving_has_gpus(tmp_path):
    assert "preflight_bound" not in planned_jobs([], tmp_path)  # the CPU default: auto, no serve GPUs
    gpu = write_config(tmp_path / "gpu.yaml", resources={"serve": {"gpu": 1, "threads": 2, "mem_mb": 8000,
                                                                   "runtime": 60}})
    jobs = planned_jobs(["--configfile", str(gpu)], tmp_path)
    assert jobs["preflight_bound"] == 1 and jobs["benchmark"] == 1
    never = write_config(tmp_path / "never.yaml", preflight={"enabled": "never"},
                         resources={"serve": {"gpu": 1, "threads": 2, "mem_mb": 8000, "runtime": 60}})
    assert "preflight_bound" not in planned_jobs(["--configfile", str(never)], tmp_path)
    always = write_config(tmp_path / "always.yaml", preflight={"enabled": "always"})
    assert planned_jobs(["results/default/preflight.json", "--configfile", str(always)], tmp_path) == {
        "materialize_target": 1, "compat_report": 1, "preflight_bound": 1}
