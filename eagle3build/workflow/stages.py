"""Each stage as its module declares it, read from the module's source: planning imports no stage (no torch).

A stage is a module ``eagle3build/<group>/<stage>.py`` of a stage subpackage, named after its rule
(``rules/<stage>.smk``), that declares beside its ``OUTPUT_VERSION`` its wiring once, as literals (docs/stage-contracts.md):
``STAGE = {...}`` with

- ``inputs``: the names of the rule's input files that no field of its settings class reads (``plan.check_rules``
  checks the rule against these and those its fields read);
- ``decisions``: the fields of decisions.json it reads besides its settings' fields (dotted); ``packages``: the
  libraries whose versions shape its output (its ``version`` param);
- ``keys``: each config key that reaches it (path -> its roles there, space-separated): ``trigger`` (a rerun-trigger
  param of its own, named by the key's last part), ``trigger:<param>`` (part of the param ``<param>``: a section of
  several keys, or a param computed from its keys; ``trigger:<param>/<name>``: named ``<name>`` in it), ``runtime``
  (read by the job only: a change plans nothing) and ``files`` (decides which files it reads or writes). A path whose
  last parts are ``*`` stands for every key that deep under it (``resources.serve.*``); a ``trigger:<param>/*`` then
  names each by the parts the stars stand for (``draft.*.*``: ``draft.peagle.num_depths`` is ``peagle_num_depths``);
  a path written out is its own over a pattern's. ``staleness.track_package_versions`` reaches every stage with
  packages as part of its ``version`` param;
- ``params``: its params computed from their keys besides ``version``, which every stage has (name -> a maker of
  ``workflow.contract.MAKERS``: ``requested``, ``online``, ...);
- ``entry``: the function the one adapter calls with one object of the class its first parameter is annotated with,
  the stage's settings class, whose own fields name where the job gives them (``config.settings.job``:
  ``tokens_path: str = job("inputs.tokens")``; an input or decisions.json field so read needs no other line);
- ``hosted`` (where its jobs run in a job host, ``workflow.host``): ``{"spec": ..., "load": ...}``, functions of it.

``workflow.contract`` makes each stage's contract from these and the key table.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.key import ROLES, Key

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # eagle3build/


@dataclass(frozen=True)
class Declared:
    """A stage's declaration (the module docstring); ``settings``: the entry's settings class, ``from_job``: its own
    fields' sources (``job_fields.JobField``), ``output_version``: its ``OUTPUT_VERSION``."""

    stage: str
    group: str
    inputs: tuple[str, ...]
    decisions: tuple[str, ...]
    packages: tuple[str, ...]
    keys: Mapping[str, str]
    params: Mapping[str, str]
    entry: str
    settings: str
    from_job: Mapping[str, str]
    hosted: Mapping[str, str] | None
    output_version: int

    @property
    def module(self) -> str:
        """The stage's module, ``eagle3build.<group>.<stage>``."""
        return f"eagle3build.{self.group}.{self.stage}"


def _literal(tree: ast.Module, name: str) -> Any:
    """The value of the top-level ``name = <literal>`` of ``tree``, or None."""
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
            return ast.literal_eval(n.value)
    return None


def settings_of(tree: ast.Module, function: str, where: str) -> tuple[str, dict[str, str]]:
    """The settings class of ``function`` of module ``tree`` (its first parameter's annotation) and the sources of
    that class's own fields (``name: T = job("<source>", ...)``).

    Raises:
        ValueError: no such function, or its first parameter is not annotated with a class of the module (names
            ``where``).
    """
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    args = funcs[function].args.args if function in funcs else []
    cls = classes.get(getattr(args[0].annotation, "id", None)) if args else None
    if cls is None:
        raise ValueError(f"{where}: no function {function}(s: <a settings class of the module>)")
    return cls.name, {n.target.id: ast.literal_eval(n.value.args[0]) for n in cls.body
                      if isinstance(n, ast.AnnAssign) and isinstance(n.value, ast.Call)
                      and getattr(n.value.func, "id", None) == "job"}


