"""Response regeneration without vLLM: transformers' batched greedy generate, backend choice, and the
rule for answers cut at max_tokens (kept, flagged, their end-of-turn token not trained)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import prepare_settings

from eagle3build.data import prepare_data as pd
from eagle3build.data import regenerate_responses as rr
from eagle3build.formats import conversations as cv
from eagle3build.formats import tokens as tk
from eagle3build.vllm import engine_process, measure

REPO = Path(__file__).resolve().parents[1]
CONVS = [
    [{"role": "user", "content": "What is the capital of France? One word."}, {"role": "assistant", "content": "x"},
     {"role": "user", "content": "And of Italy?"}, {"role": "assistant", "content": "y"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."},
     {"role": "assistant", "content": "z"}],
    [{"role": "user", "content": "Write a long story about a dragon who learns to code in Python, with dialogue."},
     {"role": "assistant", "content": "w"}, {"role": "user", "content": "Now shorter."}, {"role": "assistant", "content": "v"}],
]


@pytest.fixture(scope="module")
def smol(smol_target):
    from transformers import AutoTokenizer

    from eagle3build.target import load_model

    return load_model(smol_target, torch.float32, "cpu"), AutoTokenizer.from_pretrained(smol_target)


def _plain_generate(model, tok, msgs, max_tokens):
    """One conversation, no batch, no padding: the reference greedy answer (token ids up to the first eos)."""
    ids = tok(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False), add_special_tokens=False,
              return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)[0, ids.shape[1]:].tolist()
    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos)
    end = next((j for j, t in enumerate(out) if t in eos), None)
    return out if end is None else out[:end], end is not None


def test_batched_greedy_equals_plain_generate(smol):
    """Left-padded batches (three prompts of different lengths in one batch) give each conversation the
    same greedy answer as a plain generate of that conversation alone."""
    model, tok = smol
    gen = rr.TransformersGenerator(model, tok, max_tokens=12, batch_size=8)
    prompts = [c[: next(i for i, m in enumerate(c) if m["role"] == "assistant")] for c in CONVS]
    assert len({gen.prompt_tokens(p) for p in prompts}) == 3  # really padded
    answers = gen(prompts)
    for p, a in zip(prompts, answers, strict=True):
        ids, finished = _plain_generate(model, tok, p, 12)
        assert a.text == tok.decode(ids, skip_special_tokens=True) and a.finished == finished
        assert a.tokens == len(ids) + finished
    assert "Paris" in answers[0].text and answers[0].finished
    assert not answers[2].finished and answers[2].tokens == 12  # the story is cut at max_tokens


def test_rounds_and_the_unfinished_answer_rule(smol):
    """Turn by turn: a finished answer continues its conversation, a cut one ends it (flagged)."""
    model, tok = smol
    gen = rr.TransformersGenerator(model, tok, max_tokens=12, batch_size=2)
    res = rr.regenerate_turns(CONVS, gen, gen.prompt_tokens, max_seq_len=512)
    c0, c1, c2 = res["conversations"]
    # France: two user turns, both answered by the target (the second prompt holds the first answer).
    assert [m["role"] for m in c0] == ["user", "assistant", "user", "assistant"] and c0[1]["content"] != "x"
    ids, finished = _plain_generate(model, tok, c0[:3], 12)
    assert c0[3]["content"] == tok.decode(ids, skip_special_tokens=True)
    assert res["last_turn_unfinished"][0] == (not finished)
    assert c1[0]["role"] == "system" and c1[2]["content"] != "z"
    # The story: cut at 12 tokens, kept as the last turn, flagged; "Now shorter." and its answer dropped.
    assert [m["role"] for m in c2] == ["user", "assistant"] and res["last_turn_unfinished"][2] is True
    assert res["answers_at_max_tokens"] == sum(res["last_turn_unfinished"]) >= 1
    assert res["turns_regenerated"] == sum(m["role"] == "assistant" for c in res["conversations"] for m in c)
    # A prompt at max_seq_len stops its conversation before generating.
    short = rr.regenerate_turns(CONVS[:1], gen, gen.prompt_tokens, max_seq_len=gen.prompt_tokens(CONVS[0][:1]))
    assert short["conversations"] == [[]] and short["conversations_cut_at_max_seq_len"] == 1


def test_regenerate_transformers_end_to_end_then_mask(tmp_path, smol_target):
    """regenerate(backend=transformers) writes the vLLM backend's format (ids kept, the flag added, each answer's
    token ids); prepare_data then trains the last answer from those ids: a cut answer ends the sample without the
    <|im_end|> the template would close it with, a finished one ends on the <|im_end|> the target emitted."""
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "messages": c}) + "\n" for i, c in enumerate(CONVS)))
    out, rep_path = tmp_path / "regen.jsonl", tmp_path / "rep.json"
    rep = rr.regenerate(rr.RegenerateSettings(
        sources=[{"path": str(src), "max_samples": None}], target_dir=str(smol_target), out_jsonl=out,
        out_report=rep_path, max_seq_len=256, max_tokens=12, served_name="m", dtype="float32", backend="transformers",
        batch_size=2))
    assert rep["backend"] == {"used": "transformers", "requested": "transformers",
                              "reason": "data.regenerate.backend: transformers"}
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in recs] == ["r0", "r1", "r2"] and recs[2][cv.UNFINISHED_KEY] is True
    assert rep["conversations_out"] == 3 and rep["answers_at_max_tokens"] == sum(r[cv.UNFINISHED_KEY] for r in recs)
    assert rep["generated_tokens"] > 0 and json.loads(rep_path.read_text()) == rep
    files = [tmp_path / n for n in ("train.st", "eval.st", "prompts.jsonl", "data.json")]
    data = pd.prepare(prepare_settings([{"path": str(out), "max_samples": None}], smol_target, files, max_seq_len=256,
                                       min_supervised_tokens=1, eval_fraction=0.01, seed=0,
                                       require_eval=False, benchmark_sets=[]))
    assert data["last_turn_unfinished"] == rep["answers_at_max_tokens"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_target)
    tf = tk.read_tokens(files[0])
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for r in recs:
        ids, mask = tf.sample(tf.sample_ids.index(r["id"]))
        gen = r["messages"][-1]["token_ids"]
        assert ids[-len(gen):].tolist() == gen and mask[-len(gen):].all() and int(np.flatnonzero(mask)[-1]) == len(ids) - 1
        assert "token_ids" not in r["messages"][1] or len(r["messages"]) == 2  # only the last answer keeps its ids
        if r[cv.UNFINISHED_KEY]:
            assert ids[-1] != end and len(gen) == 12  # cut at max_tokens: no closing token trained
            assert tok.decode(ids[mask == 1]).endswith(r["messages"][-1]["content"][-5:])
        else:
            assert ids[-1] == end


def test_open_last_turn_clears_only_the_trailing_special_tokens():
    ids = np.array([5, 6, 2, 9, 7, 8, 2, 4], np.int32)
    mask = np.array([0, 1, 1, 0, 1, 1, 1, 0], np.uint8)
    assert pd.open_last_turn(ids, mask, {2}).tolist() == [0, 1, 1, 0, 1, 1, 0, 0]
    assert pd.open_last_turn(ids, mask, {3}).tolist() == mask.tolist()  # no special token at the end: unchanged
    assert pd.normalise({"messages": CONVS[1], cv.UNFINISHED_KEY: True}, "s", 0, pd.Counters()).last_turn_unfinished
    # A trailing user turn is dropped by normalisation: the flag no longer names the last turn.
    conv = pd.normalise({"messages": CONVS[1] + [{"role": "user", "content": "more"}], cv.UNFINISHED_KEY: True}, "s", 0,
                        pd.Counters())
    assert conv.last_turn_unfinished is False


def test_backend_choice(monkeypatch):
    def broken(needed_by):
        try:
            raise ImportError("libcudart.so.12: cannot open shared object file")
        except ImportError as e:
            raise engine_process.VLLMUnavailable(f"{needed_by} needs vllm") from e

    monkeypatch.setattr(engine_process, "require_vllm", lambda needed_by: "0.32.0")
    assert rr.choose_backend("auto") == {"used": "vllm", "requested": "auto", "reason": "vLLM 0.32.0 imports in this job"}
    monkeypatch.setattr(engine_process, "require_vllm", broken)
    got = rr.choose_backend("auto")
    assert got["used"] == "transformers" and "libcudart.so.12" in got["reason"]
    assert rr.choose_backend("transformers")["used"] == "transformers"
    with pytest.raises(engine_process.VLLMUnavailable):
        rr.choose_backend("vllm")
    with pytest.raises(ValueError, match="data.regenerate.backend"):
        rr.choose_backend("sglang")


LOOP = "The dragon is revealed to be a goblin king. " * 20  # 880 characters, one sentence over and over


def test_ends_in_loop():
    """The report's loop count: a verbatim repeat at the end is a loop; varied text, a loop that stopped
    before the end, and a short answer are not."""
    assert rr.ends_in_loop(LOOP) and rr.ends_in_loop("Intro. " + LOOP)
    varied = " ".join(f"Step {i}: add {i * 7 % 13} apples to basket {i % 5}." for i in range(40))
    assert len(varied) > rr.LOOP_WINDOW and not rr.ends_in_loop(varied)
    assert not rr.ends_in_loop(LOOP + varied)  # the loop ended; the answer went on
    assert not rr.ends_in_loop(LOOP[:200])  # shorter than half the window


def _scripted(cut: set[tuple[int, int]]):
    """A generator answering prompt p of round r (its number of user turns) with a finished answer, or with a cut
    loop of 9 tokens where (conversation index, round) is in ``cut``; the conversation is told by its first text."""
    def generate(prompts):
        out = []
        for p in prompts:
            i, r = int(p[0]["content"][1:]), sum(m["role"] == "user" for m in p)
            out.append(rr.Answer(LOOP, 9, False, list(range(9))) if (i, r) in cut
                       else rr.Answer(f"a{i}.{r}", 3, True, [i, r, 0]))
        return out
    return generate


def test_unfinished_keep_or_drop():
    """data.regenerate.unfinished: a cut answer ends its conversation either way; keep trains it (flagged), drop
    leaves it out so the conversation ends at the answer before (or holds no answer at all); the counts of cut and
    looping answers and the generated tokens are the same in both."""
    convs = [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "old"},
              {"role": "user", "content": "more"}, {"role": "assistant", "content": "old"},
              {"role": "user", "content": "again"}, {"role": "assistant", "content": "old"}] for i in range(3)]
    gen = _scripted({(0, 2), (1, 1)})  # conversation 0 cut at its 2nd answer, 1 at its 1st, 2 never

    def run(mode):
        return rr.regenerate_turns(convs, gen, lambda msgs: 4 * len(msgs), max_seq_len=1000, unfinished=mode)

    keep, drop = run("keep"), run("drop")
    k0, k1, k2 = keep["conversations"]
    assert [m["content"] for m in k0 if m["role"] == "assistant"] == ["a0.1", LOOP]
    assert [m["content"] for m in k1 if m["role"] == "assistant"] == [LOOP]
    assert [m["content"] for m in k2 if m["role"] == "assistant"] == ["a2.1", "a2.2", "a2.3"]
    assert keep["last_turn_unfinished"] == [True, True, False] and keep["turns_regenerated"] == 6
    d0, d1, d2 = drop["conversations"]
    assert d0 == k0[:2] and d1 == [] and d2 == k2  # ends on the answer before; conversation 1 holds none
    assert drop["last_turn_unfinished"] == [False, False, False] and drop["turns_regenerated"] == 4
    for res in (keep, drop):
        assert res["answers_at_max_tokens"] == 2 and res["answers_at_max_tokens_looping"] == 2
        assert res["generated_tokens"] == 2 * 9 + 4 * 3
    with pytest.raises(ValueError, match="unfinished"):
        run("truncate")


def test_regenerate_drop_writes_no_cut_answer(tmp_path, smol_target):
    """regenerate(unfinished="drop"): the story conversation, cut at its first answer, is not written; no record
    is flagged; the report names the rule and still counts the cut answer."""
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "messages": c}) + "\n" for i, c in enumerate(CONVS)))
    out, rep_path = tmp_path / "regen.jsonl", tmp_path / "rep.json"
    rep = rr.regenerate(rr.RegenerateSettings(
        sources=[{"path": str(src), "max_samples": None}], target_dir=str(smol_target), out_jsonl=out,
        out_report=rep_path, max_seq_len=256, max_tokens=12, served_name="m", unfinished="drop", dtype="float32",
        backend="transformers", batch_size=4))
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert "r2" not in [r["id"] for r in recs] and not any(r[cv.UNFINISHED_KEY] for r in recs)
    assert rep["unfinished"] == "drop" and rep["answers_at_max_tokens"] >= 1
    assert rep["conversations_out"] == len(recs) >= 1 and all(r["messages"][-1]["role"] == "assistant" for r in recs)
    assert 1 <= 3 - len(recs) <= rep["answers_at_max_tokens"]  # a conversation is gone only where its first answer was cut
    with pytest.raises(ValueError, match=r"data.regenerate.unfinished 'cut' is not one of \['keep', 'drop'\]"):
        rr.RegenerateSettings(sources=[], target_dir=str(smol_target), out_jsonl=out, out_report=rep_path,
                              unfinished="cut")


@pytest.mark.parametrize("mode", ["keep", "drop"])
def test_resume_after_a_kill(tmp_path, mode):
    """checkpoint_every: answers go to the generator that many at a time and the loop state is saved after each
    call; a run killed mid-way and started again with the same key generates only the answers it had not, and
    ends with what an uninterrupted run gives (keep or drop, with a conversation stopped at max_seq_len). A state
    of another key, or an unreadable one, is ignored."""
    convs = [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "old"},
              {"role": "user", "content": "more"}, {"role": "assistant", "content": "old"},
              {"role": "user", "content": "again"}, {"role": "assistant", "content": "old"}] for i in range(7)]
    convs[6][4]["content"] = "x" * 50  # conversation 6's third prompt reaches max_seq_len: it stops there
    gen = _scripted({(0, 2), (3, 1), (5, 3)})

    def run(generate, **kw):
        return rr.regenerate_turns(convs, generate, lambda msgs: sum(len(m["content"]) for m in msgs),
                                   max_seq_len=60, unfinished=mode, **kw)

    ref = run(gen)  # one call per round, nothing saved
    total = 7 * 3 - 2 - 1 - 1  # answers generated: 0 and 3 end at their cut answer, 6 at its long prompt
    assert ref["turns_regenerated"] == (total if mode == "keep" else total - 3)
    assert ref["conversations_cut_at_max_seq_len"] == 1 and ref["resumed_from_answers"] == 0
    state = tmp_path / "regen.jsonl.state" / "state.json"
    calls: list[int] = []

    def dies_at_call_6(prompts):
        if len(calls) == 5:
            raise RuntimeError("killed")
        calls.append(len(prompts))
        return gen(prompts)

    with pytest.raises(RuntimeError, match="killed"):
        run(dies_at_call_6, checkpoint_every=2, state_path=state, key="k")
    assert max(calls) == 2 and json.loads(state.read_text())["state"]["counts"]["answers"] == sum(calls) == 9
    seen: list = []

    def counting(prompts):
        seen.extend(prompts)
        return gen(prompts)

    res = run(counting, checkpoint_every=2, state_path=state, key="k")
    assert res["resumed_from_answers"] == 9 and len(seen) == total - 9
    drop = ("generate_seconds", "resumed_from_answers")
    assert {k: v for k, v in res.items() if k not in drop} == {k: v for k, v in ref.items() if k not in drop}
    seen.clear()
    assert run(counting, checkpoint_every=2, state_path=state, key="other")["resumed_from_answers"] == 0
    assert len(seen) == total
    state.write_text("{not json")
    assert run(gen, checkpoint_every=2, state_path=state, key="other")["resumed_from_answers"] == 0
    with pytest.raises(ValueError, match="checkpoint_every"):
        run(gen, checkpoint_every=-1)


def test_state_key_names_what_the_answers_depend_on(tmp_path):
    """A saved state resumes only the same job: the key changes with the prompts, a target file, the backend and
    any setting, and stays put for an identical call."""
    (tmp_path / "config.json").write_text("{}")
    prompts = [[{"role": "user", "content": "hi"}]]
    tf = {"used": "transformers", "requested": "transformers", "reason": "r"}
    key = rr._state_key(prompts, str(tmp_path), tf, 16, 256, "keep")
    assert key == rr._state_key(prompts, str(tmp_path), tf, 16, 256, "keep") and len(key) == 16
    assert key != rr._state_key([[{"role": "user", "content": "ho"}]], str(tmp_path), tf, 16, 256, "keep")
    assert key != rr._state_key(prompts, str(tmp_path), tf, 32, 256, "keep")
    assert key != rr._state_key(prompts, str(tmp_path), tf, 16, 256, "drop")
    assert key != rr._state_key(prompts, str(tmp_path), {**tf, "used": "other"}, 16, 256, "keep")
    (tmp_path / "config.json").write_text("{ }")
    assert key != rr._state_key(prompts, str(tmp_path), tf, 16, 256, "keep")


# --- data.regenerate.temperature / top_p: sampled answers -------------------------------------------------------------

PROMPTS = [c[: next(i for i, m in enumerate(c) if m["role"] == "assistant")] for c in CONVS]


@pytest.fixture(scope="module")
def tiny(tiny_target):
    from transformers import AutoTokenizer

    from eagle3build.target import load_model

    return load_model(tiny_target, torch.float32, "cpu"), AutoTokenizer.from_pretrained(tiny_target)


def test_sampled_answers_repeat_with_the_seed_and_differ_from_greedy(tiny):
    """transformers backend on CPU (the tiny random target: fast): temperature 1.0 with the same seed gives the same
    answers twice (a fresh generator each time: the seed is set when it is made), another seed other answers, and
    they are not the greedy ones; temperature 0 stays greedy whatever top_p and seed say; a nucleus of one token
    (top_p near 0) samples the greedy answers."""
    model, tok = tiny

    def answers(**kw):
        return [(a.text, a.tokens, a.finished, a.token_ids)
                for a in rr.TransformersGenerator(model, tok, max_tokens=8, batch_size=2, **kw)(PROMPTS)]

    sampled = answers(temperature=1.0, top_p=1.0, seed=7)
    assert answers(temperature=1.0, top_p=1.0, seed=7) == sampled
    assert answers(temperature=1.0, top_p=1.0, seed=8) != sampled
    greedy = answers()
    assert all(s[3] != g[3] for s, g in zip(sampled, greedy, strict=True))
    assert answers(temperature=0.0, top_p=0.3, seed=123) == greedy
    assert answers(temperature=1.0, top_p=1e-6, seed=7) == greedy


def test_regenerate_sampled_transformers_is_seeded_and_reported(tmp_path, tiny_target, caplog):
    """regenerate(backend=transformers, temperature > 0): the same seed writes the same file twice, another seed
    another; the report records temperature and top_p and the log says sampled (greedy: greedy)."""
    import logging

    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "messages": c}) + "\n" for i, c in enumerate(CONVS)))

    def run(name, **kw):
        out = tmp_path / f"{name}.jsonl"
        rep = rr.regenerate(rr.RegenerateSettings(
            sources=[{"path": str(src), "max_samples": None}], target_dir=str(tiny_target), out_jsonl=out,
            out_report=tmp_path / f"{name}.json", max_seq_len=256, max_tokens=8, served_name="m", dtype="float32",
            backend="transformers", batch_size=2, **kw))
        return out.read_text(), rep

    with caplog.at_level(logging.INFO, logger=rr.__name__):
        a, rep = run("a", temperature=1.0, top_p=0.95, seed=3)
    assert rep["temperature"] == 1.0 and rep["top_p"] == 0.95
    assert any("sampled (temperature 1, top_p 0.95)" in r.getMessage() for r in caplog.records)
    assert run("b", temperature=1.0, top_p=0.95, seed=3)[0] == a
    assert run("c", temperature=1.0, top_p=0.95, seed=4)[0] != a
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=rr.__name__):
        greedy, rep = run("g")
    assert rep["temperature"] == 0.0 and rep["top_p"] == 1.0 and greedy != a
    assert any("with transformers, greedy (" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("kw, key", [({"temperature": -1.0}, "data.regenerate.temperature"),
                                     ({"temperature": float("nan")}, "data.regenerate.temperature"),
                                     ({"top_p": 0.0}, "data.regenerate.top_p"),
                                     ({"top_p": 1.5}, "data.regenerate.top_p")])
def test_a_bad_sampling_setting_is_named(tmp_path, kw, key):
    """Out of range: the stage stops before reading anything (ValueError naming the key), and the config schema that
    Snakemake validates at parse time rejects the value (WorkflowError naming the key)."""
    import copy

    import yaml
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        rr.regenerate(rr.RegenerateSettings(sources=[], target_dir="unused", out_jsonl=tmp_path / "o.jsonl",
                                            out_report=tmp_path / "r.json", max_seq_len=256, max_tokens=12,
                                            served_name="m", backend="transformers", **kw))
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        rr.check_sampling(kw.get("temperature", 0.0), kw.get("top_p", 1.0))
    schema = str(REPO / "schemas/config.schema.yaml")
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    validate(copy.deepcopy(cfg), schema)  # the defaults are valid
    if all(v == v for v in kw.values()):  # NaN: no value a YAML config would hold
        cfg["data"]["regenerate"].update(kw)
        with pytest.raises(WorkflowError, match=rf"\['{key.rsplit('.', 1)[1]}'\]"):
            validate(cfg, schema)


def test_the_state_key_holds_temperature_and_top_p(tmp_path, monkeypatch):
    """A saved state resumes only the same decoding: regenerate's key changes with temperature and top_p."""
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    src = tmp_path / "src.jsonl"
    src.write_text(json.dumps({"id": "r0", "messages": CONVS[1]}) + "\n")
    keys = []

    def fake(target, prompts, *a, key="", **k):
        keys.append(key)
        return rr.regenerate_turns(prompts, lambda ps: [rr.Answer("new", 2, True, [7, 2]) for _ in ps], lambda m: 3, 100)

    monkeypatch.setattr(rr, "regenerate_with_transformers", fake)
    for t, p in ((0.0, 1.0), (0.0, 1.0), (0.7, 1.0), (0.7, 0.9)):
        rr.regenerate(rr.RegenerateSettings(
            sources=[{"path": str(src), "max_samples": None}], target_dir=str(tmp_path / "target"),
            out_jsonl=tmp_path / "o.jsonl", out_report=tmp_path / "r.json", max_seq_len=256, max_tokens=12,
            served_name="m", backend="transformers", checkpoint_every=4, temperature=t, top_p=p))
    assert keys[0] == keys[1] and len(set(keys)) == 3 and all(len(k) == 16 for k in keys)


