"""The package's layers: floor packages in a declared order, stage subpackages over them.

Modules are named by their path in the package: ``atomic`` (eagle3build/atomic.py, flat), ``formats.shards``
(eagle3build/formats/shards.py), ``train.train_draft`` (a stage), ``train`` (the subpackage's ``__init__``). A
module's *unit* is its subpackage, or the module itself where it sits flat. The floor's units, lowest first, are
``FLOOR_ORDER``: a floor module imports its own unit's modules and those of units before it, never a later one and
never a stage subpackage. A stage subpackage (``contract.STAGE_GROUPS``) imports the floor and its own private
modules: a stage module (one per Snakemake rule) imports no stage (not even lazily inside a function, not even one
of its own subpackage), a private module imports no stage, no module imports another stage subpackage. The imports
among the package's modules, deferred ones (inside a function) included, have no cycle; at most ``MAX_FLAT``
modules sit flat (the ``FLAT`` ones: what every unit uses); no module passes ``MAX_LINES`` lines. Checked on the
source with ``ast``, without importing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from eagle3build.workflow.contract import STAGE_GROUPS

PACKAGE = "eagle3build"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / PACKAGE

# The modules named after a Snakemake rule (rules/<stage>.smk), by their path.
STAGES = frozenset(f"{group}.{stage}" for stage, group in STAGE_GROUPS.items())
# The floor's units in their order (docs/layout.md): each imports only itself and those before it. formats: the file
# formats; prompt_sets: the benchmark's prompt sets; target: the target loader; hooks: hook capture; draft: the
# draft head; config: the keys; vllm: the engines; workflow: contracts, planning and staleness. The stage
# subpackages sit above them all.
FLOOR_ORDER = ("atomic", "formats", "prompt_sets", "target", "hooks", "draft", "config", "vllm", "workflow")
FLAT = frozenset({"atomic", "target", "hooks"})  # modules flat in eagle3build/, besides __init__
MAX_FLAT = 8


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


def unit(module: str, modules: set[str]) -> str:
    """``module``'s unit: its subpackage (``"train"`` for ``train.trainer`` and for the subpackage ``train``
    itself), or the module itself where it sits flat."""
    return module.split(".")[0]


def layer_violations(sources: dict[str, str], stages: frozenset[str] = STAGES,
                     order: tuple[str, ...] = FLOOR_ORDER) -> list[str]:
    """Every import (any depth) in ``sources`` (module name -> source text) that breaks the layers: a floor unit
    importing a later floor unit or a stage subpackage, a module importing a stage (its own excepted: none), or a
    stage subpackage's module importing another stage subpackage."""
    modules = set(sources)
    rank = {u: i for i, u in enumerate(order)}
    out = []
    for mod, src in sorted(sources.items()):
        own = unit(mod, modules)
        floor = own in rank
        kind = ("stage" if mod in stages else f"{own} module" if floor else "private module")
        for dep in sorted(package_imports(src, mod, modules)):
            du = unit(dep, modules)
            if dep in stages:
                out.append(f"{kind} {mod} imports stage {dep}")
            elif du not in rank:
                if du != own:
                    out.append(f"{kind} {mod} imports {du}'s module {dep}")
            elif floor and rank[du] > rank[own]:
                out.append(f"{kind} {mod} imports {dep}, of {du}, after {own} in the floor's order")
    return out


def floor_units(sources: dict[str, str]) -> set[str]:
    """The units of ``sources`` that are no stage subpackage."""
    return {unit(m, set(sources)) for m in sources} - set(STAGE_GROUPS.values())


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


def test_every_stage_module_exists():
    assert STAGES <= set(package_sources()), STAGES - set(package_sources())


