"""What the one adapter calls for a rule, and where the settings object it calls it with gets its own fields from.

A rule's ``JobEntry`` (a stage's, from its contract: ``workflow.contract.job_entry``) names ``entry``, the library
function (``module:function``) that takes one settings object, ``settings``, that object's class (``module:Class``,
made by ``config.settings.config_fields``: its config fields come from the job's ``StageSettings``), and
``from_job``: each of the class's own fields (the job's files, its GPUs, what planning or the compat report decided)
by its source in the job, a ``JobField``, written ``<channel>.<name>[.<key>...]`` with an optional ``?`` at the end:

- ``inputs.<name>``, ``outputs.<name>``: a named input or output file of the rule (a path; a list of paths for an input
  that is a list);
- ``params.<name>``: a param of the rule (a derived path such as ``target_dir``, a computed trigger such as
  prepare_data's ``sources``, the draft planning resolved: ``draft``); ``params.shard.start``: a key inside one;
- ``wildcards.<name>``; ``resources.<name>`` (``resources.gpu``: the GPUs the job holds; ``resources.threads``: the
  job's threads, Snakemake's ``threads``, which the adapter adds);
- ``decisions.<field>``: a field of the compat report's decisions.json, the job's ``decisions`` input, by its dotted
  path (``decisions.capture.aux_layer_ids``), the file read once a job and checked against its schema; the stage's
  contract lists the field among its ``decisions``.

``?``: optional: where the job lacks it, or it is None or an empty list (an input function that gave nothing), the
field keeps its class's default. A stage's settings class names each own field's source
(``config.settings.job``: ``out_json: str = job("outputs.json")``), and its contract's inputs and decisions.json
fields include those its fields read (``workflow.contract``). ``workflow.job.stage_settings`` reads them;
``rule_problems`` checks a rule against its outputs and params when the workflow is parsed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The parts of a job a field may come from (the module docstring).
CHANNELS = ("inputs", "outputs", "params", "wildcards", "resources", "decisions")
ABSENT = object()  # ``JobField.read``'s answer for an optional field the job does not give


@dataclass(frozen=True)
class JobField:
    """One settings field's source in a job: ``channel`` (one of ``CHANNELS``), the ``path`` of names inside it and
    whether it is ``optional`` (the module docstring)."""

    channel: str
    path: tuple[str, ...]
    optional: bool = False

    @classmethod
    def parse(cls, source: str) -> JobField:
        """The field of ``source`` (``"params.shard.start"``, ``"inputs.custom_prompts?"``).

        Raises:
            ValueError: the channel is not one of ``CHANNELS``, or no name follows it.
        """
        optional = source.endswith("?")
        channel, *path = source.removesuffix("?").split(".")
        if channel not in CHANNELS or not path or not all(path):
            raise ValueError(f"job field source {source!r}: expected <channel>.<name>[.<key>...][?], the channel one "
                             f"of {list(CHANNELS)}")
        return cls(channel, tuple(path), optional)

    def __str__(self) -> str:
        return ".".join((self.channel, *self.path)) + ("?" if self.optional else "")

    def read(self, job: Mapping[str, Any]) -> Any:
        """The value in ``job`` (channel -> its mapping: the job's named inputs, outputs, ...; ``decisions``:
        decisions.json's content), or ``ABSENT`` where an optional field's value is missing, None or ``[]``.

        Raises:
            KeyError: a field that is not optional is missing (the message names it).
        """
        value: Any = job.get(self.channel, {})
        for name in self.path:
            if not isinstance(value, Mapping) or name not in value:
                if self.optional:
                    return ABSENT
                raise KeyError(f"the job has no {self}")
            value = value[name]
        if self.optional and (value is None or (isinstance(value, list) and not value)):
            return ABSENT
        return value


@dataclass(frozen=True)
class JobEntry:
    """What the adapter calls for one rule (the module docstring): ``entry`` with an object of ``settings`` whose own
    fields come from the job as ``from_job`` says (field name -> ``JobField``)."""

    entry: str
    settings: str
    from_job: Mapping[str, JobField] = field(default_factory=dict)

    @classmethod
    def of(cls, entry: str, settings: str, from_job: Mapping[str, str]) -> JobEntry:
        """A ``JobEntry`` with ``from_job``'s sources parsed (``JobField.parse``; raises what it raises)."""
        return cls(entry, settings, {name: JobField.parse(src) for name, src in from_job.items()})

    def fields_of(self, channel: str) -> dict[str, JobField]:
        """The fields whose source is in ``channel``, by field name."""
        return {name: f for name, f in self.from_job.items() if f.channel == channel}


def rule_problems(rule: str, job: JobEntry, outputs: Iterable[str], params: Iterable[str]) -> list[str]:
    """What rule ``rule`` lacks of ``job``'s sources, said when the workflow is parsed (a job would fail on it
    later): each output or param a field that is not optional reads and the rule does not name (``outputs``,
    ``params``: the rule's output and param names), a line each."""
    named = {"outputs": set(outputs), "params": set(params)}
    return [f"rule {rule}: its settings field {name} reads {f}, which the rule does not name"
            for channel, names in named.items() for name, f in job.fields_of(channel).items()
            if not f.optional and f.path[0] not in names]
