"""benchmark.json arithmetic and its plot, without vLLM."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import fake_engines

from eagle3build import prompt_sets
from eagle3build.draft.head_format import Head
from eagle3build.formats.artifacts import ArtifactError
from eagle3build.serve import benchmark, k_schedule, lossless, plot_benchmark
from eagle3build.serve.benchmark import BenchmarkSettings
from eagle3build.vllm import engine_process, measure


def _head(tmp_path, draft_ids):
    """A head directory whose model.safetensors holds only ``d2t`` (int64 [D]) for the sorted target ids ``draft_ids``,
    and a config.json of an EAGLE-3 head's method and layer count."""
    import numpy as np
    from safetensors.numpy import save_file

    head = tmp_path / "head"
    head.mkdir(exist_ok=True)
    ids = np.array(sorted(draft_ids), dtype=np.int64)
    save_file({"d2t": ids - np.arange(len(ids))}, str(head / "model.safetensors"))
    # what the benchmark reads of config.json: the method (its speculative_config) and the layers (KV sizing)
    (head / "config.json").write_text('{"speculators_model_type": "eagle3", '
                                      '"transformer_layer_config": {"num_hidden_layers": 1, "model_type": "llama"}}')
    return str(head)


def test_draft_vocab_ids_and_coverage(tmp_path):
    """The draft vocab is arange(D) + d2t; coverage counts output tokens (not distinct ids) inside it; a head
    without its weights or without d2t is named."""
    draft = benchmark.draft_vocab_ids(_head(tmp_path, [0, 3, 4, 9]))
    assert draft == {0, 3, 4, 9}
    assert benchmark.draft_vocab_coverage([[3, 3, 5], [9, 1, 1, 0, 8]], draft) == 4 / 8
    assert benchmark.draft_vocab_coverage([[5]], draft) == 0.0 and benchmark.draft_vocab_coverage([[]], draft) is None
    with pytest.raises(FileNotFoundError, match=r"nohead/model.safetensors: the head's weights"):
        benchmark.draft_vocab_ids(tmp_path / "nohead")
    import numpy as np
    from safetensors.numpy import save_file

    (tmp_path / "bad").mkdir()
    save_file({"fc.weight": np.zeros((2, 2), np.float32)}, str(tmp_path / "bad/model.safetensors"))
    with pytest.raises(KeyError, match="no d2t tensor"):
        benchmark.draft_vocab_ids(tmp_path / "bad")


def _out(queued, first, last, n):
    return SimpleNamespace(metrics=SimpleNamespace(queued_ts=queued, first_token_ts=first, last_token_ts=last),
                           outputs=[SimpleNamespace(token_ids=list(range(n)))])


def test_request_timings():
    # three requests, one after another: latency 1, 2, 4 s; first token after 0.1 s; 11 tokens each
    outs = [_out(0.0, 0.1, 1.0, 11), _out(1.0, 1.1, 3.0, 11), _out(3.0, 3.1, 7.0, 11)]
    t = measure.request_timings(outs)
    assert t["request_latency_s"] == {"p50": 2.0, "p95": pytest.approx(3.8), "mean": pytest.approx(7 / 3, abs=1e-5)}
    assert t["time_to_first_token_s"]["p50"] == pytest.approx(0.1)
    # TPOT = (last - first) / (n - 1): 0.09, 0.19, 0.39
    assert t["time_per_output_token_s"]["p50"] == pytest.approx(0.19)
    assert t["time_per_output_token_s"]["p95"] == pytest.approx(0.19 + 0.9 * 0.2)


def test_request_timings_need_metrics():
    with pytest.raises(RuntimeError, match="disable_log_stats"):
        measure.request_timings([SimpleNamespace(metrics=None, outputs=[])])


STATS = {"p50": 0.5, "p95": 0.7, "mean": 0.55}


def _figures(tokens=100, tps=50.0):
    return {"wall_s": tokens / tps, "output_tokens": tokens, "output_tokens_per_s": tps, "request_latency_s": STATS,
            "time_to_first_token_s": STATS, "time_per_output_token_s": STATS, "texts": ["a"]}


def _spec(k, tau, speedup):
    return dict(drafts=40, draft_tokens=40 * k, accepted_tokens=int(40 * (tau - 1)), mean_acceptance_length=tau,
                acceptance_rate=(tau - 1) / k, acceptance_rate_per_position=[0.6, 0.3, 0.1][:k], speedup=speedup,
                prompts_differing_from_baseline=0, outputs_identical=True, near_ties=0, divergences=0, lossless=True,
                differences=[])


def _result(speedups=(0.8, 1.3), taus=(1.5, 2.2)):
    sets = ("chat", "humaneval")
    base = dict(_figures(), engine_start_s=3.0, sets={n: _figures(50) for n in sets})
    eagle = [dict(_figures(), engine_start_s=3.0, num_speculative_tokens=k, **_spec(k, tau, s),
                  sets={n: dict(_figures(50), **_spec(k, tau + 0.1 * j, s + 0.1 * j)) for j, n in enumerate(sets)})
             for k, s, tau in zip((1, 3), speedups, taus)]
    return {"versions": {"python": "3.11", "torch": "2.13.0", "transformers": "5.19.0", "speculators": "0.9.0"},
            "hardware": {"platform": "x", "processor": "x86_64", "cpu_count": 2},
            "settings": {"num_prompts": 1, "max_tokens": 8, "dtype": "float32", "temperature": 0.0, "ks": [1, 3],
                         "concurrency": 1, "served_name": "m",
                         "sets": {n: {"num_prompts": 1, "prompt_ids": [f"{n}-0"]} for n in sets}},
            "baseline": base, "heads": [{"name": "head", "method": "eagle3", "draft_layer": "llama",
                                         "trained_positions": None}],
            "runs": [dict(e, head="head", method="eagle3", draft_layer="llama", trained_positions=None) for e in eagle]}


def test_schema_accepts_a_result_and_names_a_missing_field():
    r = _result()
    benchmark.validate(r)
    del r["runs"][1]["prompts_differing_from_baseline"]
    with pytest.raises(ArtifactError, match="prompts_differing_from_baseline"):
        benchmark.validate(r)


@pytest.mark.parametrize("field", ["method", "draft_layer", "trained_positions", "head"])
def test_schema_requires_each_run_to_name_its_head(field):
    """From issue 55 every run names what it served; a result of before (runs under "eagle3", no head
    fields) still validates and reads (benchmark_runs.benchmark_runs)."""
    from eagle3build.formats.benchmark_runs import benchmark_runs

    r = _result()
    del r["runs"][0][field]
    with pytest.raises(ArtifactError, match=field):
        benchmark.validate(r)
    old = _result()
    old.pop("heads")
    old["eagle3"] = [{k: v for k, v in e.items() if k not in ("head", "method", "draft_layer", "trained_positions")}
                     for e in old.pop("runs")]
    benchmark.validate(old)
    assert benchmark_runs(old) == old["eagle3"] and benchmark_runs(_result()) == _result()["runs"]
    del old["eagle3"]
    with pytest.raises(ArtifactError):  # neither key: no run to read
        benchmark.validate(old)


def test_schema_requires_per_set_figures():
    r = _result()
    del r["runs"][0]["sets"]["humaneval"]["mean_acceptance_length"]
    with pytest.raises(ArtifactError, match="mean_acceptance_length"):
        benchmark.validate(r)
    r = _result()
    del r["baseline"]["sets"]
    with pytest.raises(ArtifactError, match="'sets' is a required property"):
        benchmark.validate(r)


