"""A config key's declaration (``Key``) and the names its ``uses`` are written with: the stages, the roles.

``config.spec`` is the one declaration of the config (its module docstring says what is made from it); the keys
themselves are declared by section in ``keys_data`` (run, target, data, capture, vocab),
``keys_head`` (train, export, benchmark, preflight, staleness) and ``keys_resources``; the draft
section is made from the method registry (``spec.draft_keys``). Planning imports these modules: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

ROLES = ("trigger", "runtime", "files")

# The stages (eagle3build.workflow.contract.CONTRACTS), for the ``uses`` of keys that reach many.
ALL_STAGES = (
    "materialize_target",
    "compat_report",
    "regenerate_responses",
    "prepare_data",
    "capture_hidden_states",
    "build_vocab_map",
    "train_draft",
    "export_head",
    "benchmark",
    "preflight_bound",
    "plot_benchmark",
    "serve_config",
    "serve_check",
)
# The stages that read the target's files (results/<run>/ and the target decide their files)
TARGET_READERS = (
    "compat_report",
    "regenerate_responses",
    "prepare_data",
    "capture_hidden_states",
    "train_draft",
    "export_head",
    "benchmark",
    "preflight_bound",
    "serve_config",
    "serve_check",
)


def each(stages: tuple[str, ...], role: str) -> dict[str, str]:
    """``uses`` giving each of ``stages`` the roles ``role``."""
    return {s: role for s in stages}


@dataclass(frozen=True)
class Key:
    """One config key: ``path`` (dotted, ``train.lr``), ``schema`` (the JSON schema of its value: type and
    bounds), ``default`` (config.yaml's value), ``doc`` (one line: what it sets, units) and ``uses`` (stage ->
    its roles there, the module docstring). ``quiet_default``: the key was added after builds existed; a section
    param it is part of (``trigger:<param>``) leaves it out while it holds ``default``, so those builds do not
    replan, and names it once it does not (tests/test_no_replan.py). ``only_with``: ``(path, value)``, the key
    shapes the output only where key ``path`` holds ``value`` (a list holding it, or equal to it): a section param
    leaves the key out elsewhere, so that a setting of something not run replans nothing (``benchmark.mtbench.*``
    where ``benchmark.sets`` has no ``mtbench``); ``path`` must be in the same section param."""

    path: str
    schema: Mapping[str, Any]
    default: Any
    doc: str
    uses: Mapping[str, str] = field(default_factory=dict)
    quiet_default: bool = False
    only_with: tuple[str, Any] | None = None

    @property
    def name(self) -> str:
        """The last part of ``path``."""
        return self.path.rsplit(".", 1)[-1]

    @property
    def section(self) -> str:
        """``path`` without its last part (``""`` for a top-level key)."""
        return self.path.rsplit(".", 1)[0] if "." in self.path else ""

    def roles(self, stage: str) -> tuple[str, ...]:
        """The key's roles for ``stage`` (``()``: it does not reach the stage)."""
        return tuple(self.uses.get(stage, "").split())

    def trigger_param(self, stage: str) -> tuple[str, bool, str] | None:
        """The name of ``stage``'s rerun-trigger param the key is part of, whether the name was given
        (``trigger:<param>``) rather than the key's own (``trigger``), and the key's name in a section param
        (``trigger:<param>/<name>``, else its last part); None: no trigger of the stage."""
        for role in self.roles(stage):
            if role == "trigger":
                return self.name, False, self.name
            if role.startswith("trigger:"):
                param, _, name = role.split(":", 1)[1].partition("/")
                return param, True, name or self.name
        return None

    def python_type(self) -> Any:
        """The Python type of the key's value (``int | None`` for ``{"type": ["integer", "null"]}``; ``Any``
        where the schema names no single type)."""
        names = self.schema.get("type")
        names = [names] if isinstance(names, str) else list(names or [])
        types = {"integer": int, "number": float, "string": str, "boolean": bool, "array": list, "object": dict}
        if not names or any(n not in types and n != "null" for n in names):
            return Any
        out = None
        for n in names:
            t = type(None) if n == "null" else types[n]
            out = t if out is None else out | t
        return out
