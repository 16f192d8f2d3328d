"""Real conversation data (issue 22): tool calls, reasoning, records without ids, repeats across splits,
byte-order marks, generation markers, token ids beyond the model, regenerated answers kept as tokens.
Each case is a small file written here, run through prepare_data with the SmolLM2 tokenizer and a template
of the family that needs it."""
from __future__ import annotations

import json
import shutil

import pytest
from conftest import prepare_settings
from test_templates import supervised as _supervised_text  # the supervised runs, decoded

from eagle3build.data import chat_masking as cm
from eagle3build.data import prepare_data as pd
from eagle3build.data import regenerate_responses as rr
from eagle3build.formats import conversations as cv
from eagle3build.formats import tokens as tk

# A Hermes/Qwen2.5-style ChatML template in miniature: tools in the system turn, tool calls as
# <tool_call> JSON, tool results as a user turn wrapped in <tool_response>, reasoning_content as a
# think block.
TOOLS_TEMPLATE = (
    "{%- if tools or messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- endif %}"
    "{%- if tools %}{{- '\\n# Tools' }}{%- for t in tools %}{{- '\\n' + t | tojson }}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if m.reasoning_content %}{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- m['content'] or '' }}"
    "{%- for c in m.tool_calls or [] %}{{- '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' }}"
    "{{- c.function.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif m['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif m['role'] != 'system' %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def _target(tmp_path, tiny_target, template=None, vocab_size=None):
    """The tiny target's config and tokenizer with another chat template (and vocab size)."""
    d = tmp_path / "target"
    d.mkdir()
    for f in tiny_target.iterdir():
        if f.suffix in (".json", ".jinja") and f.name != "config.json":
            shutil.copy(f, d / f.name)
    cfg = json.loads((tiny_target / "config.json").read_text())
    if vocab_size:
        cfg["vocab_size"] = vocab_size
    (d / "config.json").write_text(json.dumps(cfg))
    if template is not None:
        (d / "chat_template.jinja").write_text(template)
    return d


def _prepare(tmp_path, target, records, name="d.jsonl", raw=None, **kw):
    f = tmp_path / name
    if raw is not None:
        f.write_bytes(raw)
    else:
        f.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = [tmp_path / n for n in ("train.st", "eval.st", "prompts.jsonl", "report.json")]
    # no benchmark prompts checked, an empty eval split allowed, unless the test says
    args = dict(max_seq_len=512, min_supervised_tokens=2, eval_fraction=0.01, seed=0, require_eval=False,
                benchmark_sets=[]) | kw
    rep = pd.prepare(prepare_settings([{"path": str(f), "max_samples": None}], target, out, **args))
    return rep, out


def _samples(path):
    t = tk.read_tokens(path)
    return {sid: t.sample(i) for i, sid in enumerate(t.sample_ids)}


def _tok(target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target)


TOOL_CONVS = [
    # 1. OpenAI chat form: a call with null content, its result, the answer
    {"id": "t1", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"},
        {"role": "assistant", "content": "It is sunny in Paris."}]},
    # 2. the same with empty content and arguments as an object, two parallel calls and two results
    {"id": "t2", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Rome and Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "hot"}, {"role": "tool", "content": "cold"},
        {"role": "assistant", "content": "Rome is hot, Oslo is cold."}]},
    # 3. a conversation that ends on the call (the assistant's last act)
    {"id": "t3", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Lima?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Lima"}}}]}]},
    # 4. ShareGPT with function_call / observation and tools as a JSON string
    {"id": "t4", "tools": json.dumps([WEATHER]), "conversations": [
        {"from": "human", "value": "Weather in Bern?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Bern"}})},
        {"from": "observation", "value": "snow"},
        {"from": "gpt", "value": "It snows in Bern."}]},
    # 5. ShareGPT with gpt + tool turns: a call then a result
    {"id": "t5", "tools": [WEATHER], "conversations": [
        {"from": "human", "value": "Weather in Kyiv?"},
        {"from": "function_call", "value": "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Kyiv\\\"}\"}"},
        {"from": "tool", "value": "rain"},
        {"from": "gpt", "value": "Rain in Kyiv."}]},
    # 6. text before the call in the same assistant turn (ShareGPT gpt then function_call: merged)
    {"id": "t6", "tools": [WEATHER], "conversations": [
        {"from": "human", "value": "Weather in Cairo?"},
        {"from": "gpt", "value": "Checking."},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Cairo"}})},
        {"from": "observation", "value": "dry"},
        {"from": "gpt", "value": "Dry in Cairo."}]},
]


