"""The package's layers: stage subpackages over one shared floor.

Modules are named by their path in the package: ``atomic`` (the floor, eagle3build/atomic.py),
``train.train_draft`` (eagle3build/train/train_draft.py), ``train`` (the subpackage's
``__init__``). A stage module (one per Snakemake rule, ``contract.STAGE_GROUPS``) imports
the floor and its own subpackage's private modules, never a stage (not even lazily inside a
function, not even one of its own subpackage); a private module of a subpackage imports no
stage; no module imports another subpackage's modules; the floor imports no subpackage module;
the imports among the package's modules, deferred ones (inside a function) included, have no cycle; no
module passes ``MAX_LINES`` lines. Checked on the source with ``ast``, without importing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from eagle3build.contract import STAGE_GROUPS

PACKAGE = "eagle3build"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / PACKAGE

# The modules named after a Snakemake rule (rules/<stage>.smk), by their path.
STAGES = frozenset(f"{group}.{stage}" for stage, group in STAGE_GROUPS.items())


def group(module: str, modules: set[str]) -> str | None:
    """The subpackage of ``module`` among ``modules`` (``"train"`` for ``train.trainer`` and for the
    subpackage ``train`` itself); None on the floor."""
    if "." in module or any(m.startswith(module + ".") for m in modules):
        return module.split(".")[0]
    return None


def package_imports(source: str, module: str, modules: set[str], top_level_only: bool = False) -> set[str]:
    """Names of the package's modules that ``source`` (module ``module`` of the package) imports.

    Covers relative imports (``from . import x``, ``from .x import y``, ``from ..x import y``,
    ``from .. import x``) and absolute ones (``import eagle3build.a.b``, ``from eagle3build.a import b``,
    ``from eagle3build import a``); an import of a subpackage's member that is a module counts as
    that module. With ``top_level_only`` only the imports executed when the module is imported
    (module body, including ``if``/``try`` blocks, not function or class bodies).

    Raises:
        AssertionError: a relative import that reaches above the package.
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
    is_package = any(m.startswith(module + ".") for m in modules)
    own_package = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()

    def add(parts: list[str], names: list[str]) -> None:
        members = {".".join(parts + [n]) for n in names} & modules  # from <package> import <module>
        if members:
            found.update(members)
        elif parts and ".".join(parts) in modules:
            found.add(".".join(parts))
        elif len(parts) > 1 and ".".join(parts[:-1]) in modules:  # import eagle3build.a.b.function
            found.add(".".join(parts[:-1]))

    for n in nodes:
        if isinstance(n, ast.Import):
            for a in n.names:
                parts = a.name.split(".")
                if parts[0] == PACKAGE:
                    add(parts[1:], [])
        elif isinstance(n, ast.ImportFrom):
            names = [a.name for a in n.names]
            mod_parts = n.module.split(".") if n.module else []
            if n.level == 0:
                if mod_parts[0] == PACKAGE:
                    add(mod_parts[1:], names)
            else:
                if n.level - 1 > len(own_package):
                    raise AssertionError(f"{module}: relative import beyond the package (level {n.level})")
                add(own_package[:len(own_package) - (n.level - 1)] + mod_parts, names)
    return found - {module}


def layer_violations(sources: dict[str, str], stages: frozenset[str] = STAGES) -> list[str]:
    """Every import (any depth) in ``sources`` (module name -> source text) that breaks the layers."""
    modules = set(sources)
    out = []
    for mod, src in sorted(sources.items()):
        own = group(mod, modules)
        kind = "stage" if mod in stages else "shared module" if own is None else "private module"
        for dep in sorted(package_imports(src, mod, modules)):
            if dep in stages:
                out.append(f"{kind} {mod} imports stage {dep}")
            elif group(dep, modules) not in (None, own):
                out.append(f"{kind} {mod} imports {group(dep, modules)}'s module {dep}")
    return out


