"""prepare_data: ingest with salvage, normalisation rules, the assistant mask, the split, the files."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import prepare_settings

from eagle3build.data import chat_masking as cm
from eagle3build.data import prepare_data as pd
from eagle3build.formats import conversation_files as cf
from eagle3build.formats import tokens as tk


def conv(*turns, key="conversations"):
    if key == "conversations":
        return {"conversations": [{"from": r, "value": t} for r, t in turns]}
    return {"messages": [{"role": r, "content": t} for r, t in turns]}


def test_truncated_array_keeps_complete_records(tmp_path):
    good = [dict(conv(("human", "hi"), ("gpt", "hello")), id=f"r{i}") for i in range(2)]
    head = json.dumps(good)[:-1]  # two complete records, array not closed
    cut = head + ', {"id": "r2", "conversations": [{"from": "hu'
    f = tmp_path / "cut.json"
    f.write_text(cut)
    stats = pd.SourceStats(path=str(f))
    recs = list(pd.read_records(f, stats))
    assert [r["id"] for _, r in recs] == ["r0", "r1"]
    kept_end = len(head.encode())
    assert stats.truncated_at_byte == kept_end
    assert stats.bytes_lost == len(cut.encode()) - kept_end


def test_bundled_sharegpt_yields_17671_conversations():
    stats = pd.SourceStats(path="bundled")
    n = sum(1 for _ in pd.read_records(cf.bundled_sharegpt_path(), stats))
    assert n == 17671
    assert stats.truncated_at_byte is not None and stats.bytes_lost > 0


def test_jsonl_bad_line_is_counted(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps(conv(("user", "a"), ("assistant", "b"), key="messages")) + "\n{not json\n")
    stats = pd.SourceStats(path=str(f))
    assert len(list(pd.read_records(f, stats))) == 1
    assert stats.bad_lines == 1


@pytest.mark.parametrize(
    "content, message",
    [(b"", "empty"), (b"\xff\xfe\x00bad", "not UTF-8"), (b'"a string"', "expected a JSON array")],
)
def test_unreadable_files_name_the_file(tmp_path, content, message):
    f = tmp_path / "bad.json"
    f.write_bytes(content)
    with pytest.raises(pd.DataError, match=message) as e:
        list(pd.read_records(f, pd.SourceStats(path=str(f))))
    assert str(f) in str(e.value)


@pytest.mark.parametrize(
    "record, reason",
    [
        ([1, 2], "not_an_object"),
        ({"id": "x"}, "missing_key"),
        (conv(("alien", "hi"), ("gpt", "yo")), "unknown_role"),
        ({"conversations": [{"from": "human", "value": 3}, {"from": "gpt", "value": "x"}]}, "non_string_text"),
        (conv(("human", "  "), ("gpt", "x")), "empty_text"),
        (conv(("human", "a"), ("system", "s"), ("gpt", "b")), "system_not_first"),
        (conv(("human", "only a question")), "no_assistant_turn"),
    ],
)
def test_normalise_skips_are_counted(record, reason):
    c = pd.Counters()
    assert pd.normalise(record, "f.json", 0, c) is None
    assert c.skipped == {reason: 1}


@pytest.mark.parametrize(
    "record, reason, detail",
    [
        ([1, 2], "not_an_object", "the record is a JSON array, not an object with a turn list"),
        ("text", "not_an_object", "the record is a JSON string, not an object with a turn list"),
        (conv(("human", "  "), ("gpt", "x")), "empty_text", "turn 0 (human) value is blank (whitespace only)"),
        (conv(("user", ""), ("assistant", "x"), key="messages"), "empty_text", "turn 0 (user) content is empty"),
        (conv(("human", "a"), ("system", "s"), ("gpt", "b")), "system_not_first",
         "turn 1 is a system turn after a user turn; a system turn may only open the conversation"),
        (conv(("human", "q1"), ("human", "q2")), "no_assistant_turn",
         "no assistant turn to train on (the turns' roles: user)"),
        (conv(("human", "q"), ("tool", "r"), key="messages"), "tool_result_without_call",
         "a tool turn that follows no assistant tool call"),
    ],
)
def test_normalise_skips_say_why_in_words(record, reason, detail):
    """Every skip of the data report carries its reason in words (data_report.json's skip_examples)."""
    c = pd.Counters()
    assert pd.normalise(record, "f.json", 7, c) is None
    assert c.examples == {reason: [{"source": "f.json", "index": 7, "detail": detail}]}


def _answer_start_by_template(tok, question: str) -> int:
    """Where the answer to one user turn starts: the length of the render with the generation prompt."""
    return len(tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"])


def test_too_few_supervised_tokens_is_said_in_words(tmp_path, smol_target):
    """A conversation whose answer starts beyond data.max_seq_len is skipped with the numbers in words: the token
    its answer starts at (as the chat template renders it whole) and max_seq_len; a short answer, its count."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_target)
    long_q, cut_q = "word " * 100, "word " * 30
    f = tmp_path / "d.json"
    f.write_text(json.dumps([dict(conv(("human", "hi"), ("gpt", "Hello! How can I help you today, friend?")), id="ok"),
                             dict(conv(("human", long_q), ("gpt", "short answer here")), id="long"),
                             dict(conv(("human", cut_q), ("gpt", "a longer answer that the cut leaves in part")),
                                  id="cut"),
                             dict(conv(("human", "q"), ("gpt", "ok")), id="short")]))
    out = [tmp_path / n for n in ("train.st", "eval.st", "prompts.jsonl", "report.json")]
    rep = pd.prepare(prepare_settings([{"path": str(f), "max_samples": None}], smol_target, out, max_seq_len=64,
                                      min_supervised_tokens=8, eval_fraction=0.01, seed=0,
                                      require_eval=False, benchmark_sets=[]))
    long_start, cut_start = _answer_start_by_template(tok, long_q), _answer_start_by_template(tok, cut_q)
    assert long_start > 64 and 64 - 8 < cut_start < 64  # the cases the test means
    assert rep["skipped"] == {"too_few_supervised_tokens": 3} and rep["kept"] == 1
    assert [e["detail"] for e in rep["skip_examples"]["too_few_supervised_tokens"]] == [
        f"the supervised answer starts at token {long_start}, beyond data.max_seq_len 64: the cut keeps none of it",
        f"the supervised answer starts at token {cut_start} and data.max_seq_len is 64: the cut keeps "
        f"{64 - cut_start} of its tokens, fewer than data.min_supervised_tokens 8",
        "only 2 supervised (answer) tokens, fewer than data.min_supervised_tokens 8",
    ]
    assert json.loads(out[3].read_text())["skip_examples"] == rep["skip_examples"]


def test_normalise_fixes_order():
    c = pd.Counters()
    rec = conv(("gpt", "lead"), ("human", "q1"), ("human", "q2"), ("gpt", "a"), ("human", "trailing"))
    out = pd.normalise(rec, "f.json", 0, c)
    assert out.messages == [{"role": "user", "content": "q1\n\nq2"}, {"role": "assistant", "content": "a"}]
    assert c.fixed == {"fixed_leading_assistant": 1, "fixed_merged_turns": 1, "fixed_trailing_user": 1}


def test_chatml_mask_covers_assistant_text_and_end_token(smol_target):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_target)
    msgs = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "It is 4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "It is 6."},
    ]
    ids, mask = cm.tokenize_with_mask(tok, msgs, max_seq_len=1000)
    assert ids.dtype == np.int32 and mask.dtype == np.uint8 and len(ids) == len(mask)
    # Hand-checked: exactly the two answers, each with ChatML's end-of-turn token.
    assert tok.decode(ids[mask == 1]) == "It is 4.<|im_end|>It is 6.<|im_end|>"
    # The system prompt, user turns and "assistant\n" headers stay unsupervised.
    assert "What is 2+2?" in tok.decode(ids[mask == 0])
    # Truncation cuts ids and mask together.
    ids2, mask2 = cm.tokenize_with_mask(tok, msgs, max_seq_len=40)
    assert len(ids2) == 40 and np.array_equal(mask2, mask[:40])


def test_split_is_deterministic_and_per_sample():
    ids = [f"s{i}" for i in range(2000)]
    a = [pd.is_eval(i, 0, 0.1) for i in ids]
    assert a == [pd.is_eval(i, 0, 0.1) for i in ids]
    assert 150 < sum(a) < 250
    assert a != [pd.is_eval(i, 1, 0.1) for i in ids]


def test_prepare_writes_splits_and_report(tmp_path, smol_target, sharegpt_sample):
    out = {k: tmp_path / f for k, f in dict(train="train.safetensors", eval="eval.safetensors",
                                            prompts="prompts.jsonl", report="report.json").items()}
    # the default benchmark sets' prompts checked (chat, humaneval), eval samples required
    rep = pd.prepare(prepare_settings([{"path": str(sharegpt_sample), "max_samples": 40}], smol_target, out,
                                      max_seq_len=256, min_supervised_tokens=4, eval_fraction=0.25, seed=0))
    tr, ev = tk.read_tokens(out["train"]), tk.read_tokens(out["eval"])
    assert len(tr) + len(ev) == rep["kept"] == 40
    assert len(ev) == rep["eval_samples"] and len(ev) > 0
    assert not set(tr.sample_ids) & set(ev.sample_ids)
    for f in (tr, ev):
        assert f.offsets[-1] == len(f.input_ids) == len(f.loss_mask)
        assert (np.diff(f.offsets) <= 256).all()
    assert rep["tokens"]["max"] <= 256
    assert rep["hidden_state_bytes"]["per_token_bf16"] == 4 * 576 * 2
    prompts = [json.loads(x) for x in out["prompts"].read_text().splitlines()]
    assert prompts and all(p["messages"][-1]["role"] == "user" for p in prompts)
    # Benchmark set `chat`: held-out prompts only, none from a trained sample (record ids).
    from eagle3build import prompt_sets

    chat = prompt_sets.load_sets(["chat"], 1000, prompt_sets.Sources(eval_prompts=out["prompts"]))["chat"]
    assert [p["id"] for p in chat] == [p["id"] for p in prompts]
    assert {p["id"] for p in chat} <= set(ev.sample_ids) and not {p["id"] for p in chat} & set(tr.sample_ids)
    assert json.loads(out["report"].read_text())["kept"] == 40


def test_prefix_tokenization_equals_full_tokenization(smol_target, sharegpt_sample):
    """Tokenizing only a prefix of long conversations gives exactly the first max_seq_len tokens and mask bits."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_target)
    convs = [c for i, r in enumerate(json.loads(sharegpt_sample.read_text()))
             if (c := pd.normalise(r, "s", i, pd.Counters())) is not None]
    batch = pd.tokenize_batch(tok, [c.messages for c in convs], 64)
    n_truncated = 0
    for conv, (ids, mask, truncated) in zip(convs, batch, strict=True):
        full = tok.apply_chat_template(conv.messages, tokenize=False)
        enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
        assert ids.tolist() == enc["input_ids"][:64]
        starts = np.array([o[0] for o in enc["offset_mapping"][:64]])
        ref = np.zeros(len(starts), np.uint8)
        for s, e in cm.assistant_char_spans(tok, conv.messages, full):
            ref |= ((starts >= s) & (starts < e)).astype(np.uint8)
        assert mask.tolist() == ref.tolist()
        assert truncated == (len(enc["input_ids"]) > 64)
        n_truncated += truncated
    assert n_truncated > len(convs) // 2


def test_template_that_raises_is_a_counted_skip(tmp_path, smol_target, sharegpt_sample):
    """A chat template that raises on a system turn (as many do) skips that record, counted with the
    template's message in the data report; the other records of the batch are kept."""
    from transformers import AutoTokenizer

    target = tmp_path / "target"
    target.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (smol_target / f).exists():
            shutil.copy(smol_target / f, target / f)
    tok = AutoTokenizer.from_pretrained(smol_target)
    refuse = ("{%- for m in messages %}{%- if m['role'] == 'system' %}"
              "{{ raise_exception('System role not supported') }}{%- endif %}{%- endfor %}")
    tok.chat_template = refuse + tok.chat_template
    tok.save_pretrained(target)
    recs = json.loads(sharegpt_sample.read_text())[:12]
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(recs))
    out = {k: tmp_path / f for k, f in dict(train="train.safetensors", eval="eval.safetensors",
                                            prompts="prompts.jsonl", report="report.json").items()}

    def run(path, tgt):
        rep = pd.prepare(prepare_settings([{"path": str(path), "max_samples": None}], tgt, out, max_seq_len=128,
                                          min_supervised_tokens=1, eval_fraction=0.25, seed=0,
                                          require_eval=False, benchmark_sets=[]))
        return rep, set(tk.read_tokens(out["train"]).sample_ids) | set(tk.read_tokens(out["eval"]).sample_ids)

    base, base_ids = run(plain, smol_target)
    with_system = [i for i, r in enumerate(recs) if str(r.get("id")) in base_ids][1:3]  # two records kept normally
    for i in with_system:
        recs[i]["conversations"] = [{"from": "system", "value": "Be brief."}] + recs[i]["conversations"]
    data = tmp_path / "data.json"
    data.write_text(json.dumps(recs))
    rep, ids = run(data, target)
    assert rep["skipped"].get("template_error") == 2
    assert ids == base_ids - {str(recs[i]["id"]) for i in with_system}
    written = json.loads(out["report"].read_text())
    ex = written["skip_examples"]["template_error"]
    assert sorted(e["index"] for e in ex) == sorted(with_system)
    assert all("System role not supported" in e["detail"] for e in ex)


def test_equal_tokens_are_equal_bytes(tmp_path):
    """Written five times, the same samples give one file content (safetensors' own writer orders the
    metadata keys at random: Snakemake's checksum of a small input would then replan the shards), and
    it reads back."""
    import numpy as np

    samples = [(f"rec_{i}", np.arange(5 + i, dtype=np.int32), np.ones(5 + i, dtype=np.uint8)) for i in range(4)]
    contents = set()
    for k in range(5):
        tk.write_tokens(tmp_path / f"t{k}.safetensors", samples)
        contents.add((tmp_path / f"t{k}.safetensors").read_bytes())
    assert len(contents) == 1
    back = tk.read_tokens(tmp_path / "t0.safetensors")
    assert back.sample_ids == [s[0] for s in samples]
    ids, mask = back.sample(3)
    assert ids.tolist() == list(range(8)) and mask.tolist() == [1] * 8


@pytest.mark.parametrize("cap", [None, 23])
def test_workers_write_the_same_bytes_and_report(tmp_path, smol_target, sharegpt_sample, cap):
    """Tokenizing in 2 worker processes (a job of 3 threads) writes the files and the report of one process, byte for
    byte (less the report's seconds): the same records read, kept, skipped and counted, in the same order, from a
    capped source (the cap reached mid-batch), a repeated record, a JSONL source with a bad line and a JSON array cut
    off mid-record. The reference is one batch at a time (none tokenized ahead), as the stage ran before its pool."""
    recs = json.loads(sharegpt_sample.read_text())
    jsonl = tmp_path / "more.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in recs[:30]) + "{not json\n"
                     + json.dumps(recs[40]) + "\n")  # 30 repeats of the first source, a bad line, one more
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(recs[30:60])[:-200])  # the last record cut off mid-way
    sources = [{"path": str(sharegpt_sample), "max_samples": cap}, {"path": str(jsonl), "max_samples": None},
               {"path": str(cut), "max_samples": None}]
    pd.TOKENIZE_BATCH, batch = 8, pd.TOKENIZE_BATCH  # many batches of a few records: the cap falls inside one
    ahead = pd.IN_FLIGHT_PER_WORKER
    try:
        files = {}
        for workers, pd.IN_FLIGHT_PER_WORKER in ((0, 0), (1, ahead), (3, ahead)):  # 3 threads: 2 processes
            out = {k: tmp_path / f"w{workers}" / f for k, f in dict(
                train="train.safetensors", eval="eval.safetensors", prompts="prompts.jsonl",
                report="report.json").items()}
            out["train"].parent.mkdir()
            pd.prepare(prepare_settings(sources, smol_target, out, max_seq_len=96, min_supervised_tokens=24,
                                        eval_fraction=0.25, seed=0, workers=max(1, workers)))
            files[workers] = {k: p.read_bytes() for k, p in out.items() if k != "report"}
            report = json.loads(out["report"].read_text())
            assert report.pop("seconds") >= 0
            files[workers]["report"] = report
    finally:
        pd.TOKENIZE_BATCH, pd.IN_FLIGHT_PER_WORKER = batch, ahead
    assert files[0] == files[1] == files[3]
    assert [pd.pool_processes(n) for n in (1, 2, 3, 16)] == [1, 1, 2, 15]
    rep = files[1]["report"]
    assert rep["sources"][0]["kept"] == (cap or rep["sources"][0]["kept"]) and rep["sources"][1]["bad_lines"] == 1
    assert rep["sources"][2]["truncated_at_byte"] is not None
    assert rep["skipped"]["duplicate_conversation"] >= 1 and rep["skipped"]["too_few_supervised_tokens"] > 0
