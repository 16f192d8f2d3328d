"""Issue 38: the data users actually have. OpenAI content parts and the developer role, lone
surrogates, and the files people export (gzip, Parquet and JSON of Hugging Face ``datasets``, one
JSON document holding the records): read with the per-record salvage and counts of plain JSON."""
from __future__ import annotations

import gzip
import json

import pytest
from conftest import prepare_settings

from eagle3build.data import prepare_data as pd
from eagle3build.formats import conversation_files as cf
from eagle3build.formats import conversations as cv
from eagle3build.formats import tokens as tk


def parts(*texts, kind="text"):
    return [{"type": kind, "text": t} for t in texts]


def oai(*turns, **extra):
    return {"messages": [{"role": r, "content": c} for r, c in turns], **extra}


def norm(record):
    c = cv.Counters()
    return cv.normalise(record, "f.jsonl", 7, c), c


def test_text_parts_are_joined_on_user_and_assistant_turns():
    out, c = norm(oai(("user", parts("What is", "2+2?")), ("assistant", parts("It is 4."))))
    assert out.messages == [{"role": "user", "content": "What is\n2+2?"}, {"role": "assistant", "content": "It is 4."}]
    assert not c.skipped


def test_plain_string_parts_are_text_parts():
    """vLLM's chat parser takes a plain string in a content list as a text part; so does the data."""
    out, c = norm(oai(("user", ["What is", {"type": "text", "text": "2+2?"}]), ("assistant", ["It is 4."])))
    assert [m["content"] for m in out.messages] == ["What is\n2+2?", "It is 4."] and not c.skipped


def test_parquet_style_parts_with_null_fields_are_text():
    p = [{"type": "text", "text": "hi", "image_url": None}]
    out, _ = norm(oai(("user", p), ("assistant", "hello")))
    assert out.messages[0]["content"] == "hi"


@pytest.mark.parametrize("part", [{"type": "image_url", "image_url": {"url": "data:..."}},
                                  {"type": "input_audio", "input_audio": {"data": "..."}}])
def test_image_and_audio_parts_are_refused_by_name(part):
    out, c = norm(oai(("user", [{"type": "text", "text": "look"}, part]), ("assistant", "a cat")))
    assert out is None and c.skipped == {"non_text_part": 1}
    ex = c.examples["non_text_part"][0]
    assert ex["index"] == 7 and part["type"] in ex["detail"] and "turn 0" in ex["detail"]


def test_non_string_text_names_the_turn_and_type():
    out, c = norm(oai(("user", "q"), ("assistant", 42)))
    assert out is None and c.skipped == {"non_string_text": 1}
    assert "turn 1" in c.examples["non_string_text"][0]["detail"] and "int" in c.examples["non_string_text"][0]["detail"]


def test_developer_role_is_the_system_turn():
    out, c = norm(oai(("developer", "Be brief."), ("user", "q"), ("assistant", "a")))
    assert [m["role"] for m in out.messages] == ["system", "user", "assistant"] and not c.skipped


@pytest.mark.parametrize("where", ["content", "id", "tool"])
def test_lone_surrogate_is_a_counted_skip_naming_the_field(where):
    rec = oai(("user", "q"), ("assistant", "bad \ud800 text" if where == "content" else "fine"))
    if where == "id":
        rec["id"] = "x\udfff"
    if where == "tool":
        rec["tools"] = [{"type": "function", "function": {"name": "f\ud83d"}}]
    out, c = norm(rec)
    assert out is None and c.skipped == {"bad_unicode": 1}
    detail = c.examples["bad_unicode"][0]["detail"]
    assert "surrogate" in detail and {"content": "messages[1].content", "id": "id", "tool": "tools[0]"}[where] in detail


# ---------------------------------------------------------------- files

RECS = [dict(oai(("user", f"question {i}"), ("assistant", f"answer {i}")), id=f"r{i}") for i in range(5)]


def read(path):
    stats = cf.SourceStats(path=str(path))
    return [r for _, r in cf.read_records(path, stats)], stats


def test_jsonl_gz(tmp_path):
    f = tmp_path / "d.jsonl.gz"
    f.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in RECS).encode()))
    recs, stats = read(f)
    assert recs == RECS and stats.compression == "gzip" and stats.format == "jsonl"


