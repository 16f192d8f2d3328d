"""A config key's declaration (``Key``) and the roles a stage reads a key in (``ROLES``: ``workflow.stages``).

``config.spec`` is the one declaration of the config (its module docstring says what is made from it); the keys
themselves are declared by section in ``keys_data`` (run, target, data, capture, vocab),
``keys_head`` (train, export, benchmark, preflight, staleness) and ``keys_resources``; the draft
section is made from the method registry (``spec.draft_keys``). Planning imports these modules: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

ROLES = ("trigger", "runtime", "files")


@dataclass(frozen=True)
class Key:
    """One config key: ``path`` (dotted, ``train.lr``), ``schema`` (the JSON schema of its value: type and bounds),
    ``default`` (config.yaml's value) and ``doc`` (one line: what it sets, units); the stages it reaches declare it
    with its roles there (``workflow.stages``). ``quiet_default``: the key was added after builds existed; a section
    param it is part of (``trigger:<param>``) leaves it out while it holds ``default``, so those builds do not
    replan, and names it once it does not (tests/test_no_replan.py). ``only_with``: ``(path, value)``, the key
    shapes the output only where key ``path`` holds ``value`` (a list holding it, or equal to it): a section param
    leaves the key out elsewhere, so that a setting of something not run replans nothing (``benchmark.mtbench.*``
    where ``benchmark.sets`` has no ``mtbench``); ``path`` must be in the same section param."""

    path: str
    schema: Mapping[str, Any]
    default: Any
    doc: str
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
