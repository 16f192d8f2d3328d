"""benchmark.json arithmetic and its plot, without vLLM."""
from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import pytest

from eagle3build import benchmark, plot_benchmark, vllm_engine


def _out(queued, first, last, n):
    return SimpleNamespace(metrics=SimpleNamespace(queued_ts=queued, first_token_ts=first, last_token_ts=last),
                           outputs=[SimpleNamespace(token_ids=list(range(n)))])


def test_request_timings():
    # three requests, one after another: latency 1, 2, 4 s; first token after 0.1 s; 11 tokens each
    outs = [_out(0.0, 0.1, 1.0, 11), _out(1.0, 1.1, 3.0, 11), _out(3.0, 3.1, 7.0, 11)]
    t = vllm_engine.request_timings(outs)
    assert t["request_latency_s"] == {"p50": 2.0, "p95": pytest.approx(3.8), "mean": pytest.approx(7 / 3, abs=1e-5)}
    assert t["time_to_first_token_s"]["p50"] == pytest.approx(0.1)
    # TPOT = (last - first) / (n - 1): 0.09, 0.19, 0.39
    assert t["time_per_output_token_s"]["p50"] == pytest.approx(0.19)
    assert t["time_per_output_token_s"]["p95"] == pytest.approx(0.19 + 0.9 * 0.2)


def test_request_timings_need_metrics():
    with pytest.raises(RuntimeError, match="disable_log_stats"):
        vllm_engine.request_timings([SimpleNamespace(metrics=None, outputs=[])])


def _result(speedups=(0.8, 1.3), taus=(1.5, 2.2)):
    stats = {"p50": 0.5, "p95": 0.7, "mean": 0.55}
    run = {"engine_start_s": 3.0, "wall_s": 2.0, "output_tokens": 100, "output_tokens_per_s": 50.0,
           "request_latency_s": stats, "time_to_first_token_s": stats, "time_per_output_token_s": stats, "texts": ["a"]}
    eagle = [dict(run, num_speculative_tokens=k, drafts=40, draft_tokens=40 * k, accepted_tokens=int(40 * (tau - 1)),
                  mean_acceptance_length=tau, acceptance_rate=(tau - 1) / k, acceptance_rate_per_position=[0.6, 0.3, 0.1][:k],
                  speedup=s, prompts_differing_from_baseline=0, outputs_identical=True)
             for k, s, tau in zip((1, 3), speedups, taus)]
    return {"versions": {"python": "3.11", "torch": "2.13.0", "transformers": "5.19.0", "speculators": "0.9.0"},
            "hardware": {"platform": "x", "processor": "x86_64", "cpu_count": 2},
            "settings": {"num_prompts": 1, "max_tokens": 8, "dtype": "float32", "temperature": 0.0, "ks": [1, 3],
                         "concurrency": 1, "served_name": "m"},
            "baseline": run, "eagle3": eagle}


def test_schema_accepts_a_result_and_names_a_missing_field():
    r = _result()
    benchmark.validate(r)
    del r["eagle3"][1]["prompts_differing_from_baseline"]
    with pytest.raises(jsonschema.ValidationError, match="prompts_differing_from_baseline"):
        benchmark.validate(r)


def test_plot(tmp_path):
    import matplotlib.image

    (tmp_path / "b.json").write_text(json.dumps(_result()))
    got = plot_benchmark.plot(tmp_path / "b.json", tmp_path / "b.png")
    assert got == {1: {"tau": 1.5, "speedup": 0.8}, 3: {"tau": 2.2, "speedup": 1.3}}
    img = matplotlib.image.imread(str(tmp_path / "b.png"))
    assert img.shape[:2] == (320, 800) and img[..., :3].std() > 0.05