def test_plot(tmp_path):
    import matplotlib.image

    (tmp_path / "b.json").write_text(json.dumps(_result()))
    got = plot_benchmark.plot(tmp_path / "b.json", tmp_path / "b.png")
    assert got[1]["tau"] == 1.5 and got[3]["speedup"] == 1.3
    assert got[3]["sets"] == {"chat": {"tau": 2.2, "speedup": 1.3},
                              "humaneval": {"tau": pytest.approx(2.3), "speedup": pytest.approx(1.4)}}
    img = matplotlib.image.imread(str(tmp_path / "b.png"))
    assert img.shape[:2] == (320, 800) and img[..., :3].std() > 0.05


def test_plot_names_each_heads_method_layer_k_and_trained_positions(tmp_path, monkeypatch):
    """Each bar and line of the plot names its head's method, draft layer, k and trained positions; a compared
    head's bars its name too; a benchmark.json of before issue 55 (runs under "eagle3", the same OUTPUT_VERSION 7) still plots."""
    import matplotlib.axes

    ticks, lines = [], []
    real_ticks, real_plot = matplotlib.axes.Axes.set_xticks, matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "set_xticks",
                        lambda self, t, labels=None, **kw: ticks.append(labels) or real_ticks(self, t, labels, **kw))
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda self, *a, **kw: lines.append(kw.get("label")) or real_plot(self, *a, **kw))
    r = _result()
    r["runs"][1].update(head="dflash", method="dflash", draft_layer="qwen3", trained_positions=7)
    (tmp_path / "b.json").write_text(json.dumps(r))
    got = plot_benchmark.plot(tmp_path / "b.json", tmp_path / "b.png")
    assert list(got) == [1, "dflash k=3"]
    assert ticks == [["eagle3\nllama layer\nk=1 (trained for any k)",
                      "dflash\ndflash\nqwen3 layer\nk=3 (trained for 7)"]]
    assert lines[0] == "eagle3, llama layer, k=1 (trained for any k) chat, τ=1.50"
    assert lines[-1].startswith("dflash: dflash, qwen3 layer, k=3 (trained for 7) humaneval")
    old = _result()
    old["eagle3"] = [{k: v for k, v in e.items() if k not in ("head", "method", "draft_layer", "trained_positions")}
                     for e in old.pop("runs")]
    old.pop("heads")
    (tmp_path / "old.json").write_text(json.dumps(old))
    ticks.clear()
    assert list(plot_benchmark.plot(tmp_path / "old.json", tmp_path / "old.png")) == [1, 3]
    assert ticks == [["k=1", "k=3"]]  # an old run names no method: none is guessed


# ---------------------------------------------------------------- one engine, counters split per set


class FakeLLM:
    """Stands in for vllm.LLM: each request emits 4 tokens; each request adds 2 drafts of which 3 draft
    tokens are accepted in total (positions 2, 1), so the counters move by known amounts per set."""

    def __init__(self):
        self.c = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0, 0]}
        self.t = 0.0
        self.resets = 0

    def reset_prefix_cache(self):
        self.resets += 1
        return True

    def chat(self, msgs, sp, use_tqdm=False):
        outs = []
        for m in msgs:
            n = 4 if "code" not in m[-1]["content"] else 6
            self.c["drafts"] += 2
            self.c["draft_tokens"] += 4
            self.c["accepted"] += 3 if n == 4 else 1
            self.c["per_pos"] = [self.c["per_pos"][0] + (2 if n == 4 else 1), self.c["per_pos"][1] + (1 if n == 4 else 0)]
            self.t += 1.0
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(range(n)), text="x" * n)],
                                        prompt_token_ids=[5, n],
                                        metrics=SimpleNamespace(queued_ts=self.t - 1, first_token_ts=self.t - 0.9,
                                                                last_token_ts=self.t)))
        return outs

    def get_metrics(self):
        c = self.c
        return [SimpleNamespace(name="vllm:spec_decode_num_drafts", value=c["drafts"]),
                SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=c["draft_tokens"]),
                SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=c["accepted"]),
                SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=list(c["per_pos"])),
                SimpleNamespace(name="vllm:num_requests_running", value=0)]


