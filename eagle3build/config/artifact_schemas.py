"""The artifact schemas' draft enums, generated from the draft registry (eagle3build/draft/methods.py).

train_meta.json and head_meta.json record a head's ``method`` and ``layer`` only where they are not the defaults
(``DraftMethod.recorded``, ``DraftLayer.recorded``: an eagle3 head of the llama layer keeps the bytes it had before
either existed); benchmark.json names every served head's ``method``. Their schemas (eagle3build/schemas/) hold
those names as enums (``ENUMS``): this module writes them from the registry, so that a method or a layer added there
reaches the schemas by one command, ``python -m eagle3build.config.artifact_schemas`` (``--check``: exit 1 naming
each file that differs), and tests/test_draft_registry.py checks the shipped files are the generated ones, byte for
byte. The schemas are written as JSON with two-space indents, a value on one line where it fits (``dumps``).

The loaders (eagle3build/formats/artifacts.py) read the files as they are: the formats sit below the draft in the
floor's order, so the enums are filled in here, not at load time. Planning does not import this module.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..draft import methods

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"


def recorded_methods() -> list[str]:
    """The methods a train_meta.json or head_meta.json names (every one but the default, which it leaves out)."""
    return [m.name for m in methods.METHODS.values() if m.recorded]


def recorded_layers() -> list[str]:
    """The draft layers a train_meta.json or head_meta.json names (every one but the default)."""
    return [x.name for x in methods.LAYERS.values() if x.recorded]


def all_methods() -> list[str]:
    """Every registered method, as benchmark.json names a served head's."""
    return list(methods.NAMES)


# schema file -> (JSON path of the node whose "enum" is generated, the names it holds)
ENUMS: dict[str, tuple[tuple[tuple[Any, ...], Callable[[], list[str]]], ...]] = {
    "train_meta.schema.json": ((("properties", "method"), recorded_methods),
                               (("properties", "layer"), recorded_layers)),
    "head_meta.schema.json": ((("properties", "method"), recorded_methods),
                              (("properties", "layer"), recorded_layers)),
    "benchmark.schema.json": ((("$defs", "head_run", "allOf", 2, "properties", "method"), all_methods),
                              (("$defs", "served_head", "properties", "method"), all_methods)),
}


WIDTH = 120  # characters a line of a generated schema holds where it can


def dumps(obj: Any, indent: int = 0, used: int = 0) -> str:
    """``obj`` as the schemas' JSON: two-space indents; a value whose JSON fits on its line (``WIDTH`` characters,
    ``used`` of them taken by the indent and key before it) on one line, else one member a line."""
    pad, inner = "  " * indent, "  " * (indent + 1)
    flat = json.dumps(obj, ensure_ascii=False)
    if not isinstance(obj, (dict, list)) or not obj or used + len(flat) <= WIDTH:
        return flat
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            key = f"{inner}{json.dumps(k, ensure_ascii=False)}: "
            items.append(key + dumps(v, indent + 1, len(key)))
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    return "[\n" + ",\n".join(f"{inner}{dumps(v, indent + 1, len(inner))}" for v in obj) + f"\n{pad}]"


def generated(name: str, schema_dir: Path = SCHEMA_DIR) -> str:
    """The text of schema file ``name`` (an ``ENUMS`` key) with its draft enums from the registry.

    Raises:
        KeyError: ``name`` is not an ``ENUMS`` key, or the file lacks a node ``ENUMS`` names.
        OSError, ValueError: the file cannot be read as JSON.
    """
    schema = json.loads((schema_dir / name).read_text())
    for path, names in ENUMS[name]:
        node = schema
        for part in path:
            node = node[part]
        node["enum"] = names()
    return dumps(schema) + "\n"


def stale(schema_dir: Path = SCHEMA_DIR) -> list[str]:
    """The ``ENUMS`` files whose text is not ``generated``'s."""
    return [n for n in ENUMS if (schema_dir / n).read_text() != generated(n, schema_dir)]


def main(argv: list[str] | None = None) -> int:
    """Write each ``ENUMS`` file's ``generated`` text (``--check``: write nothing, print the stale files and
    return 1 where any is). Returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if "--check" in argv:
        bad = stale()
        for n in bad:
            print(f"eagle3build/schemas/{n}: not the registry's enums; run python -m eagle3build.config.artifact_schemas",
                  file=sys.stderr)
        return 1 if bad else 0
    for n in ENUMS:
        (SCHEMA_DIR / n).write_text(generated(n))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