def test_tool_calls_are_kept_rendered_and_supervised_never_the_results(tmp_path, tiny_target):
    target = _target(tmp_path, tiny_target, TOOLS_TEMPLATE)
    rep, out = _prepare(tmp_path, target, TOOL_CONVS)
    assert rep["kept"] == 6 and rep["skipped_total"] == 0, rep["skipped"]
    assert rep["tools"] == {"conversations_with_tools": 6, "tool_call_turns": 6, "tool_result_turns": 6}
    tok = _tok(target)
    got = {**_samples(out[0]), **_samples(out[1])}
    runs = _supervised_text(tok, *got["t1"])
    assert runs == ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
                    "It is sunny in Paris.<|im_end|>"]
    assert "get_weather" in tok.decode(got["t1"][0])  # the tools block is in the context
    for sid, (ids, mask) in got.items():
        text = " ".join(_supervised_text(tok, ids, mask))
        assert "tool_response" not in text and "Weather in" not in text, sid  # results and users: context only
        assert "get_weather" in text, sid  # every call is trained
    assert _supervised_text(tok, *got["t6"])[0].startswith("Checking.<tool_call>")
    assert _supervised_text(tok, *got["t2"])[0].count("<tool_call>") == 2


def test_a_template_that_drops_tool_calls_is_named(tmp_path, tiny_target):
    """SmolLM2's own ChatML template renders no tool calls: such records are skipped with the reason."""
    named = {"id": "named", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Use get_weather for Paris"},  # the name in the user's text is no call
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "get_weather", "arguments": {}}}]},
        {"role": "tool", "content": "get_weather: sunny"}, {"role": "assistant", "content": "Sunny it is."}]}
    rep, _ = _prepare(tmp_path, _target(tmp_path, tiny_target), TOOL_CONVS[:2] + [named] + [
        {"messages": [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi, how are you"}]}])
    assert rep["kept"] == 1 and rep["skipped"] == {"template_drops_tool_calls": 3}


def test_tool_result_without_a_call_is_skipped():
    c = cv.Counters()
    assert cv.normalise({"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "x"},
                                      {"role": "assistant", "content": "b"}]}, "f", 0, c) is None
    assert c.skipped == {"tool_result_without_call": 1}


REASONING = [
    {"id": "q1", "messages": [{"role": "user", "content": "What is 2+2?"},
                              {"role": "assistant", "content": "4.", "reasoning_content": "Two plus two makes four."}]},
    {"id": "q2", "messages": [{"role": "user", "content": "And 3+3?"},
                              {"role": "assistant", "content": "6.", "reasoning": "Three and three are six."}]},
]


@pytest.mark.parametrize("setting", ["keep", "drop"])
def test_reasoning_reaches_the_template_and_the_mask(tmp_path, tiny_target, setting):
    target = _target(tmp_path, tiny_target, TOOLS_TEMPLATE)
    rep, out = _prepare(tmp_path, target, REASONING, reasoning=setting)
    tok = _tok(target)
    got = {**_samples(out[0]), **_samples(out[1])}
    runs = _supervised_text(tok, *got["q1"])
    if setting == "keep":
        assert runs == ["<think>\nTwo plus two makes four.\n</think>\n\n4.<|im_end|>"]
        assert "Three and three are six" in _supervised_text(tok, *got["q2"])[0]  # the `reasoning` spelling too
        assert rep["reasoning"] == {"template_field": "reasoning_content", "setting": "keep", "turns": 2,
                                    "turns_rendered": 2}
    else:
        assert runs == ["4.<|im_end|>"]
        assert rep["reasoning"] == {"template_field": None, "setting": "drop", "turns": 2, "turns_rendered": 0}


def test_reasoning_key_follows_the_template(base_tokenizer_copy):
    tok = base_tokenizer_copy
    assert cm.reasoning_key(tok) is None  # SmolLM2's ChatML reads none
    tok.chat_template = TOOLS_TEMPLATE
    assert cm.reasoning_key(tok) == "reasoning_content"
    tok.chat_template = "{% for m in messages %}{{ m['thinking'] }}{{ m.content }}{% endfor %}"
    assert cm.reasoning_key(tok) == "thinking"


@pytest.fixture
def base_tokenizer_copy(tiny_target):
    return _tok(tiny_target)


def test_records_without_ids_are_named_by_content_and_spread_over_both_splits(tmp_path, tiny_target):
    recs = [{"id": None if i % 2 else "", "messages": [{"role": "user", "content": f"question number {i}"},
                                                       {"role": "assistant", "content": f"the answer is {i}"}]}
            for i in range(40)]
    recs += [{"messages": [{"role": "user", "content": "no id key"}, {"role": "assistant", "content": "fine then"}]}]
    target = _target(tmp_path, tiny_target)
    rep, out = _prepare(tmp_path, target, recs, eval_fraction=0.25)
    train, evals = tk.read_tokens(out[0]).sample_ids, tk.read_tokens(out[1]).sample_ids
    assert len(train) + len(evals) == 41 and len(evals) >= 4 and len(train) >= 20
    assert all(s.startswith("sha256:") for s in train + evals) and len(set(train + evals)) == 41
    (tmp_path / "again").mkdir()
    _, out2 = _prepare(tmp_path / "again", target, recs, eval_fraction=0.25)
    assert tk.read_tokens(out2[1]).sample_ids == evals  # stable: the same content, the same id, the same split


def test_an_empty_eval_split_is_refused_before_capture(tmp_path, tiny_target):
    recs = [{"id": "only", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "an answer"}]}]
    with pytest.raises(pd.DataError, match=r"eval split of .* is empty \(1 train samples at data.eval_fraction 0.01\)"):
        _prepare(tmp_path, _target(tmp_path, tiny_target), recs, require_eval=True)


def test_repeated_conversations_are_dropped_before_the_split(tmp_path, tiny_target):
    """Copies (spacing aside) under other ids would land in both splits: only the first is kept, and no eval
    prompt is a train conversation's opening."""
    base = [{"role": "user", "content": "Name a   prime."}, {"role": "assistant", "content": "Seven is prime."}]
    recs = [{"id": f"dup{i}", "messages": [dict(m, content=m["content"] + " " * (i % 3)) for m in base]} for i in range(30)]
    recs += [{"id": f"u{i}", "messages": [{"role": "user", "content": f"Count to {i}"},
                                          {"role": "assistant", "content": " ".join(map(str, range(i + 2)))}]}
             for i in range(30)]
    # the same opening as a train conversation, another answer: kept as data, not as a held-out prompt
    recs += [{"id": f"open{i}", "messages": [{"role": "user", "content": "Say hi"},
                                             {"role": "assistant", "content": f"hi number {i}"}]} for i in range(12)]
    rep, out = _prepare(tmp_path, _target(tmp_path, tiny_target), recs, eval_fraction=0.3)
    assert rep["duplicates_removed"] == 29 and rep["skipped"] == {"duplicate_conversation": 29}
    assert rep["kept"] == 1 + 30 + 12
    train = {**_samples(out[0])}
    evals = _samples(out[1])
    assert not {tuple(v[0].tolist()) for v in evals.values()} & {tuple(v[0].tolist()) for v in train.values()}
    prompts = [json.loads(x) for x in out[2].read_text().splitlines()]
    openings_in_eval = sum(s.startswith("open") for s in evals)
    assert openings_in_eval and rep["benchmark_prompts_seen_in_train"] == openings_in_eval
    assert not [p for p in prompts if p["messages"][0]["content"] == "Say hi"]
    assert rep["benchmark_prompts"] == len(prompts) == len(evals) - openings_in_eval


def test_a_jsonl_file_with_a_byte_order_mark_is_read(tmp_path, tiny_target):
    lines = "".join(json.dumps({"id": f"b{i}", "messages": [{"role": "user", "content": f"hi {i}"},
                                                           {"role": "assistant", "content": f"hello {i} there"}]}) + "\n"
                    for i in range(3))
    rep, out = _prepare(tmp_path, _target(tmp_path, tiny_target), None, raw=b"\xef\xbb\xbf" + lines.encode())
    assert rep["kept"] == 3 and rep["sources"][0]["byte_order_mark"] is True and rep["sources"][0]["bad_lines"] == 0
    array = b"\xef\xbb\xbf" + json.dumps([json.loads(x) for x in lines.splitlines()]).encode()
    (tmp_path / "2").mkdir()
    rep2, _ = _prepare(tmp_path / "2", _target(tmp_path / "2", tiny_target), None, name="a.json", raw=array)
    assert rep2["kept"] == 3 and rep2["sources"][0]["truncated_at_byte"] is None


# A template marking the assistant's part with generation tags, the end-of-turn token after the
# marker with whitespace control (as many do): transformers' mask alone misses <|im_end|>.
def _generation_template(open_tag, close_tag):
    return ("{%- for m in messages %}"
            "{%- if m['role'] == 'assistant' %}{{- '<|im_start|>assistant\\n' }}" + open_tag
            + "{{- m['content'] }}" + close_tag + "{{- '<|im_end|>\\n' }}"
            "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
            "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


@pytest.mark.parametrize("open_tag, close_tag", [("{%- generation -%}", "{%- endgeneration -%}"),
                                                 ("{% generation %}", "{% endgeneration %}")])
def test_generation_markers_with_the_end_token_outside(base_tokenizer_copy, open_tag, close_tag):
    tok = base_tokenizer_copy
    tok.chat_template = _generation_template(open_tag, close_tag)
    msgs = [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "Of Italy?"}, {"role": "assistant", "content": "Rome."}]
    assert cm.has_generation_tags(tok)
    ids, theirs = cm.transformers_assistant_mask(tok, msgs, None, 10_000)
    assert _supervised_text(tok, ids, theirs) == ["Paris.", "Rome."]  # transformers' mask: no end-of-turn token
    ids2, mask = cm.tokenize_with_mask(tok, msgs, 10_000)
    assert ids2.tolist() == ids.tolist()
    assert _supervised_text(tok, ids2, mask) == ["Paris.<|im_end|>", "Rome.<|im_end|>"]  # the union: the target stops
    assert ((mask | theirs) == mask).all()


def test_a_token_beyond_the_models_vocab_is_refused_naming_it(tmp_path, tiny_target):
    target = _target(tmp_path, tiny_target, vocab_size=49000)  # SmolLM2's special tokens sit at 0..16, text higher
    tok = _tok(target)
    text = tok.decode([49100])  # a token the 49,000-row model has no embedding for
    f = tmp_path / "d.jsonl"
    with pytest.raises(pd.DataError, match=rf"{f} record 0: the target's tokenizer emits token id \d+ .* vocab_size 49000"):
        _prepare(tmp_path, target, [{"messages": [{"role": "user", "content": "say it"},
                                                  {"role": "assistant", "content": f"ok {text} {text}"}]}])


def test_regenerated_answers_are_trained_from_their_token_ids(tmp_path, tiny_target):
    """An answer whose tokens hold special tokens (as gpt-oss channel markers): decoded text loses them,
    the sample keeps the ids the target generated, all supervised, end token included."""
    target = _target(tmp_path, tiny_target)
    tok = _tok(target)
    start, end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    gen = tok.encode("analysis", add_special_tokens=False) + [start] + tok.encode("final answer", add_special_tokens=False)
    gen += [end]
    text = tok.decode(gen, skip_special_tokens=True)
    assert "<|im_start|>" not in text
    rec = {"id": "g1", "messages": [{"role": "user", "content": "Go"}, {"role": "assistant", "content": "first one"},
                                    {"role": "user", "content": "Again"},
                                    {"role": "assistant", "content": text, "token_ids": gen}]}
    rep, out = _prepare(tmp_path, target, [rec])
    ids, mask = _samples(out[0])["g1"]
    assert ids[-len(gen):].tolist() == gen and mask[-len(gen):].all()
    assert _supervised_text(tok, ids, mask)[0] == "first one<|im_end|>"  # history from text, as served
    prompt = tok.apply_chat_template(rec["messages"][:3], add_generation_prompt=True, tokenize=False)
    assert tok.decode(ids[:-len(gen)]) == prompt and rep["regenerated_token_turns"] == 1


def test_regeneration_writes_token_ids_and_keeps_tool_conversations(tmp_path, monkeypatch):
    """The rounds record each answer's ids; a conversation with tool calls is written unchanged."""
    out = rr.regenerate_turns([[{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"}]],
                              lambda ps: [rr.Answer("ok", 3, True, [5, 6, 2]) for _ in ps], lambda m: 3, 100)
    assert out["conversations"][0][-1] == {"role": "assistant", "content": "ok", "token_ids": [5, 6, 2]}
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in TOOL_CONVS[:1] + REASONING[:1]))
    monkeypatch.setattr(rr, "regenerate_with_transformers", lambda target, prompts, *a, **k: {
        **rr.regenerate_turns(prompts, lambda ps: [rr.Answer("new", 2, True, [7, 2]) for _ in ps], lambda m: 3, 100)})
    rep = rr.regenerate(rr.RegenerateSettings(
        sources=[{"path": str(src), "max_samples": None}], target_dir="unused", out_jsonl=tmp_path / "o.jsonl",
        out_report=tmp_path / "r.json", max_seq_len=256, max_tokens=8, served_name="m", backend="transformers"))
    recs = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert rep["conversations_with_tools_kept"] == 1 and rep["turns_regenerated"] == 1
    q1 = next(r for r in recs if r["id"] == "q1")
    assert q1["messages"][-1] == {"role": "assistant", "content": "new", "token_ids": [7, 2]}
    t1 = next(r for r in recs if r["id"] == "t1")
    assert t1["tools"] == [WEATHER] and t1["messages"][1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert t1["messages"][-1]["content"] == "It is sunny in Paris."
