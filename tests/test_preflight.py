"""The pre-flight speed-up bound: its table, the benchmark's check against it, the untrained head it serves, the
plan (which configs run it), and the engine measurements on vLLM's CPU backend."""
from __future__ import annotations

import json

import pytest
from smk import planned_jobs, write_config

from eagle3build.compat import compat_render, preflight_bound
from eagle3build.draft import step_costs
from eagle3build.draft.choice import resolve
from eagle3build.workflow import job

MEASURED = {"by_concurrency": {
    # a dense target: verifying more tokens costs almost nothing
    "1": {"decode_step_s": 0.002, "forward_s": {"1": 0.003, "2": 0.003, "3": 0.0031, "4": 0.0031}},
    # an MoE target at 16 in flight: each verified token adds experts
    "16": {"decode_step_s": 0.004, "forward_s": {"1": 0.005, "2": 0.007, "3": 0.009, "4": 0.011}},
}}
# the whole step at k = 3, measured with an untrained head: 0.5 ms (c = 1) and 1 ms (c = 16) per drafted token over
# the target's verification (2.15 ms and 10 ms, from the slopes above)
STEPS = {"3": {"1": 0.00365, "16": 0.013}}


def test_verify_slope_is_the_median_pairwise_slope_beyond_one_token():
    # n = 1 (the decode path) is left out; one noisy shape (n = 6) does not set the slope
    fwd = {"1": 0.0029, "2": 0.0067, "3": 0.0062, "4": 0.0064, "5": 0.0071, "6": 0.0114}
    assert step_costs.verify_slope(fwd) == pytest.approx(0.000575, abs=1e-9)
    assert step_costs.verify_slope({"1": 0.001, "2": 0.003}) == pytest.approx(0.002)  # two shapes: their difference
    with pytest.raises(ValueError, match="two shapes"):
        step_costs.verify_slope({"1": 0.001})


def test_bound_table_arithmetic():
    rows = step_costs.bound_table(MEASURED, STEPS, [1, 3])
    by = {(r["concurrency"], r["k"]): r for r in rows}
    assert sorted(by) == [(1, 1), (1, 3), (16, 1), (16, 3)]
    r = by[(1, 3)]  # slope 0.05 ms (median of 0.1, 0.05, 0); verify = 2 + 3 x 0.05; step measured: 3.65 ms
    assert r["verify_ms_per_token"] == pytest.approx(0.05) and r["verify_step_ms"] == pytest.approx(2.15)
    assert r["step_ms"] == pytest.approx(3.65) and r["step_cost_ratio"] == pytest.approx(1.825)
    assert r["step_source"] == "measured" and r["draft_ms_per_token"] == pytest.approx(0.5)
    assert r["target_verify_ratio"] == pytest.approx(1.075)
    assert r["tau_break_even"] == pytest.approx(1.825) and r["tau_for_1_5x"] == pytest.approx(2.7375, abs=1e-3)
    assert r["speedup_1_5x_reachable"] and r["max_speedup_at_tau_k_plus_1"] == pytest.approx(4 / 1.825, abs=1e-3)
    r = by[(16, 3)]  # slope 2 ms: verify = 4 + 6 = 10 ms; step = 13 ms = 3.25 decode steps: 1.5x needs tau 4.875 > 4
    assert r["target_verify_ratio"] == pytest.approx(2.5) and r["step_cost_ratio"] == pytest.approx(3.25)
    assert r["break_even_reachable"] and not r["speedup_1_5x_reachable"]
    r = by[(16, 1)]  # not measured: verify 4 + 2 = 6 ms plus one draft of 1 ms = 7 ms
    assert r["step_source"] == "estimated" and r["step_ms"] == pytest.approx(7.0)
    # a draft share below 0 (noise in the verify slope) counts as 0
    low = step_costs.bound_table(MEASURED, {"3": {"1": 0.002, "16": 0.013}}, [1])
    assert low[0]["draft_ms_per_token"] == 0 and low[0]["step_ms"] == pytest.approx(2.05)
    with pytest.raises(ValueError, match="concurrency 16"):
        step_costs.bound_table(MEASURED, {"3": {"1": 0.002}}, [1])


def _benchmark(concurrency, tpot_base, runs, num_prompts=8):
    return {"settings": {"concurrency": concurrency, "sets": {"chat": {"num_prompts": num_prompts}}},
            "baseline": {"time_per_output_token_s": {"mean": tpot_base}},
            "eagle3": [{"num_speculative_tokens": k, "mean_acceptance_length": tau,
                        "time_per_output_token_s": {"mean": tpot}} for k, tau, tpot in runs]}