def test_cut_gzip_keeps_complete_lines(tmp_path):
    f = tmp_path / "d.jsonl.gz"
    body = "".join(json.dumps(r) + "\n" for r in RECS * 200).encode()
    f.write_bytes(gzip.compress(body)[:-600])
    recs, stats = read(f)
    assert 0 < len(recs) < 1000 and stats.compressed_stream_cut and stats.bad_lines <= 1


@pytest.mark.parametrize("doc", [{"data": RECS}, {"version": 2, "data": RECS}, {"rows": RECS}])
def test_one_document_holding_the_records(tmp_path, doc):
    f = tmp_path / "d.json"
    f.write_text(json.dumps(doc, indent=2))
    recs, stats = read(f)
    assert recs == RECS and stats.format == "json_object" and stats.bad_lines == 0


def test_one_pretty_printed_record(tmp_path):
    f = tmp_path / "d.json"
    f.write_text(json.dumps(RECS[0], indent=2))
    assert read(f)[0] == [RECS[0]]


def test_cut_document_under_a_key_keeps_complete_records(tmp_path):
    f = tmp_path / "d.json"
    f.write_text(json.dumps({"data": RECS}, indent=2)[:-80])
    recs, stats = read(f)
    assert recs == RECS[:4] and stats.bytes_lost > 0 and stats.bad_lines == 0


def test_object_without_records_is_refused(tmp_path):
    f = tmp_path / "d.json"
    f.write_text(json.dumps({"a": 1, "b": [1], "c": [2]}))
    with pytest.raises(cf.DataError, match="no single list of records") as e:
        read(f)
    assert str(f) in str(e.value)


def test_datasets_exports(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [dict(oai(("system", parts("s")), ("user", parts("q", str(i))), ("assistant", parts("a"))), id=f"r{i}")
            for i in range(50)]
    ds = datasets.Dataset.from_list(rows)
    for name, write in (("d.parquet", ds.to_parquet), ("d.jsonl", ds.to_json), ("d.json.gz", None)):
        f = tmp_path / name
        if write is None:
            ds.to_json(f, compression="gzip")
        else:
            write(f)
        recs, stats = read(f)
        assert len(recs) == 50 and stats.bad_lines == 0, name
        convs = [cv.normalise(r, name, i, cv.Counters()) for i, r in enumerate(recs)]
        assert [c.messages[1]["content"] for c in convs] == [f"q\n{i}" for i in range(50)], name
    assert read(tmp_path / "d.parquet")[1].format == "parquet"


def test_damaged_parquet_row_group_is_counted(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    f = tmp_path / "d.parquet"
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": "q" * 50 + str(i)},
                                          {"role": "assistant", "content": "a"}]} for i in range(40)]
    pq.write_table(pa.Table.from_pylist(rows), f, row_group_size=10, compression="NONE")
    meta = pq.ParquetFile(f).metadata.row_group(1)
    off = meta.column(1).data_page_offset if meta.column(1).dictionary_page_offset is None else \
        meta.column(1).dictionary_page_offset
    raw = bytearray(f.read_bytes())
    raw[off:off + 40] = b"\xff" * 40  # corrupt row group 1's page header
    f.write_bytes(bytes(raw))
    recs, stats = read(f)
    assert stats.records_lost == 10 and len(recs) == 30 and [r["id"] for r in recs][10] == "r20"


# characters a JSON string may hold unescaped that str.splitlines() takes for line ends
LINE_BREAKERS = "\u2028\u2029\x85\x0b\x0c\x1c\x1d\x1e"


def test_jsonl_lines_end_at_newline_only(tmp_path):
    """JSONL written with ensure_ascii=False (regenerate_responses' own output, many scrapers) holds U+2028,
    U+0085 ... raw inside strings: each record is one line still, not two bad lines."""
    recs = [dict(oai(("user", f"q{i}{LINE_BREAKERS}"), ("assistant", f"a{LINE_BREAKERS}{i}")), id=f"r{i}")
            for i in range(3)]
    f = tmp_path / "d.jsonl"
    f.write_bytes("".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in recs).encode())
    got, stats = read(f)
    assert got == recs and stats.bad_lines == 0 and stats.format == "jsonl"


