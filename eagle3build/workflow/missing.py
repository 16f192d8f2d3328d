"""A built run's deleted intermediate files, named when planning (issue 55; shared layer): Snakemake 9 plans nothing
for a missing intermediate whose readers' outputs are present and says nothing, so ``missing_intermediates`` finds
them from the rules' files (``Step``) and ``missing_intermediate_message`` names the files, the job that read them,
the command that rebuilds them and what the next run replans (docs/staleness.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """One rule of the workflow with files of its own (no wildcards in its outputs): ``rule`` (its name), the
    ``inputs`` it names as plain paths (input functions left out) and its ``outputs``."""

    rule: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class MissingIntermediate:
    """Files ``files`` (sorted) that rule ``producer`` makes, missing, while ``made``, an output of the first of
    ``readers`` (the rules that read them), is present; ``follows``: the rules replanned once they are rebuilt
    (the readers and every rule that reads what those make, in order)."""

    producer: str
    files: tuple[str, ...]
    readers: tuple[str, ...]
    made: str
    follows: tuple[str, ...]


class _Listing:
    """Whether files exist, from one directory listing per directory (a finished run's 10,000 shards: one
    ``os.listdir``, not 10,000 ``stat`` calls)."""

    def __init__(self):
        self._names: dict[str, frozenset[str]] = {}

    def exists(self, path: str) -> bool:
        folder, name = os.path.split(path)
        if folder not in self._names:
            try:
                self._names[folder] = frozenset(os.listdir(folder or "."))
            except OSError:
                self._names[folder] = frozenset()
        return name in self._names[folder]


def missing_intermediates(steps: list[Step], producer_of, targets: frozenset[str] = frozenset()
                          ) -> list[MissingIntermediate]:
    """The intermediates of a built run that are gone while what was made from them is present: for each step
    with an output present, its inputs that are missing and that a rule makes (``producer_of(path)``: that
    rule's name, or None for a file no rule makes, such as a user's data file), one entry per
    producer. Snakemake 9 plans a missing file only for a job that is planned to read it: where the
    readers are up to date it stays missing, and ``snakemake -n`` says nothing of it. ``targets``: files a
    target rule asks for (rule ``all``'s inputs), which Snakemake plans when missing, left out. Paths are
    relative to the working directory. Cheap at planning: one listing per directory, and the inputs of steps with no
    output present are not looked at.
    """
    listing = _Listing()
    readers: dict[str, list[str]] = {}
    for s in steps:
        for f in s.inputs:
            readers.setdefault(f, []).append(s.rule)
    by_rule = {s.rule: s for s in steps}

    def follows(rule: str) -> tuple[str, ...]:
        order, todo = [rule], [rule]
        while todo:
            for out in by_rule[todo.pop(0)].outputs:
                for r in readers.get(out, ()):
                    if r not in order:
                        order.append(r)
                        todo.append(r)
        return tuple(order)

    found: dict[str, dict[str, list[str]]] = {}  # producer -> reader -> missing files
    made: dict[str, str] = {}
    for step in steps:
        present = next((o for o in step.outputs if listing.exists(o)), None)
        if present is None:
            continue
        for f in step.inputs:
            if f not in targets and not listing.exists(f):
                producer = producer_of(f)
                if producer is not None:
                    found.setdefault(producer, {}).setdefault(step.rule, []).append(f)
                    made[step.rule] = present
    out = []
    for producer, by_reader in found.items():
        its_readers = tuple(by_reader)
        after = tuple(dict.fromkeys(r for reader in its_readers for r in follows(reader)))
        files = tuple(sorted({f for fs in by_reader.values() for f in fs}))
        out.append(MissingIntermediate(producer, files, its_readers, made[its_readers[0]], after))
    return out


LISTED_FILES = 3  # a rebuild command names up to this many files; more: the rule's every job is rerun


def missing_intermediate_message(m: MissingIntermediate) -> str:
    """What the plan says of ``m``: the file(s), what reads them, why Snakemake plans nothing for them, the
    command that rebuilds them and what is replanned after (docs/staleness.md)."""
    n = len(m.files)
    what = m.files[0] if n == 1 else f"{n} files of rule {m.producer} ({', '.join(m.files[:LISTED_FILES])}" + (
        ", ...)" if n > LISTED_FILES else ")")
    if n <= LISTED_FILES:
        command = f"snakemake {' '.join(m.files)} <your options>"  # targets first: --configfile takes several
    else:
        command = f"snakemake <your options> --forcerun {m.producer} --until {m.producer} (every {m.producer} job)"
    readers = " and ".join(m.readers)
    return (f"{what} {'is' if n == 1 else 'are'} missing while {m.made}, made from {'it' if n == 1 else 'them'} by "
            f"{m.readers[0]}, is present: Snakemake rebuilds a missing file only for a job planned to read it, so unless "
            f"this plan runs {readers} {'it stays' if n == 1 else 'they stay'} missing (docs/staleness.md). "
            f"Rebuild with `{command}`; the next run then replans {', '.join(m.follows)} "
            f"(the rebuilt file is newer than what they made)")


def workflow_messages(rules) -> list[str]:
    """``missing_intermediate_message`` of each intermediate of a built run that is gone while what was made from it is
    present, from the workflow's ``rules`` (Snakemake's rules of the workflow, duck-typed: ``name``, ``input``,
    ``output``, ``has_wildcards()``, ``is_producer(path)``): those with wildcards in their outputs are producers only
    (their files are read through the rules that list them); the inputs of rules without outputs (rule ``all``) are
    targets, which Snakemake plans when missing. The Snakefile warns with them at planning."""
    rules = list(rules)
    steps = [Step(r.name, tuple(str(f) for f in r.input if isinstance(f, str)), tuple(map(str, r.output)))
             for r in rules if r.output and not r.has_wildcards()]

    def producer_of(path):
        return next((r.name for r in rules if r.output and r.is_producer(path)), None)

    targets = frozenset(str(f) for r in rules if not r.output for f in r.input if isinstance(f, str))
    return [missing_intermediate_message(m) for m in missing_intermediates(steps, producer_of, targets)]
