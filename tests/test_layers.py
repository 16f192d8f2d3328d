"""The package's two layers: stage modules (one per Snakemake rule) over shared modules.

A stage module imports shared modules, never another stage module (not even lazily inside a
function); a shared module never imports a stage module; the top-level imports among the
package's modules have no cycle. Checked on the source with ``ast``, without importing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "eagle3build"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / PACKAGE

# The modules named after a Snakemake rule (rules/<stage>.smk, scripts/<stage>.py).
STAGES = frozenset({
    "materialize_target", "compat_report", "regenerate_responses", "prepare_data", "capture_hidden_states",
    "build_vocab_map", "train_draft", "export_head", "benchmark", "plot_benchmark",
})


def package_imports(source: str, module: str, modules: set[str], top_level_only: bool = False) -> set[str]:
    """Names of the package's modules that ``source`` (module ``module`` of the package) imports.

    Covers ``from . import x``, ``from .x import y``, ``from .x.y import z``, ``import eagle3build.x``
    and ``from eagle3build import x``; with ``top_level_only`` only the imports executed when
    the module is imported (module body, including ``if``/``try`` blocks, not function or class bodies).
    """
    tree = ast.parse(source)
    if top_level_only:
        nodes, todo = [], list(tree.body)
        while todo:
            n = todo.pop()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            nodes.append(n)
            todo.extend(ast.iter_child_nodes(n))
    else:
        nodes = list(ast.walk(tree))
    found: set[str] = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            for a in n.names:
                parts = a.name.split(".")
                if parts[0] == PACKAGE and len(parts) > 1:
                    found.add(parts[1])
        elif isinstance(n, ast.ImportFrom):
            if n.level == 1 or (n.level == 0 and n.module and n.module.split(".")[0] == PACKAGE):
                parts = (n.module or "").split(".")
                if n.level == 0:
                    parts = parts[1:]
                if parts and parts[0]:
                    found.add(parts[0])
                else:  # from . import x, y / from eagle3build import x, y
                    found.update(a.name for a in n.names)
            elif n.level > 1:
                raise AssertionError(f"{module}: relative import beyond the package (level {n.level})")
    return {m for m in found if m in modules and m != module}


def layer_violations(sources: dict[str, str], stages: frozenset[str] = STAGES) -> list[str]:
    """Every stage->stage and shared->stage import (any depth) in ``sources`` (module name -> source text)."""
    modules = set(sources)
    out = []
    for mod, src in sorted(sources.items()):
        for dep in sorted(package_imports(src, mod, modules)):
            if dep in stages:
                kind = "stage" if mod in stages else "shared module"
                out.append(f"{kind} {mod} imports stage {dep}")
    return out


def import_cycles(sources: dict[str, str]) -> list[list[str]]:
    """Cycles among the top-level imports of ``sources`` (each as a closed list of module names)."""
    modules = set(sources)
    graph = {m: sorted(package_imports(s, m, modules, top_level_only=True)) for m, s in sources.items()}
    cycles, state, stack = [], {}, []

    def visit(m: str) -> None:
        state[m] = "open"
        stack.append(m)
        for d in graph[m]:
            if state.get(d) == "open":
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


def package_sources() -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted(PACKAGE_DIR.glob("*.py")) if p.stem != "__init__"}


def test_every_stage_module_exists():
    assert STAGES <= set(package_sources()), STAGES - set(package_sources())


def test_no_stage_imports_a_stage_and_no_shared_module_imports_a_stage():
    assert layer_violations(package_sources()) == []


def test_no_import_cycle():
    assert import_cycles(package_sources()) == []


@pytest.mark.parametrize("src, expect", [
    ("from .prepare_data import read_tokens\n", ["stage capture_hidden_states imports stage prepare_data"]),
    ("def f():\n    from . import compat_report\n", ["stage capture_hidden_states imports stage compat_report"]),
    ("import eagle3build.train_draft as td\n", ["stage capture_hidden_states imports stage train_draft"]),
    ("from eagle3build import export_head\n", ["stage capture_hidden_states imports stage export_head"]),
    ("class C:\n    def m(self):\n        from .benchmark import x\n", ["stage capture_hidden_states imports stage benchmark"]),
    ("from .tokens import read_tokens\nfrom . import shards\n", []),
])
def test_checker_finds_a_stage_importing_a_stage(src, expect):
    sources = {"capture_hidden_states": src, "prepare_data": "", "compat_report": "", "train_draft": "",
               "export_head": "", "benchmark": "", "tokens": "", "shards": ""}
    assert layer_violations(sources) == expect


def test_checker_finds_a_shared_module_importing_a_stage():
    sources = {"tokens": "def f():\n    from .prepare_data import DataError\n", "prepare_data": "from .tokens import x\n"}
    assert layer_violations(sources) == ["shared module tokens imports stage prepare_data"]


def test_checker_finds_a_cycle_but_not_through_lazy_imports():
    sources = {"a": "from . import b\n", "b": "from .c import x\n", "c": "import eagle3build.a\n", "d": "from . import a\n"}
    assert import_cycles(sources) == [["a", "b", "c", "a"]]
    sources["c"] = "def f():\n    import eagle3build.a\n"
    assert import_cycles(sources) == []
