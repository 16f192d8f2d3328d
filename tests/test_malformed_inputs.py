"""A table of malformed inputs: each ends in a clear error naming the file (and record), or in a counted skip."""
from __future__ import annotations

import json

import pytest
from conftest import prepare_settings

from eagle3build.data import prepare_data as pd
from eagle3build.formats import tokens as tk

GOOD = {"id": "good", "conversations": [{"from": "human", "value": "hi"},
                                        {"from": "gpt", "value": "Hello! How can I help you today?"}]}


def sg(*turns, **extra):
    return {"conversations": [{"from": r, "value": t} for r, t in turns], **extra}


def msgs(*turns):
    return {"messages": [{"role": r, "content": t} for r, t in turns]}


def as_array(*records):
    return json.dumps([GOOD, *records]).encode()


def as_jsonl(*lines):
    return ("\n".join([json.dumps(GOOD), *lines]) + "\n").encode()


# (name, file bytes, expected): expected is ("error", text in message) or ("skip", reason) or ("fix", key)
CASES = [
    ("truncated array", as_array(sg(("human", "a"), ("gpt", "b")))[:-30], ("salvage", 1)),
    ("jsonl bad line", as_jsonl("{broken"), ("bad_line", 1)),
    ("top level string", b'"just text"', ("error", "expected a JSON array or JSON lines")),
    ("top level number", b"42", ("error", "expected a JSON array or JSON lines")),
    ("empty file", b"   \n", ("error", "file is empty")),
    ("non-UTF-8 byte in a record", as_array(sg(("human", "q"), ("gpt", "caf-e au lait, please")))
     .replace(b"caf-e", b"caf\xe9"), ("skip", "bad_unicode")),
    ("UTF-16 file", json.dumps([GOOD]).encode("utf-16"), ("error", "UTF-16 text")),
    ("non-UTF-8 first byte", b"\xff" + as_array(), ("error", "not UTF-8")),
    ("record is a list", as_array([1, 2, 3]), ("skip", "not_an_object")),
    ("no turn list", as_array({"id": "x", "text": "hello"}), ("skip", "missing_key")),
    ("turn without value", as_array({"conversations": [{"from": "human"}, {"from": "gpt", "value": "b"}]}),
     ("skip", "missing_key")),
    ("unknown role", as_array(sg(("narrator", "once"), ("gpt", "upon"))), ("skip", "unknown_role")),
    ("non-string text", as_array({"messages": [{"role": "user", "content": [1]}, {"role": "assistant", "content": "b"}]}),
     ("skip", "non_string_text")),
    ("empty turn", as_array(sg(("human", ""), ("gpt", "b"))), ("skip", "empty_text")),
    ("whitespace turn", as_array(msgs(("user", "q"), ("assistant", " \n\t"))), ("skip", "empty_text")),
    ("system not first", as_array(msgs(("user", "q"), ("system", "s"), ("assistant", "a"))), ("skip", "system_not_first")),
    ("no assistant turn", as_array(sg(("human", "q1"), ("human", "q2"))), ("skip", "no_assistant_turn")),
    ("leading assistant", as_array(sg(("gpt", "lead"), ("human", "q"), ("gpt", "answer that is long enough"))),
     ("fix", "fixed_leading_assistant")),
    ("consecutive users", as_array(sg(("human", "q1"), ("human", "q2"), ("gpt", "answer that is long enough"))),
     ("fix", "fixed_merged_turns")),
    ("10k-token user turn", as_array(sg(("human", "word " * 10_000), ("gpt", "short answer here"))),
     ("skip", "too_few_supervised_tokens")),
    ("only a short answer", as_array(sg(("human", "q"), ("gpt", "ok"))), ("skip", "too_few_supervised_tokens")),
]


