"""Benchmark prompt sets: HumanEval from the installed package, per-set caps, config errors named; the registry
(issue 73): a set is one module, and no module outside the package names one."""
from __future__ import annotations

import ast
import json
import re

import pytest
from smk import REPO

from eagle3build import prompt_sets
from eagle3build.prompt_sets import Sources, humaneval


def test_humaneval_from_the_installed_package():
    p = prompt_sets.get("humaneval").path()
    assert p.name == "HumanEval.jsonl.gz" and p.is_file()
    hv = prompt_sets.get("humaneval").load(Sources())
    assert len(hv) == 164 and hv[0]["id"] == "HumanEval/0" and hv[163]["id"] == "HumanEval/163"
    (turn,) = hv[0]["messages"]
    assert turn["role"] == "user" and turn["content"].startswith(humaneval.INSTRUCTION)
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in turn["content"]
    assert turn["content"].endswith('"""\n```')


def test_load_sets_caps_each_set(tmp_path):
    chat = tmp_path / "prompts.jsonl"
    chat.write_text("".join(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                            for i in range(5)))
    got = prompt_sets.load_sets(["humaneval", "chat"], 3, Sources(eval_prompts=chat))
    assert list(got) == ["humaneval", "chat"]
    assert [p["id"] for p in got["chat"]] == ["c0", "c1", "c2"]
    assert [p["id"] for p in got["humaneval"]] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert len(prompt_sets.load_sets(["chat"], 100, Sources(eval_prompts=chat))["chat"]) == 5


@pytest.mark.parametrize("sets,kw,message", [
    (["mt-bench"], {}, "unknown set .mt-bench."),
    (["chat", "chat"], {}, "named twice"),
    (["custom"], {}, "needs data.prompts_file"),
    (["chat"], {"eval_prompts": "EMPTY"}, "benchmark set 'chat' is empty"),
])
def test_load_sets_errors_name_the_set(tmp_path, sets, kw, message):
    if kw.get("eval_prompts") == "EMPTY":
        (tmp_path / "p.jsonl").write_text("")
        kw = {"eval_prompts": tmp_path / "p.jsonl"}
    with pytest.raises(prompt_sets.PromptSetError, match=message):
        prompt_sets.load_sets(sets, 2, Sources(**kw))


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


# ---------------------------------------------------------------- the registry: a set is one module

def set_name_uses(source: str) -> list[int]:
    """Lines of ``source`` (Python) that name a registered set in code: a comparison with its name (``name ==
    "chat"``, ``"mtbench" in by_set``), a subscript by it (``by_set["mtbench"]``) or a dict keyed by it."""
    names = set(prompt_sets.SETS)

    def named(n):
        return isinstance(n, ast.Constant) and n.value in names
    out = []
    for n in ast.walk(ast.parse(source)):
        if ((isinstance(n, ast.Compare) and any(named(x) or (isinstance(x, (ast.Tuple, ast.List, ast.Set))
                                                             and any(named(e) for e in x.elts))
                                                for x in [n.left, *n.comparators]))
                or (isinstance(n, ast.Subscript) and named(n.slice))
                or (isinstance(n, ast.Dict) and any(named(k) for k in n.keys if k is not None))):
            out.append(n.lineno)
    return sorted(set(out))


def test_no_module_outside_the_registry_names_a_set():
    """Issue 73: prepare_data, the benchmark, serve_check, the plan and the config read the registry; only a set's own
    module names it (and a quoted name in the Snakefile or rules would too)."""
    found = {}
    for p in sorted([*REPO.glob("eagle3build/**/*.py"), *REPO.glob("scripts/*.py")]):  # benchmarks/: the lab's tools
        if "prompt_sets" not in p.parts and set_name_uses(p.read_text()):
            found[str(p.relative_to(REPO))] = set_name_uses(p.read_text())
    quoted = re.compile(r"""["'](%s)["']""" % "|".join(prompt_sets.SETS))
    for p in [REPO / "Snakefile", *sorted(REPO.glob("rules/*.smk"))]:
        lines = [i for i, line in enumerate(p.read_text().splitlines(), 1) if quoted.search(line.split("#")[0])]
        if lines:
            found[str(p.relative_to(REPO))] = lines
    assert found == {}
    assert set_name_uses('if "chat" in sets or name == "mtbench":\n    x = by_set["custom"]\n') == [1, 2]