@pytest.mark.parametrize("form", ["jsonl", "array", "jsonl.gz"])
def test_a_byte_that_is_not_utf8_skips_its_record_only(tmp_path, form):
    """One stray Latin-1 byte (0xe9) in one record: that record is a counted skip naming the field and
    the byte, the others are read (the file was refused whole)."""
    recs = [dict(oai(("user", f"q{i}"), ("assistant", f"caf-{i}")), id=f"r{i}") for i in range(4)]
    body = "".join(json.dumps(r) + "\n" for r in recs) if form != "array" else json.dumps(recs)
    raw = body.encode().replace(b"caf-2", b"caf\xe92")
    f = tmp_path / f"d.{form}"
    f.write_bytes(gzip.compress(raw) if form.endswith(".gz") else raw)
    got, stats = read(f)
    assert [r["id"] for r in got] == ["r0", "r1", "r2", "r3"] and stats.bad_lines == 0 and stats.bytes_lost == 0
    assert stats.bad_utf8_bytes == 1 and stats.first_bad_utf8_byte == raw.index(b"\xe9")
    c = cv.Counters()
    kept = [cv.normalise(r, str(f), i, c) for i, r in enumerate(got)]
    assert [k.id for k in kept if k] == ["r0", "r1", "r3"] and c.skipped == {"bad_unicode": 1}
    ex = c.examples["bad_unicode"][0]
    assert ex["index"] == 2 and ex["detail"].startswith("messages[1].content: byte 0xe9 of the file is not UTF-8")


@pytest.mark.parametrize("content, message", [
    ("[]".encode("utf-16"), "UTF-16 text"),
    (b"\xe9[{}]", r"not UTF-8 text \(bad byte at offset 0\)"),
    (b"  \n\x93{}", r"not UTF-8 text \(bad byte at offset 3\)"),
])
def test_a_file_that_is_not_utf8_text_is_refused(tmp_path, content, message):
    f = tmp_path / "d.json"
    f.write_bytes(content)
    with pytest.raises(cf.DataError, match=message) as e:
        read(f)
    assert str(f) in str(e.value)


def test_jsonl_zst(tmp_path):
    """zstd (.jsonl.zst, common on the Hugging Face Hub), read by pyarrow's codec; a stream cut short
    keeps the complete lines before the cut."""
    pa = pytest.importorskip("pyarrow")
    body = "".join(json.dumps(r) + "\n" for r in RECS).encode()
    f = tmp_path / "d.jsonl.zst"
    with pa.output_stream(str(f), compression="zstd") as out:
        out.write(body)
    got, stats = read(f)
    assert got == RECS and stats.compression == "zstd" and stats.format == "jsonl" and not stats.compressed_stream_cut
    big = "".join(json.dumps(r) + "\n" for r in RECS * 40_000).encode()  # 5 MiB: several decompressed chunks
    with pa.output_stream(str(f), compression="zstd") as out:
        out.write(big)
    f.write_bytes(f.read_bytes()[:-2000])
    got, stats = read(f)
    assert stats.compressed_stream_cut and 0 < len(got) < 200_000 and got == (RECS * 40_000)[:len(got)]
    assert stats.bad_lines <= 1


def test_parquet_struct_nulls_are_absent_keys(tmp_path):
    """Arrow gives every row of a struct column the union of the rows' keys, null where a row had none: the
    tools and call arguments read back are the record's own, not padded with the other records' names."""
    datasets = pytest.importorskip("datasets")

    def tool(name, *args):
        return {"type": "function", "function": {"name": name, "parameters": {
            "type": "object", "properties": {a: {"type": "string"} for a in args}, "required": list(args)}}}

    def call(name, **args):
        return {"messages": [{"role": "user", "content": "do it"},
                             {"role": "assistant", "content": None,
                              "tool_calls": [{"id": "c", "type": "function", "function": {"name": name, "arguments": args}}]},
                             {"role": "tool", "content": "done", "tool_call_id": "c"},
                             {"role": "assistant", "content": "Done."}]}

    rows = [dict(call("weather", city="Paris"), id="a", tools=[tool("weather", "city")]),
            dict(call("mail", to="x", body="y"), id="b", tools=[tool("mail", "to", "body")])]
    f = tmp_path / "d.parquet"
    datasets.Dataset.from_list(rows).to_parquet(f)
    got, stats = read(f)
    assert stats.format == "parquet" and [r["id"] for r in got] == ["a", "b"]
    convs = [cv.normalise(r, str(f), i, cv.Counters()) for i, r in enumerate(got)]
    assert [c.tools for c in convs] == [rows[0]["tools"], rows[1]["tools"]]
    assert [c.messages[1]["tool_calls"][0]["function"]["arguments"] for c in convs] == [{"city": "Paris"},
                                                                                        {"to": "x", "body": "y"}]
    assert "tool_call_id" not in convs[0].messages[0] and convs[0].messages[2]["tool_call_id"] == "c"


