"""The benchmark's prompt sets (config ``benchmark.sets``), one module each, registered here: ``chat`` (the run's
held-out conversations), ``custom`` (``data.prompts_file``), ``humaneval``, ``mtbench``. A set is a ``PromptSet``
subclass decorated with ``register`` in a module of this package: it says how it loads (``load``: its every prompt,
first turns), what it needs (``needs``: prepare_data's prompts, the user's file or a package's), its turns (``turns``,
``next_turns``: a second turn after the target's own answer to the first), its categories (``categories``: figures per
category) and its knobs (``options``: config ``benchmark.<set>.<option>``). The package imports every module in it, so
a set is one module and its test: the config's enums and knobs (``config.keys_head``), prepare_data's template check,
the benchmark, serve_check and the plan read the registry (``SETS``), and no module outside it names a set
(tests/test_prompt_sets.py).

Every prompt is a chat request ``{"id": str, "messages": [{"role", "content"}, ...]}`` ending on a user turn (with
``"category"`` in a set of categories), sent with the target's chat template. ``benchmark.num_prompts`` applies per
set (the first N, ``PromptSet.choose``; a set may choose otherwise). A prompt the engine cannot answer in full is
skipped and counted (``drop_too_long``): its chat-template rendering plus ``benchmark.max_tokens`` would exceed
``benchmark.max_model_len``; a set left with none is an error. A prompt the target's chat template refuses to render
is skipped and counted (``drop_refused``): prepare_data checks every prompt of the configured sets before any GPU
stage (its data report's ``benchmark_prompt_check``), the benchmark again for a prompts file edited since.
"""

from __future__ import annotations

import importlib
import importlib.resources
import json
import os
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar


class PromptSetError(ValueError):
    """A prompt set cannot be built; the message names the set and the file (and line)."""


@dataclass(frozen=True)
class SetOption:
    """A knob of a set, config key ``benchmark.<set>.<name>``: its JSON schema, default and doc line (a key added
    after builds existed: left out of the benchmark's param while it holds its default, and while the set is not
    run)."""

    name: str
    schema: Mapping[str, Any]
    default: Any
    doc: str


@dataclass(frozen=True)
class Sources:
    """The files a set may read (``PromptSet.needs``): ``eval_prompts``, prepare_data's prompts.jsonl (the first user
    turn of each eval-split conversation); ``user_prompts``, the user's JSONL (config ``data.prompts_file``)."""

    eval_prompts: str | os.PathLike | None = None
    user_prompts: str | os.PathLike | None = None