def test_the_floor_is_the_declared_packages_and_few_flat_modules():
    """Every unit below the stages is in ``FLOOR_ORDER``; the flat ones are ``FLAT``, at most ``MAX_FLAT``;
    subpackages are one level deep."""
    sources = package_sources()
    assert floor_units(sources) == set(FLOOR_ORDER)
    flat = {m for m in sources if "." not in m and not any(x.startswith(m + ".") for x in sources)}
    assert flat == FLAT and len(flat) <= MAX_FLAT
    assert all(m.count(".") <= 1 for m in sources)


def test_no_module_breaks_the_layers():
    assert layer_violations(package_sources()) == []


def test_the_floor_order_is_the_one_the_imports_need():
    """Each unit of ``FLOOR_ORDER`` imports only units before it (``test_no_module_breaks_the_layers``), and the pairs
    whose order an import decides are those imports: workflow/ sits above vllm/ because planning lays an engine out
    with ``vllm.engine_args.engine_layout`` and the job sets ``vllm.engine_process.OFFLINE_VARS`` (issue 73), and vllm/
    imports nothing of workflow/ (issue 66)."""
    sources = package_sources()
    modules = set(sources)
    rank = {u: i for i, u in enumerate(FLOOR_ORDER)}
    needs = {(unit(m, modules), unit(d, modules)) for m, s in sources.items() for d in package_imports(s, m, modules)}
    needs = {(u, d) for u, d in needs if u != d and u in rank and d in rank}
    assert all(rank[d] < rank[u] for u, d in needs)
    assert {("workflow", "vllm"), ("vllm", "config"), ("config", "draft"), ("draft", "target"), ("hooks", "target"),
            ("target", "formats"), ("config", "prompt_sets"), ("prompt_sets", "formats"), ("formats", "atomic")} <= needs
    assert not any(u == "vllm" and d == "workflow" for u, d in needs)


def test_a_floor_module_serves_several_subpackages():
    """A module that one stage subpackage's modules use alone lives in that subpackage; the floor holds modules
    of two or more, and tools that no stage imports (``workflow.lockcheck``, a command-line check;
    ``workflow.missing``, ``workflow.plan`` and ``config.errors``, the Snakefile's and rules/common.smk's;
    ``workflow.job`` and its ``workflow.gpu_slots``, the one adapter's, scripts/run_stage.py)."""
    sources = package_sources()
    modules = set(sources)
    imports = {m: package_imports(s, m, modules) for m, s in sources.items()}
    stage_groups = set(STAGE_GROUPS.values())
    lonely = {}
    for f in (m for m in modules if unit(m, modules) not in stage_groups and m not in FLOOR_ORDER):
        users, seen, todo = set(), set(), [f]
        while todo:
            x = todo.pop()
            for m, deps in imports.items():
                if x in deps and m not in seen:
                    seen.add(m)
                    (users.add(unit(m, modules)) if unit(m, modules) in stage_groups else todo.append(m))
        if len(users) == 1:
            lonely[f] = users
    assert lonely == {}


def test_no_import_cycle():
    assert import_cycles(package_sources()) == []


SYNTHETIC = {"capture.capture_hidden_states": "", "data": "", "data.prepare_data": "", "data.chat_masking": "",
             "compat.compat_report": "", "train.train_draft": "", "train.trainer": "", "serve.export_head": "",
             "serve.benchmark": "", "formats": "", "formats.tokens": "", "formats.shards": "", "draft.methods": "",
             "config.spec": "", "atomic": "", "target": ""}
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
    ("from ..formats.tokens import read_tokens\nfrom ..formats import shards\nimport eagle3build.config.spec\n"
     "from .. import atomic\n", []),
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
    ("def f():\n    from ..data.prepare_data import DataError\n", "stage data.prepare_data"),
    ("from ..data import chat_masking\n", "data's module data.chat_masking"),
    ("from eagle3build.train.trainer import Trainer\n", "train's module train.trainer"),
])
def test_checker_finds_a_floor_module_importing_a_stage_subpackage(src, dep):
    sources = {**SYNTHETIC, "formats.tokens": src}
    assert layer_violations(sources, SYNTHETIC_STAGES) == [f"formats module formats.tokens imports {dep}"]