def test_prompts_file_takes_content_parts_and_developer(tmp_path):
    """Benchmark prompts (data.prompts_file) in the same forms as training data: content parts joined,
    developer = system, a raw U+2028 inside a line; an image part is refused naming the line and type."""
    from eagle3build import prompt_sets

    f = tmp_path / "p.jsonl"
    lines = [{"id": "a", "messages": [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                                      {"role": "user", "content": [{"type": "text", "text": "Hi"}, "there\u2028now"]}]},
             {"id": "b", "prompt": "Plain."}]
    f.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    assert prompt_sets.read_prompts(f) == [
        {"id": "a", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi\nthere\u2028now"}]},
        {"id": "b", "messages": [{"role": "user", "content": "Plain."}]}]
    f.write_text(json.dumps(lines[1]) + "\n" + json.dumps(
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}) + "\n")
    with pytest.raises(prompt_sets.PromptSetError, match=r"p.jsonl: line 2: message 0 content: content part 0 has "
                                                         r"type 'image_url'"):
        prompt_sets.read_prompts(f)


def test_not_a_data_file_names_the_file(tmp_path):
    f = tmp_path / "d.json.gz"
    f.write_bytes(b"\x1f\x8b" + b"\x00" * 20)
    with pytest.raises(cf.DataError, match="gzip data cannot be decompressed") as e:
        read(f)
    assert str(f) in str(e.value)


def test_prepare_trains_content_parts_and_skips_surrogates(tmp_path, smol_target):
    """A dataset written entirely as OpenAI content parts (gzipped JSONL) trains; a lone surrogate and a byte
    that is not UTF-8 are each one counted skip naming the record, not a UnicodeEncodeError or a refused
    file; a raw U+2028 (ensure_ascii=False) is text."""
    recs = [oai(("developer", "Be helpful."), ("user", parts(f"Tell me about topic {i}.")),
                ("assistant", parts(f"Topic {i} is a fine topic with much to say about it.")), id=f"p{i}")
            for i in range(12)]
    recs[3]["messages"][2]["content"][0]["text"] = "broken \ud800 answer that is long enough"
    recs[5]["messages"][2]["content"][0]["text"] = "Topic 5\u2028spans two lines, and that is fine."
    # ensure_ascii=False writes U+2028 raw; record 3 keeps its "\ud800" escape (ensure_ascii=True)
    body = "".join(json.dumps(r, ensure_ascii=i == 3) + "\n" for i, r in enumerate(recs)).encode()
    body = body.replace(b"Topic 8 is a", b"Topic 8 \xe9s a")
    f = tmp_path / "parts.jsonl.gz"
    f.write_bytes(gzip.compress(body))
    out = [tmp_path / n for n in ("train.st", "eval.st", "prompts.jsonl", "report.json")]
    rep = pd.prepare(prepare_settings([{"path": str(f), "max_samples": None}], smol_target, out, max_seq_len=256,
                                      min_supervised_tokens=4, eval_fraction=0.2, seed=0,
                                      require_eval=False, benchmark_sets=[]))
    assert rep["kept"] == 10 and rep["skipped"] == {"bad_unicode": 2}
    assert [e["index"] for e in rep["skip_examples"]["bad_unicode"]] == [3, 8]
    src = rep["sources"][0]
    assert src["compression"] == "gzip" and src["bad_utf8_bytes"] == 1 and src["bad_lines"] == 0
    data = json.loads(out[3].read_text())
    assert data["kept"] == 10
    ids = tk.read_tokens(out[0]).sample_ids + tk.read_tokens(out[1]).sample_ids
    assert sorted(ids) == sorted(f"p{i}" for i in range(12) if i not in (3, 8))