class PromptSet:
    """One prompt set (the module docstring): ``name`` (``benchmark.sets``), ``summary`` (the config doc's words),
    ``needs`` (``"eval"``: ``Sources.eval_prompts``; ``"file"``: ``Sources.user_prompts``; ``"package"``: a file of the
    PyPI package ``requirement``), ``default`` (in ``benchmark.sets``' default), ``categories`` (its prompts carry a
    ``category``: decoded and reported per category), ``options`` (its ``SetOption`` knobs)."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    needs: ClassVar[str] = "package"
    requirement: ClassVar[str | None] = None
    default: ClassVar[bool] = True
    categories: ClassVar[bool] = False
    options: ClassVar[tuple[SetOption, ...]] = ()

    def load(self, sources: Sources) -> list[dict]:
        """Every prompt of the set, first turns, in file order.

        Raises:
            PromptSetError: a file it needs is not given or not there, or holds no prompt (names the set and file).
        """
        raise NotImplementedError(self.name)

    def choose(self, prompts: list[dict], num_prompts: int, options: Mapping[str, Any]) -> list[dict]:
        """The prompts the benchmark sends of ``prompts`` (``load``'s): the first ``num_prompts``.

        Raises:
            PromptSetError: an option out of range (named).
        """
        return prompts[:num_prompts]

    def turns(self, options: Mapping[str, Any]) -> int:
        """The turns each prompt is sent with: 1, or 2 where a second follows the target's own answer to the first."""
        return 1

    def next_turns(self, first_turns: list[dict], answers: Mapping[str, str]) -> list[dict]:
        """``first_turns``, each followed by its next turn after ``answers`` (``answer_key`` of a prompt's id -> the
        target's greedy answer to it) where they hold one (a set of one turn: ``first_turns``)."""
        return list(first_turns)

    def answer_key(self, prompt_id: str) -> str:
        """The key of the target's answer to prompt ``prompt_id`` in ``next_turns``' ``answers``: its id."""
        return prompt_id


SETS: dict[str, PromptSet] = {}  # name -> set, by module name (chat, custom, humaneval, mtbench)


def register(cls: type[PromptSet]) -> type[PromptSet]:
    """A class decorator: ``cls``'s one object in ``SETS`` under ``cls.name``.

    Raises:
        ValueError: the name is taken.
    """
    if cls.name in SETS:
        raise ValueError(f"prompt set {cls.name!r} is registered twice")
    SETS[cls.name] = cls()
    return cls


def discover() -> None:
    """Import every module of the package's folders (``__path__``) not imported yet, by name: each registers its set."""
    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{m.name}")


def get(name: str) -> PromptSet:
    """The set ``name``.

    Raises:
        PromptSetError: no such set (names the known ones).
    """
    if name not in SETS:
        raise PromptSetError(f"benchmark.sets: unknown set {name!r} (known: {', '.join(SETS)})")
    return SETS[name]


def package_file(set_name: str, package: str, parts: tuple[str, ...], requirement: str) -> Path:
    """File ``parts`` inside the installed ``package`` (a set's data: never the network).

    Raises:
        PromptSetError: the package is not installed (names the set and ``requirement``).
    """
    try:
        return Path(str(importlib.resources.files(package).joinpath(*parts)))
    except ModuleNotFoundError as e:
        raise PromptSetError(f"benchmark set {set_name!r} needs the package '{requirement}' "
                             "(requirements-data.txt; ./install.sh installs it)") from e


def jsonl_records(path: str | os.PathLike, what: str = "") -> Iterator[tuple[int, Any]]:
    """``(line number, record)`` of each non-blank line of the UTF-8 JSONL file ``path``, in order. Lines end at
    ``"\\n"`` only: JSON strings may hold U+2028 or U+0085 unescaped, where ``str.splitlines`` splits.

    Raises:
        PromptSetError: the file cannot be read (``what`` names what it is, after "cannot read"), is not UTF-8, or a
            line is not JSON (its number named).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise PromptSetError(f"{path}: cannot read{what} ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise PromptSetError(f"{path}: not UTF-8 text (bad byte at offset {e.start})") from e
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptSetError(f"{path}: line {lineno} is not valid JSON ({e.msg})") from e


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
    from ..formats.conversations import content_text

    out = []
    for lineno, rec in jsonl_records(path):
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


def categories(prompts: list[dict]) -> list[dict] | None:
    """The consecutive runs of ``prompts`` by their ``category`` as ``[{"name": category, "count": n}]`` (the
    engine's ``parts``: ``vllm.measure.decode_greedy``), or None where no prompt carries a category (a set without
    ``PromptSet.categories``).

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


def load_sets(sets: list[str], num_prompts: int, sources: Sources = Sources(),
              options: Mapping[str, Mapping[str, Any]] | None = None,
              answers: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, list[dict]]:
    """``{set name: the prompts the benchmark sends of it}`` in the order of ``sets``: each set's ``load`` of
    ``sources``, ``choose``n by ``num_prompts`` and its ``options`` (``{set: {option: value}}``; a set's defaults where
    absent); with ``answers`` of a set (``{set: answers}``, the target's answers to its first turns), each answered
    first turn followed by its next (``next_turns``).

    Raises:
        PromptSetError: an unknown or repeated set name, or what a set's ``load`` or ``choose`` raises.
    """
    if len(set(sets)) != len(sets):
        raise PromptSetError(f"benchmark.sets {sets}: a set is named twice")
    out = {}
    for name in sets:
        st = get(name)
        opts = {o.name: o.default for o in st.options} | dict((options or {}).get(name, {}))
        out[name] = st.choose(st.load(sources), num_prompts, opts)
        if (answers or {}).get(name):
            out[name] = st.next_turns(out[name], answers[name])
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


discover()