def test_compare_benchmark_against_the_table():
    pre = {"table": step_costs.bound_table(MEASURED, STEPS, [1, 3])}
    # k = 3 at tau 2: measured step = 2 x 1.9 ms = 3.8 ms over a 2 ms baseline step = 1.9 (table: 1.825, +4.1 %)
    # k = 1 at tau 1.5: 1.5 x 2.4 = 3.6 ms = 1.8 steps (table: (2 + 0.05 + 0.5) / 2 = 1.275: +41 %)
    res = step_costs.compare_benchmark(_benchmark(1, 0.002, [(3, 2.0, 0.0019), (1, 1.5, 0.0024)]), pre)
    assert res["concurrency_used"] == 1 and res["tolerance"] == 0.15
    k3, k1 = res["rows"]
    assert k3["measured_step_cost_ratio"] == pytest.approx(1.9) and k3["predicted_step_cost_ratio"] == pytest.approx(1.825)
    assert k3["relative_error"] == pytest.approx(0.075 / 1.825, abs=1e-4) and k3["within_tolerance"] is True
    # the ratio's two sides on their own: step 3.8 ms against the table's 3.65 ms (+4.1 %), decode 2 ms against 2 ms
    assert k3["predicted_step_ms"] == pytest.approx(3.65) and k3["predicted_decode_step_ms"] == pytest.approx(2.0)
    assert k3["step_relative_error"] == pytest.approx(3.8 / 3.65 - 1, abs=1e-4)
    assert k3["decode_relative_error"] == 0
    # a baseline 20 % faster than the pre-flight's decode step moves the ratio by +25 % with the same step
    fast = step_costs.compare_benchmark(_benchmark(1, 0.0016, [(3, 2.0, 0.0019)]), pre)["rows"][0]
    assert fast["decode_relative_error"] == pytest.approx(-0.2)
    assert fast["step_relative_error"] == k3["step_relative_error"] and fast["within_tolerance"] is False
    assert fast["relative_error"] == pytest.approx(3.8 / 1.6 / 1.825 - 1, abs=1e-4)
    assert 1 + fast["relative_error"] == pytest.approx((1 + fast["step_relative_error"]) / 0.8, abs=1e-3)
    assert k1["predicted_step_cost_ratio"] == pytest.approx(1.275) and k1["within_tolerance"] is False
    # what drafting costs a step: the measured step less the target's verification, this baseline's step + k x the
    # table's slope (0.05 ms a token) (k = 3: 3.8 - (2 + 0.15) = 1.65 ms, 0.55 a draft; k = 1: 3.6 - 2.05 = 1.55 ms)
    assert [(d["head"], d["k"], d["step_ms"], d["verify_step_ms"], d["draft_ms_per_step"],
             d["draft_ms_per_drafted_token"]) for d in res["draft_cost"]] == \
        [("head", 3, 3.8, 2.15, 1.65, 0.55), ("head", 1, 3.6, 2.05, 1.55, 1.55)]
    # the pre-flight's decode step does not enter: over a baseline 0.4 ms faster the verification is 0.4 ms less
    assert fast["measured_baseline_step_ms"] == 1.6
    fast_cost = step_costs.compare_benchmark(_benchmark(1, 0.0016, [(3, 2.0, 0.0019)]), pre)["draft_cost"][0]
    assert (fast_cost["verify_step_ms"], fast_cost["draft_ms_per_step"]) == (1.75, 2.05)
    # concurrency 0 = all 8 prompts at once: the nearest table is c = 1 (|8 - 1| < |8 - 16|); a k without a row
    res = step_costs.compare_benchmark(_benchmark(0, 0.002, [(2, 2.0, 0.002), (3, None, 0.002)]), pre)
    assert res["concurrency_used"] == 1 and res["rows"][0]["predicted_step_cost_ratio"] is None
    # a k the table lacks: its step, no verification or draft cost; a run that drafted nothing (tau None): no step
    assert [(d["k"], d["step_ms"], d["verify_step_ms"], d["draft_ms_per_step"]) for d in res["draft_cost"]] == \
        [(2, 4.0, None, None), (3, None, 2.15, None)]
    assert res["rows"][0]["within_tolerance"] is None and res["rows"][0]["step_relative_error"] is None
    # the decode step does not depend on k: compared even where the table lacks the k
    assert res["rows"][0]["predicted_decode_step_ms"] == 2.0 and res["rows"][0]["decode_relative_error"] == 0
    assert step_costs.compare_benchmark(_benchmark(12, 0.002, [], num_prompts=16), pre)["concurrency_used"] == 16
    # 12 asked of a set of 8 prompts puts 8 in flight, nearer c = 1 than 16
    assert step_costs.compare_benchmark(_benchmark(12, 0.002, []), pre)["concurrency_used"] == 1