def test_prepare_checks_every_benchmark_prompt_against_the_template(tmp_path, smol_target, sharegpt_sample):
    """Issue 38.5: where the prompt files are written (prepare_data, before any GPU stage), every prompt of the
    configured benchmark sets is rendered with the target's template: a refused one is a counted skip naming the
    prompt, a set refused whole stops the stage there."""
    from test_benchmark_unit import refusing_target

    from eagle3build import prompt_sets

    target = refusing_target(smol_target, tmp_path / "refusing")
    pf = tmp_path / "mine.jsonl"
    pf.write_text(json.dumps({"id": "plain", "prompt": "Hi"}) + "\n" + json.dumps(
        {"id": "sys", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}) + "\n")
    out = [tmp_path / n for n in ("train.st", "eval.st", "prompts.jsonl", "report.json")]

    def run():
        return pd.prepare(prepare_settings([{"path": str(sharegpt_sample), "max_samples": 20}], target, out,
                                           max_seq_len=128, min_supervised_tokens=1, eval_fraction=0.25, seed=0,
                                           benchmark_sets=["chat", "humaneval", "custom"], prompts_file=str(pf)))

    rep = run()
    check = rep["benchmark_prompt_check"]
    assert check["custom"] == {"prompts": 2, "refused": 1, "examples": [
        {"id": "sys", "detail": "TemplateError: System role not supported"}]}
    assert check["humaneval"] == {"prompts": 164, "refused": 0, "examples": []}
    assert check["chat"]["refused"] == 0 and check["chat"]["prompts"] == rep["benchmark_prompts"] > 0
    assert json.loads(out[3].read_text())["benchmark_prompt_check"] == check
    pf.write_text(pf.read_text().splitlines()[1] + "\n")
    out[3].unlink()
    with pytest.raises(prompt_sets.PromptSetError, match=r"'custom'.*refuses all 1 prompts \(prompt sys: "):
        run()
    assert not out[3].exists()


def test_exported_files_are_inputs_of_prepare_data(tmp_path):
    """A Parquet or .jsonl.gz source is a file input of prepare_data like a JSONL one: planning names it when it
    is missing, and an edit replans the stage (Snakemake's mtime and checksum triggers on inputs)."""
    from smk import run, write_config

    srcs = [{"path": str(tmp_path / "chats.parquet"), "max_samples": None},
            {"path": str(tmp_path / "more.jsonl.gz"), "max_samples": None}]
    cfg = write_config(tmp_path / "c.yaml", data={"sources": srcs})
    p = run(["-n", "results/default/data/data_report.json", "--configfile", str(cfg)], tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "MissingInputException" in out and "chats.parquet" in out and "more.jsonl.gz" in out


def test_prepare_refuses_an_empty_chat_set_before_any_gpu_stage(tmp_path, smol_target):
    """Issue 38.5: a chat set left without a prompt (every eval conversation opens as a train one does) stops
    prepare_data, naming the counts, not the benchmark after capture and training; nothing is written."""
    src = tmp_path / "same_opening.jsonl"
    src.write_text("".join(json.dumps(oai(("user", "Hi"), ("assistant", f"Hello number {i}, how can I help?"),
                                          id=f"r{i}")) + "\n" for i in range(12)))
    out = [tmp_path / n for n in ("train.st", "eval.st", "prompts.jsonl", "report.json")]

    def run(sets):
        return pd.prepare(prepare_settings([{"path": str(src), "max_samples": None}], smol_target, out, max_seq_len=128,
                                           min_supervised_tokens=1, eval_fraction=0.5, seed=0, benchmark_sets=sets))

    from eagle3build import prompt_sets

    evals = sum(pd.is_eval(f"r{i}", 0, 0.5) for i in range(12))
    assert 0 < evals < 12
    with pytest.raises(prompt_sets.PromptSetError, match=rf"benchmark set 'chat' would be empty: of the {evals} "
                                                         rf"eval-split conversations of \['{src}'\], {evals} open with a "
                                                         rf"user turn and {evals} of those open a train conversation"):
        run(["chat", "humaneval"])
    assert not any(p.exists() for p in out)
    rep = run(["humaneval"])  # no chat set: nothing to refuse
    assert rep["benchmark_prompts"] == 0 and rep["benchmark_prompts_seen_in_train"] == evals
    assert out[2].read_text() == ""