def test_decode_greedy_splits_counters_per_set(monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.setattr(measure, "start_engine", lambda engine, **kw: (FakeLLM(), 1.5))
    chat = [{"id": f"c{i}", "messages": [{"role": "user", "content": "hi"}]} for i in range(3)]
    code = [{"id": f"h{i}", "messages": [{"role": "user", "content": "code"}]} for i in range(2)]
    res = measure.decode_greedy({"engine": {}, "prompts": chat + code, "max_tokens": 8, "concurrency": 1,
                                     "speculative_config": {"method": "eagle3"},
                                     "sets": [{"name": "chat", "count": 3}, {"name": "humaneval", "count": 2}]})
    c, h = res["sets"]["chat"], res["sets"]["humaneval"]
    # the warm-up requests are excluded: 3 chat requests -> 6 drafts, 9 accepted
    assert (c["drafts"], c["draft_tokens"], c["accepted_tokens"], c["accepted_per_position"]) == (6, 12, 9, [6, 3])
    assert c["mean_acceptance_length"] == pytest.approx(1 + 9 / 6) and c["acceptance_rate_per_position"] == [1.0, 0.5]
    assert (h["drafts"], h["accepted_tokens"], h["accepted_per_position"]) == (4, 2, [2, 0])
    assert h["mean_acceptance_length"] == pytest.approx(1.5) and h["output_tokens"] == 12 and c["output_tokens"] == 12
    # overall = the sets together
    assert (res["drafts"], res["accepted_tokens"], res["accepted_per_position"]) == (10, 11, [8, 3])
    assert res["mean_acceptance_length"] == pytest.approx(2.1) and res["output_tokens"] == 24
    assert res["wall_s"] == pytest.approx(c["wall_s"] + h["wall_s"], abs=2e-3)
    assert len(res["token_ids"]) == 5 and res["engine_start_s"] == 1.5
    assert res["prompt_token_ids"] == [[5, 4]] * 3 + [[5, 6]] * 2  # what the near-tie check extends
    # without sets: the old single-group result, no "sets" key (export's load check)
    res1 = measure.decode_greedy({"engine": {}, "prompts": chat, "max_tokens": 8, "concurrency": 0,
                                      "speculative_config": {"method": "eagle3"}})
    assert "sets" not in res1 and res1["drafts"] == 6 and res1["accepted_per_position"] == [6, 3]


def test_decode_sweep_counts_each_concurrency_on_its_own(monkeypatch):
    """The same prompts at each concurrency, c at a time, after the warm-up: each concurrency's counters and
    tokens are its own (the FakeLLM's 2 drafts and 3 accepted per request)."""
    pytest.importorskip("vllm")
    llm = FakeLLM()
    calls = []
    chat = llm.chat

    def counting_chat(msgs, sp, use_tqdm=False):
        calls.append(len(msgs))
        return chat(msgs, sp, use_tqdm)

    llm.chat = counting_chat
    monkeypatch.setattr(measure, "start_engine", lambda engine, **kw: (llm, 2.0))
    prompts = [{"id": f"c{i}", "messages": [{"role": "user", "content": "hi"}]} for i in range(4)]
    res = measure.decode_sweep({"engine": {}, "prompts": prompts, "max_tokens": 8, "concurrencies": [1, 4],
                                    "speculative_config": {"method": "eagle3"}})
    # warm-up: the batch of 4 at full length, then every timed batch at 2 tokens (4 of one, one of 4), each
    # concurrency from an empty prefix cache; then the timed calls, each concurrency from an empty cache: 4 calls
    # of one, one call of 4
    assert calls == [4, 1, 1, 1, 1, 4] + [1, 1, 1, 1, 4] and llm.resets == 3 + 2
    assert sorted(res["by_concurrency"]) == ["1", "4"] and res["engine_start_s"] == 2.0
    for f in res["by_concurrency"].values():
        assert (f["drafts"], f["accepted_tokens"], f["output_tokens"]) == (8, 12, 16)
        assert f["mean_acceptance_length"] == pytest.approx(2.5) and "token_ids" not in f


def test_warm_up_covers_every_timed_batch_then_empties_the_prefix_cache():
    """The warm-up decodes the largest batch at full length, then each pass's batches at 2 output tokens from an
    empty prefix cache (each prefill as in its timed call: an MoE target's kernels compile per shape), then
    empties the cache so the timed prefills are computed; an engine that keeps its cache is refused."""
    pytest.importorskip("vllm")
    from vllm import SamplingParams

    llm, seen = FakeLLM(), []
    chat, reset = llm.chat, llm.reset_prefix_cache
    llm.chat = lambda msgs, sp, use_tqdm=False: seen.append((len(msgs), sp.max_tokens)) or chat(msgs, sp)
    llm.reset_prefix_cache = lambda: seen.append("reset") or reset()
    a, b, c = ([{"role": "user", "content": t}] for t in "abc")
    sp = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    measure.warm_up(llm, [[[a], [b, c]], [[a]]], sp)
    assert seen == [(2, 96), "reset", (1, 2), (2, 2), "reset", (1, 2), "reset"]
    assert sp.max_tokens == 96  # the timed params are left as they were
    llm.reset_prefix_cache = lambda: False
    with pytest.raises(RuntimeError, match="prefix cache"):
        measure.warm_up(llm, [[[a]]], SamplingParams(temperature=0.0, max_tokens=8))
    with pytest.raises(ValueError, match="no batch"):
        measure.warm_up(llm, [[]], sp)


def test_decode_greedy_times_each_set_in_its_own_batches(monkeypatch):
    """Sets of 3 and 4 prompts at 2 in flight: the warm-up and the timed calls use the same batches, none across
    two sets (3 = 2 + 1, 4 = 2 + 2)."""
    pytest.importorskip("vllm")
    llm, calls = FakeLLM(), []
    chat = llm.chat
    llm.chat = lambda msgs, sp, use_tqdm=False: calls.append(([m[-1]["content"] for m in msgs], sp.max_tokens)) \
        or chat(msgs, sp)
    monkeypatch.setattr(measure, "start_engine", lambda engine, **kw: (llm, 1.0))
    prompts = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"p{i}"}]} for i in range(7)]
    res = measure.decode_greedy({"engine": {}, "prompts": prompts, "max_tokens": 8, "concurrency": 2,
                                     "sets": [{"name": "chat", "count": 3}, {"name": "humaneval", "count": 4}]})
    batches = [["p0", "p1"], ["p2"], ["p3", "p4"], ["p5", "p6"]]
    assert calls == [(["p0", "p1"], 8)] + [(b, 2) for b in batches] + [(b, 8) for b in batches]
    assert res["sets"]["chat"]["output_tokens"] == 12 and res["sets"]["humaneval"]["output_tokens"] == 16
    # all in flight (concurrency 0) with a set left empty (every prompt of it skipped): no call for it
    calls.clear()
    res = measure.decode_greedy({"engine": {}, "prompts": prompts[:3], "max_tokens": 8, "concurrency": 0,
                                     "sets": [{"name": "chat", "count": 3}, {"name": "humaneval", "count": 0}]})
    assert [len(b) for b, _ in calls] == [3, 3, 3] and res["sets"]["humaneval"]["output_tokens"] == 0


def _fake_engines(calls, top, changed=(1, 3)):
    """run_child stand-in: baseline and k=2 engines over chat (a, b) and humaneval (2 prompts); k=2 changes
    chat prompt b's output token ``changed[0]`` (the baseline's [1, 2]) to ``changed[1]``; ``top``: the
    reference's top log-probabilities there."""

    def fake_run_child(entry, spec, workdir, name):
        if entry == lossless.TOP_ENTRY:
            calls.append((name, spec["items"], spec["engine"]["max_num_seqs"], spec["engine"].get("enforce_eager")))
            return {"engine_start_s": 1.0, "top": [top for _ in spec["items"]]}
        calls.append((name, [g["count"] for g in spec["sets"]], len(spec["prompts"])))
        k = (spec.get("speculative_config") or {}).get("num_speculative_tokens")
        tps = {None: (10.0, 20.0), 2: (15.0, 50.0)}[k]  # chat, humaneval tokens/s
        b_run = [1, 2]
        b_run[changed[0]] = changed[1]
        ids = [[1, 2]] * 4 if k is None else [[1, 2], b_run, [1, 2], [1, 2]]
        pids = [[100 + i, 7] for i in range(4)]
        sets = {}
        for j, (n, cnt) in enumerate((("chat", 2), ("humaneval", 2))):
            sets[n] = dict(_figures(40, tps[j]), token_ids=ids[2 * j:2 * j + cnt], prompt_token_ids=pids[2 * j:2 * j + cnt])
            if k:
                sets[n].update(_spec(k, 2.0, 1.0))
        res = dict(_figures(80, 80 / (4 + 0.8 * (k is None))), engine_start_s=2.0, token_ids=ids, prompt_token_ids=pids,
                   sets=sets)
        if k:
            res.update({x: v for x, v in _spec(k, 2.0, 1.0).items() if x not in ("speedup",)})
            # time per output token with the head: 0.3 s overall, 0.25 s on chat (the baseline's: 0.55 s everywhere)
            res["time_per_output_token_s"] = {**STATS, "mean": 0.3}
            sets["chat"]["time_per_output_token_s"] = {**STATS, "mean": 0.25}
        return res

    return fake_run_child


BY_SET = {"chat": [{"id": "a", "messages": []}, {"id": "b", "messages": []}],
          "humaneval": [{"id": "HumanEval/0", "messages": []}, {"id": "HumanEval/1", "messages": []}]}


def _engine(k=0, eager=False, seqs=1, layers=None):
    return {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "dtype": "bfloat16", "max_num_seqs": seqs,
            **({"enforce_eager": True} if eager else {}), **({"draft_layers": layers} if layers is not None else {})}


def _bench(tmp_path, head, out, skipped_too_long, **kw):
    """``benchmark._benchmark`` of ``head`` at k 2 over ``BY_SET`` (2 prompts a set, 8 tokens, one in flight) into
    ``out``, with the engines of ``_engine`` and a near-tie gap of 0.25 nats; ``kw``: more settings."""
    s = benchmark.BenchmarkSettings(target_dir="t", head_dir=head, prompts_path="p.jsonl", out_json=str(out), ks=[2],
                                    num_prompts=2, max_tokens=8, dtype="auto", served_name="m", max_model_len=512,
                                    concurrency=1, **kw)
    return benchmark._benchmark(tmp_path, _engine, BY_SET, s, 0.25, skipped_too_long)