def import_cycles(sources: dict[str, str], top_level_only: bool = False) -> list[list[str]]:
    """Cycles among the imports of ``sources`` (each as a closed list of module names): every import, a deferred
    one inside a function too (it ties the two modules as much as a top-level one; only the crash at import time
    is avoided), or with ``top_level_only`` those executed at import."""
    modules = set(sources)
    graph = {m: sorted(package_imports(s, m, modules, top_level_only=top_level_only)) for m, s in sources.items()}
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
    """Every module of the package by name (``atomic``, ``train``, ``train.trainer``), with its source."""
    out = {}
    for p in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(p.relative_to(PACKAGE_DIR).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            out[".".join(parts)] = p.read_text()
    return out


def floor_users(sources: dict[str, str]) -> dict[str, set[str]]:
    """Each floor module of ``sources`` -> the subpackages whose modules import it, directly or through
    floor modules (any depth)."""
    modules = set(sources)
    imports = {m: package_imports(s, m, modules) for m, s in sources.items()}
    out = {}
    for f in (m for m in modules if group(m, modules) is None):
        users, seen, todo = set(), set(), [f]
        while todo:
            x = todo.pop()
            for m, deps in imports.items():
                if x in deps and m not in seen:
                    seen.add(m)
                    (todo.append(m) if group(m, modules) is None else users.add(group(m, modules)))
        out[f] = users
    return out


def test_every_stage_module_exists():
    assert STAGES <= set(package_sources()), STAGES - set(package_sources())


def test_subpackages_are_one_level_deep_and_hold_a_stage():
    modules = set(package_sources())
    groups = {group(m, modules) for m in modules} - {None}
    assert all(m.count(".") <= 1 for m in modules)
    assert groups == set(STAGE_GROUPS.values())


def test_no_module_breaks_the_layers():
    assert layer_violations(package_sources()) == []


def test_a_floor_module_serves_several_subpackages():
    """A module that one subpackage's stages use alone lives in that subpackage; the floor holds modules
    of two or more, and tools that no subpackage imports (``lockcheck``, a command-line check)."""
    lonely = {m: users for m, users in floor_users(package_sources()).items() if len(users) == 1}
    assert lonely == {}


def test_the_floor_check_finds_a_module_of_one_subpackage():
    sources = {"a": "", "b": "from . import a\n", "c": "", "x": "", "x.s": "from ..b import f\nfrom .. import c\n",
               "y": "", "y.t": "def f():\n    from eagle3build import c\n"}
    assert floor_users(sources) == {"a": {"x"}, "b": {"x"}, "c": {"x", "y"}}


def test_no_import_cycle():
    assert import_cycles(package_sources()) == []


SYNTHETIC = {"capture.capture_hidden_states": "", "data": "", "data.prepare_data": "", "data.chat_masking": "",
             "compat.compat_report": "", "train.train_draft": "", "train.trainer": "", "serve.export_head": "",
             "serve.benchmark": "", "tokens": "", "shards": ""}
SYNTHETIC_STAGES = frozenset({"capture.capture_hidden_states", "data.prepare_data", "compat.compat_report",
                              "train.train_draft", "serve.export_head", "serve.benchmark"})


@pytest.mark.parametrize("src, expect", [
    ("from ..data.prepare_data import read_tokens\n",
     ["stage capture.capture_hidden_states imports stage data.prepare_data"]),
    ("def f():\n    from ..compat import compat_report\n",
     ["stage capture.capture_hidden_states imports stage compat.compat_report"]),
    ("import eagle3build.train.train_draft as td\n",
     ["stage capture.capture_hidden_states imports stage train.train_draft"]),
    ("from eagle3build.serve import export_head\n",
     ["stage capture.capture_hidden_states imports stage serve.export_head"]),
    ("class C:\n    def m(self):\n        from ..serve.benchmark import x\n",
     ["stage capture.capture_hidden_states imports stage serve.benchmark"]),
    ("from ..train import trainer\n", ["stage capture.capture_hidden_states imports train's module train.trainer"]),
    ("import eagle3build.data.chat_masking\n",
     ["stage capture.capture_hidden_states imports data's module data.chat_masking"]),
    ("from eagle3build import data\n", ["stage capture.capture_hidden_states imports data's module data"]),
    ("from ..tokens import read_tokens\nfrom .. import shards\nimport eagle3build.shards\n", []),
])
def test_checker_finds_a_stage_importing_a_stage_or_another_subpackage(src, expect):
    sources = {**SYNTHETIC, "capture.capture_hidden_states": src}
    assert layer_violations(sources, SYNTHETIC_STAGES) == expect


def test_checker_finds_a_stage_importing_a_stage_of_its_own_subpackage():
    sources = {**SYNTHETIC, "serve.export_head": "from .benchmark import x\n"}
    assert layer_violations(sources, SYNTHETIC_STAGES) == ["stage serve.export_head imports stage serve.benchmark"]


def test_checker_lets_a_stage_import_its_private_modules():
    sources = {**SYNTHETIC, "data.prepare_data": "from .chat_masking import x\nfrom . import chat_masking\n",
               "train.train_draft": "from eagle3build.train.trainer import Trainer\n"}
    assert layer_violations(sources, SYNTHETIC_STAGES) == []


def test_checker_finds_a_private_module_importing_its_stage():
    sources = {**SYNTHETIC, "train.trainer": "def f():\n    from .train_draft import x\n"}
    assert layer_violations(sources, SYNTHETIC_STAGES) == [
        "private module train.trainer imports stage train.train_draft"]


@pytest.mark.parametrize("src, dep", [
    ("def f():\n    from .data.prepare_data import DataError\n", "stage data.prepare_data"),
    ("from .data import chat_masking\n", "data's module data.chat_masking"),
    ("from eagle3build.train.trainer import Trainer\n", "train's module train.trainer"),
])
def test_checker_finds_a_shared_module_importing_a_subpackage(src, dep):
    sources = {**SYNTHETIC, "tokens": src}
    assert layer_violations(sources, SYNTHETIC_STAGES) == [f"shared module tokens imports {dep}"]


def test_checker_rejects_a_relative_import_above_the_package():
    with pytest.raises(AssertionError, match="beyond the package"):
        layer_violations({**SYNTHETIC, "tokens": "from ..x import y\n"}, SYNTHETIC_STAGES)


def test_checker_finds_a_cycle_through_a_deferred_import_too():
    sources = {"a": "from . import b\n", "b": "from .g.c import x\n", "g.c": "import eagle3build.a\n",
               "d": "from . import a\n"}
    assert import_cycles(sources) == [["a", "b", "g.c", "a"]]
    sources["g.c"] = "def f():\n    import eagle3build.a\n"  # deferred: still a circle (staleness <-> contract was one)
    assert import_cycles(sources) == [["a", "b", "g.c", "a"]]
    assert import_cycles(sources, top_level_only=True) == []
    sources["g.c"] = ""
    assert import_cycles(sources) == []


MAX_LINES = 600  # issue 52: a module past this is split by what its parts do


def long_modules(sources: dict[str, str], limit: int = MAX_LINES) -> dict[str, int]:
    """The modules of ``sources`` of more than ``limit`` lines, with their line counts."""
    return {m: len(s.splitlines()) for m, s in sources.items() if len(s.splitlines()) > limit}


def test_no_module_is_over_600_lines():
    assert long_modules(package_sources()) == {}


def test_the_length_check_counts_lines():
    assert long_modules({"a": "x = 1\n" * 601, "b": "x = 1\n" * 600}) == {"a": 601}


def unresolved_imports(sources: dict[str, str]) -> list[str]:
    """``module:line name`` for each ``from <package module> import name``, top-level or inside a function, whose
    module has no such attribute or submodule: a name a split moved away (vllm_engine's child side went to
    vllm_measure, and two deferred imports of it were left behind)."""
    import importlib

    out = []
    for module, source in sources.items():  # names as package_sources gives them: "vllm_capture", "train.trainer"
        full = f"eagle3build.{module}"
        pkg = full if (PACKAGE_DIR / module.replace(".", "/") / "__init__.py").exists() else full.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "eagle3build":
                target = node.module
            else:
                continue
            mod = importlib.import_module(target)
            for alias in node.names:
                if alias.name != "*" and not hasattr(mod, alias.name):
                    try:
                        importlib.import_module(f"{target}.{alias.name}")
                    except ImportError:
                        out.append(f"{module}:{node.lineno} {target}.{alias.name}")
    return out


def test_every_package_import_resolves():
    assert unresolved_imports(package_sources()) == []


def test_the_import_check_finds_a_moved_name():
    src = "def f():\n    from .vllm_engine import start_engine\n"
    assert unresolved_imports({"vllm_capture": src}) == ["vllm_capture:2 eagle3build.vllm_engine.start_engine"]
