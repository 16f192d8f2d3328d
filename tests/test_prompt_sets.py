"""Benchmark prompt sets: HumanEval from the installed package, per-set caps, config errors named."""
from __future__ import annotations

import json

import pytest
from smk import REPO

from eagle3build.formats import prompt_sets


def test_humaneval_from_the_installed_package():
    p = prompt_sets.humaneval_path()
    assert p.name == "HumanEval.jsonl.gz" and p.is_file()
    hv = prompt_sets.humaneval_prompts()
    assert len(hv) == 164 and hv[0]["id"] == "HumanEval/0" and hv[163]["id"] == "HumanEval/163"
    (turn,) = hv[0]["messages"]
    assert turn["role"] == "user" and turn["content"].startswith(prompt_sets.HUMANEVAL_INSTRUCTION)
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in turn["content"]
    assert turn["content"].endswith('"""\n```')


def test_load_sets_caps_each_set(tmp_path):
    chat = tmp_path / "prompts.jsonl"
    chat.write_text("".join(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                            for i in range(5)))
    got = prompt_sets.load_sets(["humaneval", "chat"], 3, chat_path=chat)
    assert list(got) == ["humaneval", "chat"]
    assert [p["id"] for p in got["chat"]] == ["c0", "c1", "c2"]
    assert [p["id"] for p in got["humaneval"]] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert len(prompt_sets.load_sets(["chat"], 100, chat_path=chat)["chat"]) == 5


@pytest.mark.parametrize("sets,kw,message", [
    (["mt-bench"], {}, "unknown set .mt-bench."),
    (["chat", "chat"], {}, "named twice"),
    (["custom"], {}, "needs data.prompts_file"),
    (["chat"], {"chat_path": "EMPTY"}, "benchmark set 'chat' is empty"),
])
def test_load_sets_errors_name_the_set(tmp_path, sets, kw, message):
    if kw.get("chat_path") == "EMPTY":
        (tmp_path / "p.jsonl").write_text("")
        kw = {"chat_path": tmp_path / "p.jsonl"}
    with pytest.raises(prompt_sets.PromptSetError, match=message):
        prompt_sets.load_sets(sets, 2, **kw)


def test_custom_set_and_prompts_file_go_together(tmp_path):
    """`custom` in benchmark.sets without data.prompts_file (or the file without the set) stops the plan;
    with both, the file is an input of the benchmark only; serve.check_set outside benchmark.sets stops it too."""
    import yaml
    from smk import run

    cfg = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())
    cfg["benchmark"]["sets"] = ["chat", "custom"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    p = run(["-n", "--configfile", str(tmp_path / "c.yaml")], tmp_path)
    assert p.returncode != 0 and "benchmark.sets lists 'custom' exactly when data.prompts_file" in p.stdout + p.stderr
    pf = tmp_path / "mine.jsonl"
    pf.write_text('{"prompt": "hi"}\n')
    cfg["data"]["prompts_file"] = str(pf)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    p = run(["-n", "results/reduced/benchmark.json", "--configfile", str(tmp_path / "c.yaml")], tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "mine.jsonl" in p.stdout  # listed among the benchmark job's inputs
    # serve_check sends a set the benchmark runs: another one stops the plan
    cfg["serve"] = {"check_set": "mtbench"}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    p = run(["-n", "--configfile", str(tmp_path / "c.yaml")], tmp_path)
    assert p.returncode != 0 and "serve.check_set 'mtbench' is not in benchmark.sets ['chat', 'custom']" in p.stdout + p.stderr


def _by_set(**contents):
    return {name: [{"id": f"{name}{i}", "messages": [{"role": "user", "content": c}]} for i, c in enumerate(cs)]
            for name, cs in contents.items()}


def test_drop_too_long_skips_and_counts_per_set():
    """A prompt over the limit is skipped and counted in its own set; one at the limit stays; order is kept."""
    by_set = _by_set(chat=["aaaa", "a" * 11, "aaaaaaaaaa"], humaneval=["bb"])
    kept, skipped = prompt_sets.drop_too_long(by_set, lambda msgs: len(msgs[-1]["content"]), 10)
    assert {n: [p["id"] for p in ps] for n, ps in kept.items()} == {"chat": ["chat0", "chat2"], "humaneval": ["humaneval0"]}
    assert skipped == {"chat": 1, "humaneval": 0} and list(kept) == ["chat", "humaneval"]


def test_drop_too_long_fails_on_a_set_left_empty():
    by_set = _by_set(chat=["ok"], custom=["a" * 20, "a" * 30])
    with pytest.raises(prompt_sets.PromptSetError, match=r"benchmark set 'custom': all 2 prompts are longer than 10 "
                                                         r"tokens"):
        prompt_sets.drop_too_long(by_set, lambda msgs: len(msgs[-1]["content"]), 10)