def test_benchmark_assembles_sets_and_counts_a_near_tie(tmp_path, monkeypatch):
    """One child run per configuration over all sets; the parent splits speed-up and lossless check per set.
    Prompt b's changed token is the baseline's second choice, 0.05 nats below its first: a near-tie, counted,
    and the benchmark is written."""
    calls = []
    fake_engines(monkeypatch, _fake_engines(calls, [[2, -0.70], [3, -0.75], [9, -4.0]]))
    out = tmp_path / "b.json"
    r = _bench(tmp_path, _head(tmp_path, [2, 5]), out, {"chat": 1, "humaneval": 0})
    # the baseline's top log-probabilities are asked once, at b's first differing position, given its prompt
    assert calls == [("baseline", [2, 2], 4), ("eagle3_k2", [2, 2], 4),
                     ("baseline_top_logprobs", [{"prompt_token_ids": [101, 7], "prefix": [1]}], 1, True)]
    (e,) = r["runs"]
    # the run names what it served: the head's method, its draft layer (config.json's model_type), k and the
    # positions it was trained for (none: an EAGLE-3 head drafts one token a forward, any k)
    assert {f: e[f] for f in ("head", "method", "draft_layer", "num_speculative_tokens", "trained_positions")} == \
        {"head": "head", "method": "eagle3", "draft_layer": "llama", "num_speculative_tokens": 2,
         "trained_positions": None}
    assert r["heads"] == [{"name": "head", "method": "eagle3", "draft_layer": "llama", "trained_positions": None}]
    assert "eagle3" not in r
    assert e["sets"]["chat"]["speedup"] == 1.5 and e["sets"]["humaneval"]["speedup"] == 2.5
    assert e["sets"]["chat"]["differing_prompt_ids"] == ["b"] and e["sets"]["humaneval"]["outputs_identical"]
    assert e["prompts_differing_from_baseline"] == 1 and e["speedup"] == pytest.approx(20 / (80 / 4.8))
    assert (e["near_ties"], e["divergences"], e["lossless"]) == (1, 0, True)
    assert (e["sets"]["chat"]["near_ties"], e["sets"]["humaneval"]["near_ties"]) == (1, 0)
    # the step with the head: time per output token x tau 2, over the baseline's 0.55 s a token: overall 0.3 s ->
    # 600 ms, 1.0909 decode steps; chat 0.25 s -> 500 ms, 0.9091; humaneval 0.55 s -> 1,100 ms, 2
    assert (e["step_ms"], e["step_cost_ratio"]) == (600.0, 1.0909)
    assert (e["sets"]["chat"]["step_ms"], e["sets"]["chat"]["step_cost_ratio"]) == (500.0, 0.9091)
    assert (e["sets"]["humaneval"]["step_ms"], e["sets"]["humaneval"]["step_cost_ratio"]) == (1100.0, 2.0)
    (d,) = e["differences"]
    assert (d["prompt_id"], d["set"], d["position"], d["baseline_token"], d["run_token"], d["kind"]) == \
        ("b", "chat", 1, 2, 3, "near_tie")
    assert d["gap"] == pytest.approx(0.05) and d["top2_gap"] == pytest.approx(0.05)
    assert r["settings"]["near_tie_max_logprob_gap"] == 0.25 and r["settings"]["dtype"] == "bfloat16"
    assert r["settings"]["sets"] == {"chat": {"num_prompts": 2, "prompt_ids": ["a", "b"], "skipped_too_long": 1,
                                              "skipped_template_error": 0},
                                     "humaneval": {"num_prompts": 2, "prompt_ids": ["HumanEval/0", "HumanEval/1"],
                                                   "skipped_too_long": 0, "skipped_template_error": 0}}
    # the baseline answered [1, 2] to every prompt; the draft vocab {2, 5} holds half its tokens
    assert [e["draft_vocab_coverage"], e["sets"]["chat"]["draft_vocab_coverage"],
            e["sets"]["humaneval"]["draft_vocab_coverage"]] == [0.5, 0.5, 0.5]
    assert json.loads(out.read_text()) == json.loads(json.dumps(r))
    assert "token_ids" not in r["baseline"]["sets"]["chat"] and "prompt_token_ids" not in r["runs"][0]


def test_benchmark_compares_heads_against_one_baseline(tmp_path, monkeypatch):
    """benchmark.compare_heads: a P-EAGLE head of 2 layers benchmarked after the run's own head at the same k, over
    the same prompts against the one baseline: its engine sized by its own layers, its rows named and their
    method read from its config.json, its draft vocab coverage its own, its near-tie counted, the pre-flight and
    the schema unchanged for the run's own rows."""
    calls = []
    fake_engines(monkeypatch, _fake_engines(calls, [[2, -0.70], [3, -0.75], [9, -4.0]]))
    seen = []
    real = benchmark.engine_process.run_child

    def spy(entry, spec, workdir, name):
        seen.append((name, spec["engine"].get("draft_layers"), (spec.get("speculative_config") or {}).get("model")))
        res = real(entry, spec, workdir, name)
        if name.startswith("compare_"):  # the P-EAGLE head's steps are quicker: 0.2 s a token overall
            res["time_per_output_token_s"] = {**STATS, "mean": 0.2}
        return res

    fake_engines(monkeypatch, spy)
    own = _head(tmp_path, [2, 5])
    (tmp_path / "p").mkdir()
    other = _head(tmp_path / "p", [1, 2])
    (Path(other) / "config.json").write_text(json.dumps({
        "speculators_model_type": "peagle", "transformer_layer_config": {"num_hidden_layers": 2},
        "speculators_config": {"proposal_methods": [{"speculative_tokens": 8}]}}))
    heads = [{"name": "peagle", "path": other}]
    r = _bench(tmp_path, own, tmp_path / "b.json", {"chat": 0, "humaneval": 0}, compare_heads=heads)
    assert [x[0] for x in seen] == ["baseline", "eagle3_k2", "compare_peagle_k2", "baseline_top_logprobs"]
    assert seen[1][1:] == (1, own) and seen[2][1:] == (2, other)  # each engine sized by its head's layers: 1, P-EAGLE's 2
    assert [(e["head"], e["method"], e["draft_layer"], e["num_speculative_tokens"], e["trained_positions"])
            for e in r["runs"]] == [("head", "eagle3", "llama", 2, None), ("peagle", "peagle", "llama", 2, 8)]
    assert [h["name"] for h in r["heads"]] == ["head", "peagle"] and r["heads"][1]["trained_positions"] == 8
    own_row, peagle_row = r["runs"]
    assert (own_row["draft_vocab_coverage"], peagle_row["draft_vocab_coverage"]) == (0.5, 1.0)
    assert peagle_row["sets"]["chat"]["draft_vocab_coverage"] == 1.0
    assert (peagle_row["near_ties"], peagle_row["lossless"], peagle_row["sets"]["chat"]["speedup"]) == (1, True, 1.5)
    assert r["settings"]["compare_heads"] == heads
    assert json.loads((tmp_path / "b.json").read_text()) == json.loads(json.dumps(r))
    got = plot_benchmark.plot(tmp_path / "b.json", tmp_path / "b.png")  # side by side: the own head's k, then peagle's
    assert list(got) == [2, "peagle k=2"] and got["peagle k=2"]["sets"]["chat"]["speedup"] == 1.5
    # the pre-flight table timed the run's own head: the compared head's rows are left out of the check; the draft
    # cost is every head's: its step (600 ms; P-EAGLE's 0.2 s x tau 2 = 400 ms) less the target's verification,
    # the 550 ms baseline step + 2 x 10 ms
    table = [{"k": 2, "concurrency": 1, "step_cost_ratio": 1.2, "step_ms": 2.4, "decode_step_ms": 2.0,
              "verify_ms_per_token": 10.0}]
    from eagle3build.draft.step_costs import compare_benchmark

    cmp = compare_benchmark(r, {"table": table})
    assert [row["k"] for row in cmp["rows"]] == [2]
    assert [(d["head"], d["method"], d["k"], d["step_ms"], d["verify_step_ms"], d["draft_ms_per_step"],
             d["draft_ms_per_drafted_token"]) for d in cmp["draft_cost"]] == \
        [("head", "eagle3", 2, 600.0, 570.0, 30.0, 15.0), ("peagle", "peagle", 2, 400.0, 570.0, -170.0, -85.0)]
    monkeypatch.setattr(engine_process, "require_vllm", lambda **kw: None)
    for names in (["head"], ["peagle", "peagle"]):
        with pytest.raises(ValueError, match=r"compare_heads names .*: each must be unique"):
            benchmark.benchmark(BenchmarkSettings(
                target_dir="t", head_dir=own, prompts_path="p.jsonl", out_json=str(tmp_path / "x.json"), ks=[2],
                num_prompts=2, max_tokens=8, served_name="m",
                compare_heads=[{"name": n, "path": other} for n in names]))
    # without compared heads the runs still name their head; settings name no compared head
    plain = _bench(tmp_path, own, tmp_path / "c.json", {"chat": 0, "humaneval": 0})
    assert plain["runs"][0]["head"] == "head" and "compare_heads" not in plain["settings"]