# A set of SPEED-Bench's shape (docs/stage-contracts.md, "Adding a prompt set"): one module of the package, its
# prompts in categories, two turns.
NEW_SET = '''
"""Set ``demo``: two questions in two categories, two turns each (a test's set)."""
from . import PromptSet, SetOption, Sources, register

QUESTIONS = [("qa", ["What is 2 + 2?", "And times 3?"]), ("code", ["Write hello world.", "Now in C."])]


@register
class Demo(PromptSet):
    name = "demo"
    summary = "demo (a test's set: two categories, two turns)"
    default = False
    categories = True
    options = (SetOption("turns", {"type": "integer", "enum": [1, 2]}, 1, "set demo: turns sent"),)

    def load(self, sources: Sources) -> list[dict]:
        return [{"id": f"{i}/1", "category": cat, "messages": [{"role": "user", "content": turns[0]}]}
                for i, (cat, turns) in enumerate(QUESTIONS)]

    def turns(self, options):
        return options["turns"]

    def next_turns(self, first_turns, answers):
        out = []
        for p in first_turns:
            out.append(p)
            qid = self.answer_key(p["id"])
            if qid in answers:
                out.append({"id": f"{qid}/2", "category": p["category"], "messages": [
                    *p["messages"], {"role": "assistant", "content": answers[qid]},
                    {"role": "user", "content": QUESTIONS[int(qid)][1][1]}]})
        return out

    def answer_key(self, prompt_id):
        return prompt_id.split("/")[0]
'''


def test_a_new_set_is_one_module(tmp_path, monkeypatch):
    """A module beside the others registers its set: the config's enums and knobs, the plan, prepare_data's template
    check, the benchmark's loading, turns and categories and serve_check's choice read it with no other edit."""
    import sys

    from eagle3build.config import keys_head, spec
    from eagle3build.data.prepare_data import check_benchmark_prompts
    from eagle3build.workflow import contract, plan

    (tmp_path / "demo.py").write_text(NEW_SET)
    monkeypatch.setattr(prompt_sets, "__path__", [*prompt_sets.__path__, str(tmp_path)])
    monkeypatch.setattr(prompt_sets, "SETS", dict(prompt_sets.SETS))
    monkeypatch.delitem(sys.modules, "eagle3build.prompt_sets.demo", raising=False)
    prompt_sets.discover()
    assert list(prompt_sets.SETS) == ["chat", "custom", "humaneval", "mtbench", "demo"]
    keys = {k.path: k for k in keys_head.set_keys(prompt_sets.SETS)}
    assert "demo" in keys["benchmark.sets"].schema["items"]["enum"] and "demo" not in keys["benchmark.sets"].default
    assert keys["benchmark.demo.turns"].only_with == ("benchmark.sets", "demo")
    all_keys = tuple(k for k in spec.KEYS if k.path != "benchmark.sets") + tuple(keys.values())
    (param,) = [p for p in contract.build_contracts(keys=all_keys)["benchmark"].params if p.name == "benchmark"]
    assert dict(param.make.names)["benchmark.demo.turns"] == "demo_turns"  # in its param where the set runs
    config = {"benchmark": {"sets": ["chat", "demo"]}, "data": {"prompts_file": None}, "serve": {"check_set": "demo"}}
    plan.check_sets(config)
    assert plan.prompts_file_input(config) == []
    got = prompt_sets.load_sets(["demo"], 2, options={"demo": {"turns": 2}}, answers={"demo": {"0": "4"}})["demo"]
    assert [p["id"] for p in got] == ["0/1", "0/2", "1/1"] and got[1]["messages"][-1]["content"] == "And times 3?"
    assert prompt_sets.categories(got) == [{"name": "qa", "count": 2}, {"name": "code", "count": 1}]
    tok = type("Tok", (), {"apply_chat_template": lambda self, m, **kw: "".join(x["content"] for x in m)})()
    chat = [{"id": "c", "messages": [{"role": "user", "content": "hi"}]}]
    kept, report = check_benchmark_prompts(tok, chat, ["chat", "demo"], None)
    assert kept == chat and report["demo"] == {"prompts": 2, "refused": 0, "examples": []}