def test_untrained_head_has_the_exported_format(tmp_path, tiny_target):
    """The head the pre-flight bound serves: the exported head's config and tensors (shapes of
    head_format.expected_shapes, in the engine's dtype), a draft vocab of the target's first ids, and
    speculators loads it."""
    from safetensors.torch import load_file

    from eagle3build.draft.head_format import expected_shapes
    from eagle3build.draft.head_model import write_untrained_head
    from eagle3build.serve.export_head import check_loads_with_speculators

    head = write_untrained_head(str(tiny_target), tmp_path / "head", aux_layer_ids=[1, 3, 4], draft_vocab_size=1024,
                                head_variant="eagle3", served_name="org/tiny", dtype="bfloat16",
                                trust_remote_code=False, seed=0)
    out = head.path
    cfg = json.loads((out / "config.json").read_text())
    assert cfg == head.config and (head.method.name, head.layer.name, head.kv_layers) == ("eagle3", "llama", 1)
    state = load_file(str(out / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in state.items()} == expected_shapes(cfg)
    assert state["fc.weight"].shape == (64, 192) and state["lm_head.weight"].shape == (1024, 64)
    assert state["fc.weight"].dtype.is_floating_point and str(state["fc.weight"].dtype) == "torch.bfloat16"
    assert state["d2t"].eq(0).all() and int(state["t2d"].sum()) == 1024 and bool(state["t2d"][:1024].all())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "org/tiny" and cfg["dtype"] == "bfloat16"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4] and cfg["norm_before_fc"] is False
    check_loads_with_speculators(head, str(tiny_target), state)
    with pytest.raises(ValueError, match="draft vocab size 50000"):
        write_untrained_head(str(tiny_target), tmp_path / "h2", aux_layer_ids=[1], draft_vocab_size=50000,
                             head_variant="eagle3", served_name="t", dtype="float32", trust_remote_code=False, seed=0)


def test_compat_md_renders_the_table():
    pre = {"settings": {"dtype": "bfloat16", "tensor_parallel_size": 1, "context_tokens": 256, "measured_ks": [3]},
           "hardware": {"processor": "x86_64", "gpus": ["NVIDIA H200"]},
           "table": step_costs.bound_table(MEASURED, STEPS, [1, 3])}
    md = "\n".join(compat_render.render_preflight(pre))
    assert "NVIDIA H200" in md and "k = 3" in md
    assert "| 1 | 3 | 2.000 | 1.07 | 0.500 | 1.82 measured | 1.82 | 2.74 |" in md
    assert "| 16 | 1 | 4.000 | 1.50 | 1.000 | 1.75 estimated | 1.75 | 2.62 (unreachable) |" in md
    assert "| 16 | 3 | 4.000 | 2.50 | 1.000 | 3.25 measured | 3.25 | 4.88 (unreachable) |" in md


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


def test_preflight_times_the_benchmarks_length(tmp_path, monkeypatch):
    """The job times decode and speculative steps over benchmark.max_tokens output tokens (time per output token
    falls with length: the H200 A/B in benchmarks/records/decode-step-ab_h200.json); fewer than 2 is refused
    before any engine starts. Its settings are one PreflightSettings, its draft the one planning resolved."""
    seen = []
    monkeypatch.setattr(preflight_bound, "preflight", lambda s: seen.append(s) or {})
    settings = {"preflight.max_k": "auto", "benchmark.ks": [3], "preflight.concurrencies": [1, 16],
                "vocab.draft_vocab_size": 32, "target.served_name": "t", "target.serve_dtype": "auto",
                "preflight.context_tokens": 256, "preflight.repeats": 5, "target.trust_remote_code": False,
                "target.pipeline_parallel_size": 1, "benchmark.max_tokens": 96, "draft.layer": "mla"}
    params = {"target_dir": "t", "draft": {"method": "eagle3", "layer": "mla"}}
    job.run_stage("preflight_bound", inputs={"decisions": "d.json"}, outputs={"json": "p.json"}, settings=settings,
                  params=params, resources={"gpu": 1})
    (s,) = seen
    assert (s.decode_tokens, s.gpus, s.concurrencies, s.max_k, s.out_json) == (96, 1, [1, 16], "auto", "p.json")
    assert s.draft == resolve({"layer": "mla"}) and [d.layer.name for d in s.draft.bound_drafts()] == ["mla", "llama"]
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"decode_tokens \(benchmark.max_tokens\) 1 must be at least 2"):
        preflight_bound.preflight(preflight_bound.PreflightSettings(
            "t", str(tmp_path / "p.json"), "d.json", max_k=3, benchmark_ks=[3], concurrencies=[1],
            draft_vocab_size=32, served_name="t", decode_tokens=1))
    assert not (tmp_path / "p.json").exists()