def test_benchmark_names_a_compared_heads_divergence(tmp_path, monkeypatch):
    """A compared head that changes a sure greedy token fails the job naming that head, its k and the prompt."""
    fake_engines(monkeypatch, _fake_engines([], [[2, -0.05], [3, -3.05]]))
    (tmp_path / "p").mkdir()
    other = _head(tmp_path / "p", [1, 2])
    with pytest.raises(benchmark.BenchmarkError, match=r"k=2 prompt b .*; peagle k=2 prompt b \(chat\) at output token 1"):
        _bench(tmp_path, _head(tmp_path, [2, 5]), tmp_path / "b.json", {"chat": 0, "humaneval": 0},
               compare_heads=[{"name": "peagle", "path": other}])


@pytest.mark.parametrize("top, why", [([[2, -0.05], [3, -3.05]], "3.0 nats apart"),
                                      ([[2, -0.05], [5, -0.10], [6, -0.2]], "the head's token is not in the top list")])
def test_benchmark_fails_on_a_real_divergence(tmp_path, monkeypatch, top, why):
    """The same change where the baseline was sure of its token: the job fails naming the prompt, nothing written."""
    fake_engines(monkeypatch, _fake_engines([], top))
    out = tmp_path / "b.json"
    with pytest.raises(benchmark.BenchmarkError, match=r"k=2 prompt b \(chat\) at output token 1: baseline 2, with "
                                                        r"the head 3"):
        _bench(tmp_path, _head(tmp_path, [1, 2]), out, {"chat": 0, "humaneval": 0})
    assert not out.exists(), why


def test_benchmark_counts_a_first_token_difference_against_the_engines(tmp_path, monkeypatch, caplog):
    """Prompt b's first output token differs, far from a near-tie (3 nats): it comes from the target's prefill
    before any draft, so it is the engines' noise (seen on the H200 with a random MoE target), counted and
    logged, and the benchmark is written."""
    fake_engines(monkeypatch, _fake_engines([], [[1, -0.05], [9, -3.05]], changed=(0, 9)))
    out = tmp_path / "b.json"
    with caplog.at_level("WARNING"):
        r = _bench(tmp_path, _head(tmp_path, [1, 2]), out, {"chat": 0, "humaneval": 0})
    (e,) = r["runs"]
    assert (e["first_token_differences"], e["near_ties"], e["divergences"], e["lossless"]) == (1, 0, 0, True)
    assert e["sets"]["chat"]["first_token_differences"] == 1 and e["sets"]["humaneval"]["first_token_differences"] == 0
    (d,) = e["differences"]
    assert (d["position"], d["baseline_token"], d["run_token"], d["kind"]) == (0, 1, 9, "first_token")
    assert d["gap"] == pytest.approx(3.0) and out.exists()
    assert "prompt b (chat): the first output token differs" in caplog.text


def _echo_engines(specs):
    """run_child stand-in for ``benchmark.benchmark``: every engine answers each prompt with tokens [1, 2]
    (outputs identical, so no near-tie engine); the decode specs are appended to ``specs``."""

    def fake_run_child(entry, spec, workdir, name):
        specs.append(spec)
        k = (spec.get("speculative_config") or {}).get("num_speculative_tokens")

        def figures(n):
            return dict(_figures(2 * n), token_ids=[[1, 2]] * n, prompt_token_ids=[[7]] * n,
                        **({x: v for x, v in _spec(k, 2.0, 1.0).items() if x != "speedup"} if k else {}))

        return dict(figures(len(spec["prompts"])), engine_start_s=1.0,
                    sets={g["name"]: figures(g["count"]) for g in spec["sets"]})

    return fake_run_child


def test_benchmark_skips_prompts_too_long_for_the_engine(tiny_target, tmp_path, monkeypatch):
    """A custom prompt (or a long system turn) whose chat-template tokens plus max_tokens exceed max_model_len
    never reaches an engine: skipped, counted in settings.sets; a prompt that just fits runs. A set left
    without prompts fails before any engine starts, naming the set and the limit."""
    count = benchmark.chat_token_counter(str(tiny_target))
    fits = count([{"role": "user", "content": "Hi"}])
    pf = tmp_path / "mine.jsonl"
    pf.write_text("\n".join(json.dumps(r) for r in [
        {"id": "long", "prompt": "word " * 200}, {"id": "short", "prompt": "Hi"},
        {"id": "system", "messages": [{"role": "system", "content": "Be brief. " * 100}, {"role": "user", "content": "Hi"}]},
    ]) + "\n")
    monkeypatch.setattr(engine_process, "require_vllm", lambda needed_by: "test")
    specs = []
    fake_engines(monkeypatch, _echo_engines(specs))

    def run(max_model_len):
        return benchmark.benchmark(BenchmarkSettings(
            target_dir=str(tiny_target), head_dir=_head(tmp_path, [1]), prompts_path=str(tmp_path / "unused.jsonl"),
            out_json=str(tmp_path / "b.json"), ks=[2], num_prompts=8, max_tokens=16, dtype="auto",
            served_name="org/tiny",
            max_model_len=max_model_len, sets=["custom"], custom_prompts_path=str(pf)))

    r = run(fits + 16)
    assert [[p["id"] for p in s["prompts"]] for s in specs] == [["short"], ["short"]]  # baseline, k=2
    assert r["runs"][0]["draft_vocab_coverage"] == 0.5  # the echo engines' [1, 2] against the draft vocab {1}
    assert r["settings"]["sets"] == {"custom": {"num_prompts": 1, "prompt_ids": ["short"], "skipped_too_long": 2,
                                                "skipped_template_error": 0}}
    specs.clear()
    with pytest.raises(prompt_sets.PromptSetError, match=rf"benchmark set 'custom': all 3 prompts are longer than "
                                                         rf"{fits - 1} tokens"):
        run(fits + 15)
    assert specs == []
    # a k-schedule concurrency above the prompts that run could never be put in flight: refused before any engine
    with pytest.raises(ValueError, match=r"k_schedule_concurrencies \[1, 2\]: each must be from 1 to the 1 prompts"):
        benchmark.benchmark(BenchmarkSettings(
            target_dir=str(tiny_target), head_dir=_head(tmp_path, [1]), prompts_path=str(tmp_path / "unused.jsonl"),
            out_json=str(tmp_path / "b.json"), ks=[2], num_prompts=8, max_tokens=16, dtype="auto",
            served_name="org/tiny",
            max_model_len=fits + 16, sets=["custom"], custom_prompts_path=str(pf), k_schedule_concurrencies=[2, 1]))
    assert specs == []