@pytest.mark.parametrize("name, content, expected", CASES, ids=[c[0] for c in CASES])
def test_malformed_input(name, content, expected, tmp_path, smol_target):
    f = tmp_path / "input.json"
    f.write_bytes(content)
    out = [tmp_path / n for n in ("train.st", "eval.st", "prompts.jsonl", "report.json")]
    kind, what = expected
    if kind == "error":
        with pytest.raises(pd.DataError, match=what) as e:
            pd.prepare(prepare_settings([{"path": str(f), "max_samples": None}], smol_target, out, max_seq_len=512,
                                        min_supervised_tokens=4, eval_fraction=0.01, seed=0,
                                        require_eval=False, benchmark_sets=[]))
        assert str(f) in str(e.value)
        return
    rep = pd.prepare(prepare_settings([{"path": str(f), "max_samples": None}], smol_target, out, max_seq_len=512,
                                      min_supervised_tokens=4, eval_fraction=0.01, seed=0,
                                      require_eval=False, benchmark_sets=[]))
    if kind == "skip":
        assert rep["skipped"] == {what: 1} and rep["kept"] == 1
    elif kind == "fix":
        assert rep["fixed"][what] == 1 and rep["kept"] == 2 and rep["skipped_total"] == 0
    elif kind == "salvage":
        assert rep["kept"] == what and rep["sources"][0]["bytes_lost"] > 0
    elif kind == "bad_line":
        assert rep["sources"][0]["bad_lines"] == what and rep["kept"] == 1


def test_ten_thousand_token_turn_is_truncated_not_dropped(tmp_path, smol_target):
    f = tmp_path / "long.json"
    f.write_text(json.dumps([sg(("human", "Summarise."), ("gpt", "word " * 10_000))]))
    out = [tmp_path / n for n in ("train.st", "eval.st", "prompts.jsonl", "report.json")]
    rep = pd.prepare(prepare_settings([{"path": str(f), "max_samples": None}], smol_target, out, max_seq_len=300,
                                      min_supervised_tokens=4, eval_fraction=0.01, seed=0,
                                      require_eval=False, benchmark_sets=[]))
    assert rep["kept"] == 1 and rep["truncated_to_max_seq_len"] == 1 and rep["tokens"]["max"] == 300
    ids, mask = tk.read_tokens(out[0]).sample(0)
    assert len(ids) == 300 and mask[-1] == 1


def test_mixed_sources_and_caps(tmp_path, smol_target, sharegpt_sample):
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps(dict(msgs(("user", f"question {i}"), ("assistant", f"answer number {i} is here")),
                                            id=f"c{i}")) + "\n" for i in range(5)))
    out = [tmp_path / n for n in ("train.st", "eval.st", "prompts.jsonl", "report.json")]
    rep = pd.prepare(prepare_settings([{"path": str(sharegpt_sample), "max_samples": 7},
                                       {"path": str(chat), "max_samples": 3}], smol_target, out, max_seq_len=256,
                                      min_supervised_tokens=4, eval_fraction=0.2, seed=0,
                                      require_eval=False, benchmark_sets=[]))
    assert [s["kept"] for s in rep["sources"]] == [7, 3] and rep["kept"] == 10
    ids = tk.read_tokens(out[0]).sample_ids + tk.read_tokens(out[1]).sample_ids
    assert sum(i.startswith("c") for i in ids) == 3


def test_prompts_file(tmp_path):
    """Benchmark set `custom` (data.prompts_file): both line forms, ids kept or derived; a bad line is named."""
    from eagle3build import prompt_sets

    pf = tmp_path / "p.jsonl"
    pf.write_text('{"prompt": "Tell me a joke."}\n{"id": "x", "messages": [{"role": "user", "content": "Hi"}]}\n')
    got = prompt_sets.load_sets(["custom"], 10, prompt_sets.Sources(user_prompts=pf))["custom"]
    assert got == [{"id": "p.jsonl:1", "messages": [{"role": "user", "content": "Tell me a joke."}]},
                   {"id": "x", "messages": [{"role": "user", "content": "Hi"}]}]
    pf.write_text('{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}\n')
    with pytest.raises(prompt_sets.PromptSetError, match=r"p.jsonl: line 1: expected"):
        prompt_sets.read_prompts(pf)