@pytest.mark.parametrize("mod, src, expect", [
    ("formats.tokens", "from ..draft import methods\n",
     ["formats module formats.tokens imports draft.methods, of draft, after formats in the floor's order"]),
    ("draft.methods", "def f():\n    from eagle3build.config import spec\n",
     ["draft module draft.methods imports config.spec, of config, after draft in the floor's order"]),
    ("atomic", "from .formats import shards\n",
     ["atomic module atomic imports formats.shards, of formats, after atomic in the floor's order"]),
    ("config.spec", "from ..draft import methods\nfrom ..formats.tokens import x\nfrom .. import target\n", []),
    ("formats.tokens", "from . import shards\nfrom ..atomic import write_json\n", []),
])
def test_checker_holds_the_floors_order(mod, src, expect):
    sources = {**SYNTHETIC, mod: src}
    assert layer_violations(sources, SYNTHETIC_STAGES) == expect


def test_checker_rejects_a_relative_import_above_the_package():
    with pytest.raises(AssertionError, match="beyond the package"):
        layer_violations({**SYNTHETIC, "atomic": "from ..x import y\n"}, SYNTHETIC_STAGES)


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


WIDE = 10  # parameters: a function taking this many or more is a wide one
MAX_WIDE = 4  # issue 66: 13 such functions, four of them stage entries; a stage takes one settings object now


def wide_functions(sources: dict[str, str], limit: int = WIDE) -> dict[str, int]:
    """``module.function`` (a method or nested function by its qualified name) -> its parameter count, for each
    function of ``sources`` that takes ``limit`` or more: every parameter a caller may pass (``*args`` and ``**kw``
    one each), a method's ``self`` or ``cls`` left out."""
    out = {}

    def visit(node: ast.AST, where: str) -> None:
        for n in ast.iter_child_nodes(node):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{where}.{n.name}"
                if not isinstance(n, ast.ClassDef):
                    a = n.args
                    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                    if isinstance(node, ast.ClassDef) and names[:1] in (["self"], ["cls"]):
                        names = names[1:]
                    count = len(names) + (a.vararg is not None) + (a.kwarg is not None)
                    if count >= limit:
                        out[name] = count
                visit(n, name)
            else:
                visit(n, where)

    for mod, src in sources.items():
        visit(ast.parse(src), mod)
    return out


def test_few_functions_take_ten_parameters_or_more():
    """At most ``MAX_WIDE`` functions of the package take ``WIDE`` parameters or more (issue 66: a stage's entry takes
    its settings object; a run's shapes travel as one object: ``train_data.BatchLayout``, ``trainer.OnlineSettings``);
    those left are an engine's arguments and the capture's."""
    wide = wide_functions(package_sources())
    assert len(wide) <= MAX_WIDE, wide


def test_the_width_check_counts_parameters():
    src = ("def f(a, b, c, d, e, f, g, h, i, *args, **kw):\n    pass\n\n"
           "class C:\n    def m(self, a, b, c, d, e, f, g, h, i):\n        pass\n\n"
           "    def n(self, a, b, c, d, e, f, g, h, i, *, j):\n        def inner(a, b, c, d, e, f, g, h, i, j):\n"
           "            pass\n")
    assert wide_functions({"m": src}) == {"m.f": 11, "m.C.n": 10, "m.C.n.inner": 10}


def unresolved_imports(sources: dict[str, str]) -> list[str]:
    """``module:line name`` for each ``from <package module> import name``, top-level or inside a function, whose
    module has no such attribute or submodule: a name a split moved away (the flat vllm_engine.py's child side went to
    vllm_measure, and two deferred imports of it were left behind)."""
    import importlib

    out = []
    for module, source in sources.items():  # names as package_sources gives them: "atomic", "train.trainer"
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
    src = "def f():\n    from .engine_process import start_engine\n"
    assert unresolved_imports({"vllm.capture": src}) == ["vllm.capture:2 eagle3build.vllm.engine_process.start_engine"]