def refusing_target(src, dest):
    """A copy of target ``src`` whose chat template raises on a system turn (as Gemma's and others do)."""
    import shutil

    from transformers import AutoTokenizer

    shutil.copytree(src, dest)
    tok = AutoTokenizer.from_pretrained(dest)
    tok.chat_template = ("{%- for m in messages %}{%- if m['role'] == 'system' %}"
                         "{{ raise_exception('System role not supported') }}{%- endif %}{%- endfor %}") + tok.chat_template
    tok.save_pretrained(dest)
    (dest / "chat_template.jinja").write_text(tok.chat_template)
    return dest


def test_benchmark_skips_prompts_the_template_refuses(tiny_target, tmp_path, monkeypatch):
    """Issue 38.5: a prompt the chat template refuses (a system turn) is skipped and counted per set before any
    engine starts, not a bare TemplateError; a set it refuses whole fails naming the set, prompt and message."""
    target = refusing_target(tiny_target, tmp_path / "refusing")
    pf = tmp_path / "mine.jsonl"
    pf.write_text("\n".join(json.dumps(r) for r in [
        {"id": "plain", "prompt": "Hi"},
        {"id": "system", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    ]) + "\n")
    monkeypatch.setattr(engine_process, "require_vllm", lambda needed_by: "test")
    specs = []
    fake_engines(monkeypatch, _echo_engines(specs))

    def run():
        return benchmark.benchmark(BenchmarkSettings(
            target_dir=str(target), head_dir=_head(tmp_path, [1]), prompts_path=str(tmp_path / "unused.jsonl"),
            out_json=str(tmp_path / "b.json"), ks=[2], num_prompts=8, max_tokens=16, dtype="auto",
            served_name="org/tiny",
            max_model_len=512, sets=["custom"], custom_prompts_path=str(pf)))

    r = run()
    assert [[p["id"] for p in s["prompts"]] for s in specs] == [["plain"], ["plain"]]
    assert r["settings"]["sets"]["custom"] == {"num_prompts": 1, "prompt_ids": ["plain"], "skipped_too_long": 0,
                                               "skipped_template_error": 1}
    specs.clear()
    pf.write_text(pf.read_text().splitlines()[1] + "\n")
    with pytest.raises(prompt_sets.PromptSetError, match=r"set 'custom': the target's chat template refuses all 1 "
                                                         r"prompts \(prompt system: .*System role not supported"):
        run()
    assert specs == []


def test_classify_difference():
    top = {3: [[10, -0.40], [11, -0.55], [12, -2.0]]}
    near = lossless.classify_difference([1, 2, 3, 10], [1, 2, 3, 11, 4], top, 0.25)
    assert (near["position"], near["kind"], near["gap"], near["top2_gap"]) == (3, "near_tie", pytest.approx(0.15),
                                                                               pytest.approx(0.15))
    assert lossless.classify_difference([1, 2, 3, 10], [1, 2, 3, 12], top, 0.25)["kind"] == "divergence"  # 1.6 apart
    assert lossless.classify_difference([1, 2, 3, 10], [1, 2, 3, 11], top, 0.1)["kind"] == "divergence"  # tighter
    assert lossless.classify_difference([1, 2, 3, 10], [1, 2, 3, 13], top, 9.0)["gap"] is None  # not in the top list
    assert near["baseline_gap"] == 0.0
    # judged against the reference's best, not the baseline's token: the baseline (11) was itself off the
    # reference's first choice (10), which the run took
    off = lossless.classify_difference([1, 2, 3, 11], [1, 2, 3, 10], top, 0.1)
    assert (off["kind"], off["gap"], off["baseline_gap"]) == ("near_tie", 0.0, pytest.approx(0.15))
    # the baseline's token outside the top list, the run's the reference's best: still a near-tie
    assert lossless.classify_difference([1, 2, 3, 99], [1, 2, 3, 10], top, 0.25)["kind"] == "near_tie"
    # the run's token 1.6 below the reference's best, though the baseline took the second: a divergence
    assert lossless.classify_difference([1, 2, 3, 11], [1, 2, 3, 12], top, 0.25)["kind"] == "divergence"
    # output token 0 comes from the target's prefill (no draft yet): the engines' difference, whatever the gap
    first = lossless.classify_difference([10, 5], [12, 5], {0: top[3]}, 0.25)
    assert (first["kind"], first["gap"]) == ("first_token", pytest.approx(1.6))
    # but a first token outside the reference's top list is no engine noise: a divergence
    assert lossless.classify_difference([10, 5], [13, 5], {0: top[3]}, 0.25)["kind"] == "divergence"
    assert lossless.classify_difference([], [12], {}, 0.25)["kind"] == "divergence"  # the baseline gave nothing
    ended = lossless.classify_difference([1, 2, 3], [1, 2, 3, 11], top, 0.25)  # the baseline stopped there
    assert (ended["baseline_token"], ended["kind"]) == (None, "divergence")
    assert lossless.first_difference([1, 2], [1, 2]) is None and lossless.first_difference([1], [1, 5]) == 1
    with pytest.raises(ValueError, match="do not differ"):
        lossless.classify_difference([1], [1], top, 0.25)


def test_best_ks_and_schedule_bands():
    """Per concurrency the k of the most tokens/s, 0 where none beats the head held at k 0, and 0 everywhere where
    the schedule does not beat the target alone on balance; bands split at the geometric midpoints (vLLM's
    inclusive [first, last, k] ranges from 1), one k's neighbours merged."""
    sweep = {0: {1: 100.0, 4: 300.0, 16: 800.0},
             1: {1: 150.0, 4: 360.0, 16: 790.0},
             3: {1: 190.0, 4: 350.0, 16: 700.0}}
    target = {1: 105.0, 4: 310.0, 16: 820.0}
    best = k_schedule.best_ks(sweep, [1, 4, 16], target)
    assert best == {1: 3, 4: 1, 16: 0}
    assert k_schedule.schedule_bands(best) == [[1, 2, 3], [3, 8, 1], [9, 16, 0]]
    assert k_schedule.schedule_bands({1: 2, 2: 2, 64: 1}) == [[1, 11, 2], [12, 64, 1]]
    assert k_schedule.schedule_bands({1: 0, 16: 0}) == [[1, 16, 0]]
    assert k_schedule.best_ks({0: {1: 10.0}, 2: {1: 10.0}}, [1], {1: 9.0}) == {1: 0}  # a tie is not faster
    assert k_schedule.best_ks({0: {1: 10.0}, 2: {1: 12.0}, 3: {1: 12.0}}, [1], {1: 9.0}) == {1: 2}  # nor a larger k
    # k 3 measured fastest at one request but none of its drafts was accepted there: noise, k 1 is served
    taus = {1: {1: 1.4, 4: 1.4, 16: 1.4}, 3: {1: 1.0, 4: 1.6, 16: 1.6}}
    assert k_schedule.best_ks(sweep, [1, 4, 16], target, taus) == {1: 1, 4: 1, 16: 0}
    # nor one that drafted nothing there (τ None)
    assert k_schedule.best_ks(sweep, [1], target, {1: {1: None}, 3: {1: 1.0}}) == {1: 0}
    # k 1 everywhere beats k 0 but not the target alone on balance: log(101/100 x 285/300 x 750/800) < 0
    assert k_schedule.best_ks({0: {1: 95.0, 4: 280.0, 16: 740.0}, 1: {1: 101.0, 4: 285.0, 16: 750.0}}, [1, 4, 16],
                             {1: 100.0, 4: 300.0, 16: 800.0}) == {1: 0, 4: 0, 16: 0}
    with pytest.raises(KeyError):
        k_schedule.best_ks({1: {1: 10.0}}, [1], {1: 9.0})  # no k 0 to compare with
    with pytest.raises(KeyError):
        k_schedule.best_ks(sweep, [1, 4, 16], {1: 100.0})  # the target alone not measured at 4


def test_schedule_k_of_each_method():
    """A P-EAGLE schedule holds 0 and one k (its method's ``schedule_k``): the k whose tokens/s, served everywhere,
    gains most over the target alone (sum of logs over the concurrencies), among the k whose drafts were accepted
    somewhere. An EAGLE-3 or DFlash schedule may hold any swept k (None)."""
    from eagle3build.draft.methods import METHODS

    parallel_k = METHODS["peagle"].schedule_k
    sweep = {1: {1: 150.0, 4: 360.0, 16: 790.0},
             3: {1: 190.0, 4: 350.0, 16: 700.0}}
    target = {1: 100.0, 4: 300.0, 16: 800.0}
    # k 1: log(1.5 x 1.2 x 0.9875) = 0.575; k 3: log(1.9 x 1.1667 x 0.875) = 0.662
    assert parallel_k(sweep, [1, 4, 16], target) == 3
    assert parallel_k({**sweep, 3: {1: 170.0, 4: 350.0, 16: 700.0}}, [1, 4, 16], target) == 1  # 0.551
    assert parallel_k({1: {1: 12.0}, 2: {1: 12.0}}, [1], {1: 10.0}) == 1  # a tie: the smaller k
    assert parallel_k({1: {1: 9.0}, 2: {1: 8.0}}, [1], {1: 10.0}) == 0  # none pays
    # k 3's drafts never accepted: only k 1 is a candidate
    assert parallel_k(sweep, [1, 4, 16], target, {1: {1: 1.3}, 3: {1: 1.0, 4: None, 16: 1.0}}) == 1
    assert parallel_k({1: {1: 0.0}}, [1], {1: 10.0}) == 0  # nothing decoded: no gain
    assert METHODS["eagle3"].schedule_k(sweep, [1, 4, 16], target) is None
    assert METHODS["dflash"].schedule_k(sweep, [1, 4, 16], target) is None


def _sweep_engines(specs, tps):
    """run_child stand-in for ``k_schedule``: ``tps[name][c]`` output tokens/s of each sweep engine; ``specs`` gets
    each call's name, spec and extra environment."""

    def fake_run_child(entry, spec, workdir, name, env=None):
        assert entry == k_schedule.SWEEP_ENTRY
        specs.append((name, spec, env))
        sc = spec.get("speculative_config")
        drafts = bool(sc) and sc["num_speculative_tokens_per_batch_size"] != [[1, 4, 0]]
        return {"engine_start_s": 1.0, "by_concurrency": {
            str(c): {"output_tokens_per_s": tps[name][c], "time_per_output_token_s": {"mean": c / tps[name][c]},
                     "mean_acceptance_length": 1.5 if drafts else None}
            for c in spec["concurrencies"]}}

    return fake_run_child


def _sched_engine(k=0, eager=False, seqs=1, layers=None):
    """``_engine`` that also records the k it was sized for (KV cache and draft layers)."""
    return {**_engine(k, eager, seqs, layers), "k": k}


V1 = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
PROMPTS4 = [{"id": "a", "messages": []}] * 4


def test_k_schedule_sweeps_chooses_and_serves_the_schedule(tmp_path, monkeypatch):
    """The target alone on the job's runner, then the head at k 1, 3 and 0, each as a one-band schedule on the V1
    runner, over every concurrency; the schedule engine gets vLLM's num_speculative_tokens_per_batch_size and its
    largest k; never_slower compares it with the target alone."""
    specs = []
    tps = {"sweep_baseline": {1: 100.0, 4: 300.0}, "sweep_k0": {1: 90.0, 4: 280.0}, "sweep_k1": {1: 140.0, 4: 330.0},
           "sweep_k3": {1: 180.0, 4: 290.0}, "sweep_schedule": {1: 175.0, 4: 320.0}}
    fake_engines(monkeypatch, _sweep_engines(specs, tps))
    head = Head.read(_head(tmp_path, [1, 2]))
    r = k_schedule.k_schedule(tmp_path, _sched_engine, PROMPTS4, head, [1, 3], 8, [1, 4])
    assert [n for n, _, _ in specs] == ["sweep_baseline", "sweep_k1", "sweep_k3", "sweep_k0", "sweep_schedule"]
    assert all(s["engine"]["max_num_seqs"] == 4 and s["concurrencies"] == [1, 4] for _, s, _ in specs)
    # the target alone sized without a drafter on the job's runner; every engine with the head on V1, sized for its k
    assert specs[0][2] is None and "speculative_config" not in specs[0][1] and specs[0][1]["engine"]["k"] == 0
    assert [env for _, _, env in specs[1:]] == [V1] * 4
    assert [s["engine"]["k"] for _, s, _ in specs[1:]] == [1, 3, 1, 3]
    assert [s["speculative_config"]["num_speculative_tokens_per_batch_size"] for _, s, _ in specs[1:4]] == \
        [[[1, 4, 1]], [[1, 4, 3]], [[1, 4, 0]]]
    assert [s["speculative_config"]["num_speculative_tokens"] for _, s, _ in specs[1:4]] == [1, 3, 1]
    assert r["best_k"] == {"1": 3, "4": 1} and r["schedule"] == [[1, 2, 3], [3, 4, 1]]
    sched_spec = specs[-1][1]["speculative_config"]
    assert sched_spec["num_speculative_tokens"] == 3 and sched_spec["method"] == "eagle3"
    assert sched_spec["num_speculative_tokens_per_batch_size"] == [[1, 2, 3], [3, 4, 1]]
    assert r["speculative_config"] == sched_spec
    assert (r["model_runner"], r["env"]) == ("v1", V1)
    assert r["scheduled"]["1"]["speedup"] == 1.75 and r["scheduled"]["4"]["speedup"] == pytest.approx(320 / 300,
                                                                                                     abs=1e-4)
    assert r["never_slower"] is True
    assert [(e["k"], e["num_speculative_tokens"]) for e in r["sweep"]] == [(0, 1), (1, 1), (3, 3)]
    assert r["baseline"]["by_concurrency"]["4"]["output_tokens_per_s"] == 300.0
    # k = 3 at one in flight: 1/180 s a token x tau 1.5 = 8.3333 ms a step, 0.8333 of the target's 10 ms
    k3 = r["sweep"][2]["by_concurrency"]["1"]
    assert (k3["step_ms"], k3["step_cost_ratio"]) == (8.3333, 0.8333)
    # the head held at k 0: one token a step, 1/90 s against the target's 1/100 s: a step 1.11 of the target's
    k0 = r["sweep"][0]["by_concurrency"]["1"]
    assert (k0["speedup"], k0["step_ms"], k0["step_cost_ratio"], k0["mean_acceptance_length"]) == \
        (0.9, 11.1111, 1.1111, None)
    import jsonschema

    sub = json.loads(benchmark.SCHEMA.read_text())["properties"]["k_schedule"]
    jsonschema.validate(r, sub)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**r, "schedule": [[1, 4]]}, sub)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({k: v for k, v in r.items() if k != "baseline"}, sub)
    # the schedule measured slower than the target somewhere: reported, not hidden
    tps["sweep_schedule"][4] = 290.0
    assert k_schedule.k_schedule(tmp_path, _sched_engine, PROMPTS4, head, [1, 3], 8, [1, 4])["never_slower"] is False
    # k 0 beats every k at 4 in flight but is still slower than the target alone: 0 there (the schedule pays on
    # balance: log(180/100 x 295/300) > 0), and the measured schedule is slower at 4
    tps.update(sweep_k0={1: 95.0, 4: 295.0}, sweep_k1={1: 140.0, 4: 280.0}, sweep_k3={1: 180.0, 4: 260.0},
               sweep_schedule={1: 178.0, 4: 294.0})
    r = k_schedule.k_schedule(tmp_path, _sched_engine, PROMPTS4, head, [1, 3], 8, [1, 4])
    assert r["schedule"] == [[1, 2, 3], [3, 4, 0]] and r["never_slower"] is False
    assert r["speculative_config"]["num_speculative_tokens"] == 3
    # no k beats k 0 anywhere: the schedule drafts nothing, the target alone is served, no schedule engine starts
    specs.clear()
    tps.update(sweep_k1={1: 90.0, 4: 200.0}, sweep_k3={1: 80.0, 4: 100.0})
    r = k_schedule.k_schedule(tmp_path, _sched_engine, PROMPTS4, head, [1, 3], 8, [1, 4])
    assert r["schedule"] == [[1, 4, 0]] and r["speculative_config"] is None and r["never_slower"] is True
    assert r["env"] == {} and r["best_k"] == {"1": 0, "4": 0}
    assert r["scheduled"]["4"] == {"output_tokens_per_s": 300.0, "mean_acceptance_length": None, "speedup": 1.0}
    assert [n for n, _, _ in specs] == ["sweep_baseline", "sweep_k1", "sweep_k3", "sweep_k0"]
    jsonschema.validate(r, sub)