def read(path: Path) -> Declared | None:
    """The declaration of the stage module at ``path``; None for a module without ``STAGE``.

    Raises:
        ValueError: ``STAGE`` or ``OUTPUT_VERSION`` is missing or malformed, or its entry is not one (names the file).
    """
    tree = ast.parse(path.read_text())
    st = _literal(tree, "STAGE")
    if st is None:
        return None
    version = _literal(tree, "OUTPUT_VERSION")
    extra = set(st) - {"inputs", "decisions", "packages", "keys", "params", "entry", "hosted"}
    if not isinstance(version, int) or extra or "entry" not in st:
        raise ValueError(f"{path}: a stage module declares OUTPUT_VERSION = <int> and STAGE = {{..., 'entry': ...}} "
                         f"(unknown fields: {sorted(extra)})")
    settings, from_job = settings_of(tree, st["entry"], str(path))
    return Declared(path.stem, path.parent.name, tuple(st.get("inputs", ())), tuple(st.get("decisions", ())),
                    tuple(st.get("packages", ())), dict(st.get("keys", {})), dict(st.get("params", {})), st["entry"],
                    settings, from_job, st.get("hosted"), version)


@functools.cache
def declared(package_dir: Path = PACKAGE_DIR) -> tuple[Declared, ...]:
    """Every stage module's declaration under ``package_dir`` (a module of a subpackage with ``STAGE = {``), by group
    and stage (raises what ``read`` raises)."""
    paths = sorted(p for p in package_dir.glob("*/*.py") if "\nSTAGE = {" in p.read_text())
    return tuple(d for p in paths if (d := read(p)) is not None)


def module_entry(module: str, function: str) -> tuple[str, str, dict[str, str]]:
    """``(entry, settings class, from_job)`` of ``function`` of package module ``module`` (``compat.compat_report``),
    for a rule that runs a stage module's function without being a stage (``settings_of``; raises what it raises)."""
    path = PACKAGE_DIR / f"{module.replace('.', '/')}.py"
    settings, from_job = settings_of(ast.parse(path.read_text()), function, str(path))
    return f"eagle3build.{module}:{function}", f"eagle3build.{module}:{settings}", from_job


def key_roles(d: Declared, keys: tuple[Key, ...]) -> dict[str, tuple[str, ...]]:
    """Each key of ``keys`` that reaches stage ``d`` -> its roles there (the module docstring: patterns expanded, a key
    written out over a pattern, ``staleness.track_package_versions`` in the ``version`` param of a stage with
    packages), in the order of ``keys``.

    Raises:
        ValueError: a key written out is not in ``keys``, a pattern stands for none, or a role is not one of
            ``config.key.ROLES`` (names the stage).
    """
    declared_keys = dict(d.keys)
    if d.packages:
        declared_keys.setdefault("staleness.track_package_versions", "trigger:version")
    parts = {k.path: k.path.split(".") for k in keys}
    out: dict[str, tuple[str, ...]] = {}
    for pattern, roles in declared_keys.items():
        bad = [r for r in roles.split() if r.split(":", 1)[0] not in ROLES]
        if bad:
            raise ValueError(f"stage {d.stage}: key {pattern}: roles {bad} are not among {list(ROLES)}")
        if "*" not in pattern:
            if pattern not in parts:
                raise ValueError(f"stage {d.stage}: its key {pattern!r} is no config key (eagle3build/config/keys_*.py)")
            out[pattern] = tuple(roles.split())
            continue
        pp = pattern.split(".")
        hits = {path: [b for a, b in zip(pp, ps) if a == "*"] for path, ps in parts.items()
                if len(ps) == len(pp) and all(a in ("*", b) for a, b in zip(pp, ps)) and path not in declared_keys}
        if not hits:
            raise ValueError(f"stage {d.stage}: its key {pattern!r} is no config key (eagle3build/config/keys_*.py)")
        out.update({path: tuple(roles.replace("/*", "/" + "_".join(stars)).split()) for path, stars in hits.items()})
    return {path: out[path] for path in parts if path in out}


def trigger_param(roles: tuple[str, ...], name: str) -> tuple[str, bool, str] | None:
    """The rerun-trigger param a key of last part ``name`` with ``roles`` is part of: its name, whether it was given
    (``trigger:<param>``) rather than the key's own (``trigger``), and the key's name in a section param
    (``trigger:<param>/<name>``, else ``name``); None: no trigger."""
    for role in roles:
        if role == "trigger":
            return name, False, name
        if role.startswith("trigger:"):
            param, _, named = role.split(":", 1)[1].partition("/")
            return param, True, named or name
    return None
