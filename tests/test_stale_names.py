"""No stale names (issue 66): every module path a docstring or comment of the package names exists, no import gives a
project module another name, each package's ``__init__`` names what is in it, and every child-entry string resolves.

A name is a *reference* where a docstring or comment of eagle3build/ writes it in double backquotes as a Python path:
``formats.shards``, ``shards.bytes_per_token``, ``vllm_measure``, ``plans.kv_cache_bytes_per_token``, ``plans.py``.
Modules are named by any tail of their path in the package (``vllm.engine_args`` and ``engine_args``; ``eagle3build.``
before it too); ``stale_references`` checks a reference as follows, and reports each that fails with ``file:line``, the
name and why:

- a bare name is stale where it names a module of the flat layout before issue 59 (``stale_head``): the flat form of a
  package module, ``<subpackage>_<module>`` (``vllm_measure`` for vllm/measure.py, ``config_keys_data``), or any
  ``<subpackage>_<name>`` that is no module and nothing else the package knows (``vllm_engine``: no name its code binds,
  reads or writes as a string, no rule's name, no config key's flat form such as ``draft_layer``, the settings field of
  ``draft.layer``, no artifact field such as ``vllm_reads_flags``); any other bare name is a value, a field or a
  parameter, and is not checked;
- a dotted name (a lowercase head: a capitalised one is a class, ``Head.read``) resolves where it is a module of the
  package followed by attributes (imported and read: ``train.trainer.TrainConfig``, ``contract.StageSettings``; a
  dataclass field counts), a declared config key or section (``train.select``, ``capture.online``;
  eagle3build/config/keys_*.py) or a field path of an artifact schema (``k_schedule.speculative_config`` of
  benchmark.json; eagle3build/schemas/). One that does not resolve is stale where its head names a module of the flat
  layout (as a bare name above: ``vllm_engine.engine_args``), where its head is a package module but neither a variable
  of the module's code nor an installed library (``vllm.LLM`` is vLLM's own), or where its second part is a top-level
  name of a package module that the module's code does not read as an attribute (``plans.plan_online_memory``: the
  function is in ``workflow.budgets``; ``s.require_eval`` where the code reads ``s.require_eval`` is a value's). Other
  dotted names are attributes of values (``fc.weight``), which no table holds;
- a file name ``X.py`` is stale where ``X`` is no module of the package and no file of an installed distribution
  (speculators' ``data.py``); other file names (``benchmark.json``) are artifacts, not checked here.

No exceptions: a reference the rules misread is written so that they read it right.

Imports: in eagle3build/, scripts/, rules/, the Snakefile and benchmarks/, ``import eagle3build.a.b as y`` and
``from eagle3build.a import b as y`` (relative ones too) give the module its own name, ``b`` (an alias of a function
or constant is not checked); in tests/ an alias may abbreviate (``compat_report as cr``) but is no flat form of a
module (``engine_process as vllm_engine``) nor the name of another module.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import io
import json
import re
import tokenize
from pathlib import Path

import pytest

from eagle3build import prompt_sets

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "eagle3build"
PACKAGE_DIR = REPO / PACKAGE
# A Python path in double backquotes: identifiers joined by dots, a trailing dot allowed (``plans.``: a prefix)
REFERENCE = re.compile(r"``([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\.?)``")
# The last part of a file name, not an attribute (``benchmark.json``, ``serve.sh``, ``model.safetensors``)
FILE_SUFFIXES = frozenset({"json", "jsonl", "yaml", "yml", "py", "npy", "png", "md", "sh", "env", "gz", "txt", "tsv",
                           "log", "safetensors", "parquet", "toml", "smk", "rst"})


def package_modules(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    """Every module of the package by its path (``atomic``, ``train``, ``train.trainer``), with its file."""
    out = {}
    for p in sorted(package_dir.rglob("*.py")):
        parts = list(p.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            out[".".join(parts)] = p
    return out


def module_tails(modules) -> dict[str, set[str]]:
    """Each name a module goes by (every tail of its path, and the whole path after ``eagle3build.``) -> the
    modules of that name (``capture`` is the subpackage and vllm/capture.py)."""
    out: dict[str, set[str]] = {}
    for m in modules:
        parts = m.split(".")
        for i in range(len(parts)):
            out.setdefault(".".join(parts[i:]), set()).add(m)
        out.setdefault(f"{PACKAGE}.{m}", set()).add(m)
    out.setdefault(PACKAGE, set()).add("")
    return out


def flat_forms(modules) -> dict[str, str]:
    """The flat form of each module of a subpackage, ``<unit>_<module>`` (``vllm_engine``) -> its path."""
    return {m.replace(".", "_"): m for m in modules if "." in m}


@functools.lru_cache(maxsize=None)
def config_names() -> frozenset[str]:
    """Every declared config key (``train.lr``) and section (``capture.online``, ``train``)."""
    from eagle3build.config.spec import KEYS

    out = set()
    for k in KEYS:
        parts = k.path.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return frozenset(out)


def _schema_paths(node, prefix: str, out: set[str]) -> None:
    if isinstance(node, dict):
        for name, sub in (node.get("properties") or {}).items():
            path = f"{prefix}.{name}" if prefix else name
            out.add(path)
            _schema_paths(sub, path, out)
        for key in ("items", "additionalProperties"):
            _schema_paths(node.get(key), prefix, out)
        for key in ("$defs", "patternProperties"):
            for sub in (node.get(key) or {}).values():
                _schema_paths(sub, "" if key == "$defs" else prefix, out)
        for key in ("oneOf", "anyOf", "allOf"):
            for sub in node.get(key) or []:
                _schema_paths(sub, prefix, out)


@functools.lru_cache(maxsize=None)
def schema_fields() -> frozenset[str]:
    """The field paths of the artifact schemas (eagle3build/schemas/*.json): ``k_schedule.speculative_config``,
    ``capture.aux_layer_ids``."""
    out: set[str] = set()
    for p in sorted((PACKAGE_DIR / "schemas").glob("*.json")):
        _schema_paths(json.loads(p.read_text()), "", out)
    return frozenset(out)


def schema_field_names() -> frozenset[str]:
    """The last parts of ``schema_fields`` (``vllm_reads_flags``)."""
    return frozenset(f.rsplit(".", 1)[-1] for f in schema_fields())


def doc_lines(source: str) -> list[tuple[int, str]]:
    """The lines of ``source``'s docstrings (module, class, function) and comments, with their line numbers."""
    tree = ast.parse(source)
    docs = set()
    for n in [tree, *ast.walk(tree)]:
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value,
                                                                                                    str):
                docs.add(first.lineno)
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and tok.start[0] in docs):
            out.extend((tok.start[0] + i, line) for i, line in enumerate(tok.string.split("\n")))
    return out


def code_names(source: str) -> tuple[set[str], set[str]]:
    """The names ``source``'s code binds other than by an import (parameters, assignments, loop and ``with``
    targets; ``self``, ``cls``), and the attribute names it reads: a reference whose head is one of the first may be
    a value's attribute (``settings.sets``), as may one whose second part is one of the second (``s.require_eval``)."""
    bound, attributes = {"self", "cls"}, set()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            bound.add(n.id)
        elif isinstance(n, ast.Attribute):
            attributes.add(n.attr)
    return bound, attributes


def top_level_names(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each name a package module defines at its top level (function, class, constant) -> those modules."""
    out: dict[str, set[str]] = {}
    for m, p in modules.items():
        for n in ast.parse(p.read_text()).body:
            names = []
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [n.name]
            elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                names = [e.id for t in targets for e in ast.walk(t) if isinstance(e, ast.Name)]
            for name in names:
                out.setdefault(name, set()).add(m)
    return out


def _field(cls, name: str) -> bool:
    """Whether class ``cls`` declares ``name`` as a dataclass field or an annotation (no class attribute then)."""
    return isinstance(cls, type) and any(name in getattr(c, "__dataclass_fields__", {})
                                         or name in getattr(c, "__annotations__", {}) for c in cls.__mro__)


@functools.lru_cache(maxsize=None)
def module_names(module: str) -> frozenset[str]:
    """The names module ``eagle3build.<module>`` binds at its top level, read from its source: functions, classes,
    assignments, imports, and a package's modules."""
    modules = package_modules()
    tree = ast.parse(modules[module].read_text()) if module else ast.parse((PACKAGE_DIR / "__init__.py").read_text())
    out = {m[len(module) + 1 if module else 0:] for m in modules if m.startswith(module + "." if module else "")}
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            out.update(e.id for t in targets for e in ast.walk(t) if isinstance(e, ast.Name))
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
    return frozenset(out)


def _resolves_in(module: str, attrs: list[str]) -> bool:
    """Whether module ``eagle3build.<module>`` holds the attribute chain ``attrs``: attributes, submodules, a class's
    field (what follows a field is its value's, not checked). One name is read from the source (``module_names``);
    a longer chain, or a name the source does not show, from the module imported."""
    if len(attrs) <= 1 and (not attrs or attrs[0] in module_names(module)):
        return True
    obj = importlib.import_module(f"{PACKAGE}.{module}" if module else PACKAGE)
    for a in attrs:
        if hasattr(obj, a):
            obj = getattr(obj, a)
        elif _field(obj, a):
            return True
        elif hasattr(obj, "__path__") and importlib.util.find_spec(f"{obj.__name__}.{a}") is not None:
            obj = importlib.import_module(f"{obj.__name__}.{a}")
        else:
            return False
    return True


def resolves(parts: list[str], tails: dict[str, set[str]]) -> bool:
    """Whether ``parts`` (a dotted reference split) is a package module (by any of its names) and attributes of it."""
    for i in range(len(parts), 0, -1):
        for m in tails.get(".".join(parts[:i]), ()):
            if _resolves_in(m, parts[i:]):
                return True
    return False


@functools.lru_cache(maxsize=None)
def installed_library(name: str) -> bool:
    """Whether ``name`` is a top-level module outside the package (``os``, ``torch``, ``vllm``)."""
    if name == PACKAGE:
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@functools.lru_cache(maxsize=None)
def distribution_files() -> frozenset[str]:
    """The names of the files the installed distributions hold (``data.py``), from their records."""
    out = set()
    for d in importlib.metadata.distributions():
        out.update(Path(str(f)).name for f in d.files or ())
    return frozenset(out)


@dataclasses.dataclass(frozen=True)
class Index:
    """What references resolve against (``package_index``): each module's names (``module_tails``), the flat forms
    of the modules (``flat_forms``), the top-level names (``top_level_names``), the subpackages (``units``), every
    identifier the package's code uses (``known``: names bound, attributes read, string constants, rule names of
    rules/*.smk) and the config keys' flat forms (``config_flats``, ``draft_layer``)."""

    tails: dict[str, set[str]]
    flats: dict[str, str]
    top: dict[str, set[str]]
    units: frozenset[str]
    known: frozenset[str]
    config_flats: frozenset[str]


@functools.lru_cache(maxsize=None)
def package_index() -> Index:
    """The package's ``Index``."""
    modules = package_modules()
    known: set[str] = set()
    for p in modules.values():
        tree = ast.parse(p.read_text())
        bound, attributes = code_names(p.read_text())
        known |= bound | attributes | {n.value for n in ast.walk(tree)
                                       if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for p in (REPO / "rules").glob("*.smk"):
        known |= set(re.findall(r"^rule (\w+):", p.read_text(), re.M))
    top = top_level_names(modules)
    units = frozenset(m.split(".")[0] for m in modules if "." in m)
    return Index(module_tails(modules), flat_forms(modules), top, units, frozenset(known | set(top)),
                 frozenset(c.replace(".", "_") for c in config_names()))


def stale_head(head: str, index: Index) -> str:
    """Why ``head`` (a bare reference, or a dotted one's first part) names a module of the flat layout: the flat
    form of a module (``vllm_measure``), or ``<subpackage>_<name>`` that is no module and nothing else the package
    knows (``vllm_engine``: no name its code uses, no config key's flat form, no artifact field); ``""`` otherwise."""
    if head in index.tails or head in index.config_flats:
        return ""
    if head in index.flats:
        return f"the flat name of {index.flats[head]}"
    unit, _, rest = head.partition("_")
    if rest and unit in index.units and head not in index.known and head not in schema_field_names():
        return f"no module {unit}.{rest}: the flat layout's name"
    return ""


def reference_problem(name: str, names: tuple[set[str], set[str]], index: Index) -> str:
    """Why reference ``name`` in a module whose code has ``names`` (``code_names``) is stale; ``""`` where it is not
    or is not checked (the module docstring's rules)."""
    parts = name.rstrip(".").split(".")
    head = parts[0]
    if len(parts) == 1:
        return stale_head(head, index)
    if head[0].isupper():
        return ""
    if parts[-1] in FILE_SUFFIXES:
        stem = ".".join(parts[:-1])
        if parts[-1] != "py" or stem in index.tails or parts[-2] == "__init__" or name in distribution_files():
            return ""
        return f"no module {stem} in the package"
    if resolves(parts, index.tails):
        return ""
    joined = ".".join(parts)
    if joined in config_names() or joined in schema_fields():
        return ""
    why = stale_head(head, index)
    if why:
        return f"{head} is {why}"
    if head in index.tails:
        if head in names[0] or installed_library(head):
            return ""
        return f"{' or '.join(sorted(index.tails[head]))} has no {'.'.join(parts[1:])}"
    if parts[1] in index.top and parts[1] not in names[1] and not installed_library(head):
        return f"no module {head}; {parts[1]} is in {', '.join(sorted(index.top[parts[1]]))}"
    return ""


def stale_references(files: dict[str, Path] | None = None, root: Path = REPO) -> list[str]:
    """``file:line ``name``: why`` for each stale reference in the docstrings and comments of ``files`` (module path
    -> file, the paths shown relative to ``root``; the package's modules by default), resolved against the package."""
    files = package_modules() if files is None else files
    index = package_index()
    out = []
    for path in sorted(files.values()):
        source = path.read_text()
        names = code_names(source)
        for line_no, line in doc_lines(source):
            for ref in REFERENCE.finditer(line):
                why = reference_problem(ref.group(1), names, index)
                if why:
                    out.append(f"{path.relative_to(root)}:{line_no} ``{ref.group(1)}``: {why}")
    return out


def test_no_docstring_or_comment_names_a_stale_module():
    assert stale_references() == []


def _files(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    """``files`` (module path -> source) written under ``tmp_path``, by module path."""
    out = {}
    for m, src in files.items():
        p = tmp_path / (m.replace(".", "/") + ".py")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(src)
        out[m] = p
    return out


@pytest.mark.parametrize("doc, expect", [
    ("``vllm_measure`` decodes", ["``vllm_measure``: the flat name of vllm.measure"]),
    ("``vllm_engine.engine_args``",
     ["``vllm_engine.engine_args``: vllm_engine is no module vllm.engine: the flat layout's name"]),
    ("``vllm_engine``, ``draft_methods``", ["``vllm_engine``: no module vllm.engine: the flat layout's name",
                                            "``draft_methods``: the flat name of draft.methods"]),
    ("see ``plans.kv_cache_bytes_per_token``",
     ["``plans.kv_cache_bytes_per_token``: no module plans; kv_cache_bytes_per_token is in target"]),
    ("``budgets.no_such_function``", ["``budgets.no_such_function``: workflow.budgets has no no_such_function"]),
    ("in ``plans.py``", ["``plans.py``: no module plans in the package"]),
    ("``config_key.Key``", ["``config_key.Key``: config_key is the flat name of config.key"]),
    ("``formats.shards.bytes_per_token``, ``shards.ShardMeta``, ``eagle3build.atomic``, ``workflow.contract``", []),
    ("``config.key.Key.quiet_default``, ``config.settings.settings_class``, ``artifacts.Benchmark.SCHEMA``, ``budgets``", []),
    ("``train.select``, ``capture.online``, ``k_schedule.speculative_config``, ``draft_layer``, ``fc.weight``", []),
    ("``vllm.LLM``, ``torch.compile``, ``benchmark.json``, ``Head.read``, ``speculative_config``, ``trainer.py``", []),
])
def test_the_checker_finds_a_stale_reference(tmp_path, doc, expect):
    files = _files(tmp_path, {"atomic": f'"""{doc}"""\n', "formats.tokens": f"x = 1  # {doc}\n"})
    assert stale_references(files, tmp_path) == ([f"atomic.py:1 {e}" for e in expect]
                                                 + [f"formats/tokens.py:1 {e}" for e in expect])


def test_the_checker_reads_a_variable_of_a_module_name_as_a_value(tmp_path):
    """``layer.forward`` where ``layer`` is a variable of the module's code: an attribute of the value, not of
    draft.layer; not where nothing in the module's code is called ``layer``."""
    src = '"""``layer.forward``, ``layer.forward.x``."""\n\n\ndef f(layer):\n    return layer\n'
    assert stale_references(_files(tmp_path, {"atomic": src}), tmp_path) == []
    src = '"""``layer.forward``."""\n'
    assert stale_references(_files(tmp_path, {"atomic": src}), tmp_path) == [
        "atomic.py:1 ``layer.forward``: draft.layer has no forward"]


def test_the_checker_reads_docstrings_and_comments_only(tmp_path):
    src = ('MESSAGE = "``vllm_engine``"\n\n\ndef f():\n    """``vllm_capture``"""\n'
           '    return "``vllm_measure``"  # ``plans.py``\n')
    assert stale_references(_files(tmp_path, {"atomic": src}), tmp_path) == [
        "atomic.py:5 ``vllm_capture``: the flat name of vllm.capture",
        "atomic.py:6 ``plans.py``: no module plans in the package"]


# Where no import may give a project module another name; tests/ are held to ``test_aliases_in_tests_name_no_module``
ALIAS_FREE = ("eagle3build", "scripts", "rules", "benchmarks", "Snakefile")


def source_files(roots=ALIAS_FREE, repo: Path = REPO) -> list[Path]:
    """The Python files (``*.py``, ``*.smk``, the Snakefile) under ``roots`` (folders or files of ``repo``)."""
    out = []
    for r in roots:
        p = repo / r
        out += [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.suffix in (".py", ".smk"))
    return out


def _smk_python(source: str) -> str:
    """The Python of a Snakemake file that ``ast`` reads: its import lines (a rule's body is not Python)."""
    return "\n".join(line if re.match(r"\s*(from\s+\S+\s+)?import\s", line) else "" for line in source.splitlines())


def module_aliases(source: str, own: str | None = None, modules=None) -> list[tuple[int, str, str]]:
    """``(line, module, alias)`` for each import in ``source`` that binds a package module (``module``: its path in the
    package, ``vllm.engine_process``) to a name not its own: ``import eagle3build.a.b as y``, ``from eagle3build.a
    import b as y``, ``from ..a import b as y`` (relative to ``own``, the path of the module ``source`` is in the
    package, ``serve.benchmark``; a package's ``__init__`` as ``serve.__init__``)."""
    modules = set(package_modules()) if modules is None else modules
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Import):
            for a in n.names:
                parts = a.name.split(".")
                if a.asname and parts[0] == PACKAGE and ".".join(parts[1:]) in modules and a.asname != parts[-1]:
                    out.append((n.lineno, ".".join(parts[1:]), a.asname))
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                if own is None:
                    continue
                base = own.split(".")[:-n.level]
                parts = base + (n.module.split(".") if n.module else [])
            elif n.module and n.module.split(".")[0] == PACKAGE:
                parts = n.module.split(".")[1:]
            else:
                continue
            for a in n.names:
                target = ".".join(parts + [a.name])
                if a.asname and target in modules and a.asname != a.name:
                    out.append((n.lineno, target, a.asname))
    return out


def file_aliases(path: Path) -> list[tuple[int, str, str]]:
    """``module_aliases`` of the file ``path``: a module of the package, a script, a Snakemake file (its imports)."""
    source = path.read_text()
    if path.suffix == ".smk" or path.name == "Snakefile":
        source = _smk_python(source)
    try:
        own = ".".join(path.resolve().relative_to(PACKAGE_DIR).with_suffix("").parts)
    except ValueError:
        own = None
    return module_aliases(source, own)


def test_no_import_renames_a_project_module():
    """In eagle3build/, scripts/, rules/, the Snakefile and benchmarks/, a project module imported is called by its own
    name (``from ..vllm import engine_process``, never ``engine_process as vllm_engine``)."""
    found = [f"{p.relative_to(REPO)}:{line} {module} as {alias}" for p in source_files()
             for line, module, alias in file_aliases(p)]
    assert found == []


def test_aliases_in_tests_name_no_module():
    """A test may abbreviate a module (``compat_report as cr``), but not under the flat name of a module
    (``engine_process as vllm_engine``), nor under its subpackage's name and more (``config_errors``), nor under another
    module's name."""
    index = package_index()
    found = [f"{p.relative_to(REPO)}:{line} {module} as {alias}" for p in source_files(("tests",))
             for line, module, alias in file_aliases(p)
             if alias in index.flats or alias.startswith(f"{module.split('.')[0]}_")
             or (alias in index.tails and module not in index.tails[alias])]
    assert found == []


@pytest.mark.parametrize("src, expect", [
    ("from ..vllm import engine_process as vllm_engine\n", [(1, "vllm.engine_process", "vllm_engine")]),
    ("from eagle3build.draft import methods as draft_methods\n", [(1, "draft.methods", "draft_methods")]),
    ("import eagle3build.config.spec as config_spec\n", [(1, "config.spec", "config_spec")]),
    ("def f():\n    from . import openai_server as server\n", [(2, "serve.openai_server", "server")]),
    ("from .. import target as t\nfrom ..vllm.engine_args import engine_args as args\n", [(1, "target", "t")]),
    ("from ..vllm import engine_process\nfrom ..formats.artifacts import validate as validate_artifact\n"
     "import numpy as np\nfrom eagle3build.config import spec\nfrom .serving_files import check as check_files\n", []),
])
def test_the_alias_check_finds_a_renamed_module(src, expect):
    assert module_aliases(src, "serve.benchmark") == expect


def test_the_alias_check_reads_a_snakefile(tmp_path):
    p = tmp_path / "common.smk"
    p.write_text("import os\nfrom eagle3build.config import spec as config_spec\n\n\nrule x:\n    input:\n"
                 "        'a',\n")
    assert file_aliases(p) == [(2, "config.spec", "config_spec")]


def undescribed_modules(modules: dict[str, Path] | None = None) -> dict[str, list[str]]:
    """Each package (``""`` for eagle3build itself) whose ``__init__`` docstring does not name, in double backquotes,
    each module and subpackage directly in it (``engine_args``; ``method.DraftMethod`` names ``method`` too; a prompt
    set's module is named by its registry), with those it leaves out."""
    modules = package_modules() if modules is None else modules
    packages = {m.rsplit(".", 1)[0] if "." in m else "" for m in modules}
    out = {}
    for pkg in sorted(packages):
        init = (PACKAGE_DIR / pkg.replace(".", "/") / "__init__.py") if pkg else PACKAGE_DIR / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        named = {part for ref in REFERENCE.findall(doc) for part in ref.rstrip(".").split(".")}
        members = sorted({m[len(pkg) + 1 if pkg else 0:].split(".")[0] for m in modules
                          if (m.startswith(pkg + ".") if pkg else True) and m != pkg})
        # a set module of prompt_sets is named by the registry it joins (prompt_sets.SETS): adding one is one module
        missing = [m for m in members if m not in named and not (pkg == "prompt_sets" and m in prompt_sets.SETS)]
        if missing:
            out[pkg] = missing
    return out


def test_each_package_docstring_names_what_is_in_it():
    """Each package's ``__init__`` says what is in it now: its docstring names every module and subpackage in it
    (eagle3build/__init__.py the stage subpackages and the floor's units)."""
    assert undescribed_modules() == {}


ENTRY = re.compile(rf"^{PACKAGE}(\.[A-Za-z_]\w*)+:[A-Za-z_]\w*$")


def entry_strings(roots=("eagle3build", "benchmarks")) -> list[tuple[str, int, str]]:
    """``(file, line, entry)`` for each string constant of the form ``"eagle3build.<module>:<function>"`` in the Python
    files under ``roots``: the entries of engine child processes (``engine_process.run_child``'s first argument:
    ``measure.RUN_ENTRY``, ``k_schedule.SWEEP_ENTRY``, ``preflight_bound.ENTRY``, ...) and the stages' entries
    (``contract.CONTRACTS``)."""
    out = []
    for p in source_files(roots):
        if p.suffix != ".py":
            continue
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and ENTRY.match(n.value):
                out.append((str(p.relative_to(REPO)), n.lineno, n.value))
    return out


def entry_problem(entry: str) -> str:
    """Why ``"module:function"`` does not resolve as ``python -m eagle3build.vllm.engine_process run`` resolves it
    (import the module, get the attribute, a callable); ``""`` where it does."""
    module, _, function = entry.partition(":")
    try:
        obj = getattr(importlib.import_module(module), function)
    except ImportError as e:
        return f"no module {module}: {e}"
    except AttributeError:
        return f"{module} has no {function}"
    return "" if callable(obj) else f"{entry} is not callable"


def test_every_child_entry_resolves():
    """Every ``module:function`` string of the package and benchmarks/ names a function that is there: a moved
    function would otherwise fail only inside an engine's child process, after the engine's minutes of start-up."""
    entries = entry_strings()
    assert {e for _, _, e in entries} >= {"eagle3build.vllm.measure:decode_greedy",
                                          "eagle3build.vllm.capture:run_capture",
                                          "eagle3build.serve.openai_server:bench_serve"}
    assert [f"{f}:{line} {e}: {why}" for f, line, e in entries if (why := entry_problem(e))] == []


def test_the_entry_check_finds_a_moved_function():
    assert entry_problem("eagle3build.vllm.measure:decode_greedy") == ""
    assert entry_problem("eagle3build.vllm.engine_process:decode_greedy") == (
        "eagle3build.vllm.engine_process has no decode_greedy")
    assert entry_problem("eagle3build.vllm.engine:run_child").startswith("no module eagle3build.vllm.engine")
    assert entry_problem("eagle3build.vllm.measure:RUN_ENTRY") == "eagle3build.vllm.measure:RUN_ENTRY is not callable"