def test_k_schedule_of_a_peagle_head_holds_one_k(tmp_path, monkeypatch):
    """A P-EAGLE head's schedule holds 0 and one k (vLLM's V1 runner stops at any other k in a band), that k chosen
    first and k 0 measured with it configured; served with parallel drafting. An EAGLE-3 head with the same figures
    mixes k 3 and k 1."""
    tps = {"sweep_baseline": {1: 100.0, 4: 300.0}, "sweep_k0": {1: 90.0, 4: 280.0}, "sweep_k1": {1: 140.0, 4: 330.0},
           "sweep_k3": {1: 180.0, 4: 290.0}, "sweep_schedule": {1: 175.0, 4: 320.0}}
    specs = []
    fake_engines(monkeypatch, _sweep_engines(specs, tps))
    head = Path(_head(tmp_path, [1, 2]))
    (head / "config.json").write_text('{"speculators_model_type": "peagle", '
                                      '"transformer_layer_config": {"num_hidden_layers": 1}, '
                                      '"speculators_config": {"proposal_methods": [{"speculative_tokens": 8}]}}')
    r = k_schedule.k_schedule(tmp_path, _sched_engine, PROMPTS4, Head.read(head), [1, 3], 8, [1, 4])
    # over the target alone, served everywhere: k 1 log(1.4 x 1.1) = 0.432, k 3 log(1.8 x 0.9667) = 0.554: k 3;
    # k 0 then measured with num_speculative_tokens 3; at 4 in flight k 3 (290) beats k 0 (280)
    assert [n for n, _, _ in specs] == ["sweep_baseline", "sweep_k1", "sweep_k3", "sweep_k0", "sweep_schedule"]
    k0_spec = specs[3][1]
    assert k0_spec["speculative_config"]["num_speculative_tokens"] == 3 and k0_spec["engine"]["k"] == 3
    assert k0_spec["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 4, 0]]
    assert r["best_k"] == {"1": 3, "4": 3} and r["schedule"] == [[1, 4, 3]]
    assert [(e["k"], e["num_speculative_tokens"]) for e in r["sweep"]] == [(0, 3), (1, 1), (3, 3)]
    assert r["speculative_config"]["parallel_drafting"] is True
    assert r["speculative_config"]["num_speculative_tokens"] == 3
    # k 0 faster than k 3 at 4 in flight: bands of 3 and 0, never k 1 beside them
    tps["sweep_k0"][4] = 295.0
    r = k_schedule.k_schedule(tmp_path, _sched_engine, PROMPTS4, Head.read(head), [1, 3], 8, [1, 4])
    assert r["schedule"] == [[1, 2, 3], [3, 4, 0]]
    # no k pays over the target alone: its k 0 is not measured, the target alone is served
    specs.clear()
    tps.update(sweep_k1={1: 95.0, 4: 250.0}, sweep_k3={1: 99.0, 4: 200.0})
    r = k_schedule.k_schedule(tmp_path, _sched_engine, PROMPTS4, Head.read(head), [1, 3], 8, [1, 4])
    assert [n for n, _, _ in specs] == ["sweep_baseline", "sweep_k1", "sweep_k3"]
    assert r["schedule"] == [[1, 4, 0]] and r["speculative_config"] is None and r["sweep"][0]["k"] == 1
    # the same figures for an EAGLE-3 head: k 3 at 1 in flight, k 1 at 4
    tps.update(sweep_k1={1: 140.0, 4: 330.0}, sweep_k3={1: 180.0, 4: 290.0})
    (head / "config.json").write_text('{"speculators_model_type": "eagle3", '
                                      '"transformer_layer_config": {"num_hidden_layers": 1, "model_type": "llama"}}')
    r = k_schedule.k_schedule(tmp_path, _sched_engine, PROMPTS4, Head.read(head), [1, 3], 8, [1, 4])
    assert r["schedule"] == [[1, 2, 3], [3, 4, 1]] and "parallel_drafting" not in r["speculative_config"]