def test_vllm_child_samples_from_the_engine_seed(monkeypatch):
    """run_child (vLLM) without an engine: temperature 0 asks for greedy SamplingParams as before; temperature > 0
    passes temperature and top_p and no per-request seed (the engine's seed, data.seed, seeds the sampler)."""
    import sys
    import types

    made = []

    class SamplingParams:
        def __init__(self, **kw):
            made.append(kw)

    class LLM:
        def get_tokenizer(self):
            return types.SimpleNamespace(apply_chat_template=lambda m, **k: "x" * len(m), encode=lambda s, **k: list(s))

        def chat(self, prompts, sp, use_tqdm):
            out = types.SimpleNamespace(text="ok", token_ids=[5, 2], finish_reason="stop")
            return [types.SimpleNamespace(outputs=[out]) for _ in prompts]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=SamplingParams))
    monkeypatch.setattr(measure, "start_engine", lambda engine: (LLM(), 0.0))
    spec = {"engine": {"seed": 5}, "conversations": CONVS, "max_tokens": 12, "max_seq_len": 256, "unfinished": "keep",
            "temperature": 0.0, "top_p": 1.0, "checkpoint_every": 0, "state_path": None, "key": ""}
    res = rr.run_child(spec)
    assert res["turns_regenerated"] == 5 and made == [{"temperature": 0.0, "max_tokens": 12}]
    rr.run_child({**spec, "temperature": 0.8, "top_p": 0.9})
    assert made[1] == {"temperature": 0.8, "top_p": 0.9, "max_tokens": 12} and "seed" not in made[1]
    with pytest.raises(ValueError, match="top_p"):
        rr.run_child({**spec, "temperature": 0.8, "top_p": 0.0})
