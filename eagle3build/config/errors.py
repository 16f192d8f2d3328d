"""A config that fails its schema, said in one line: the key, the file that sets it, and for an unknown
key the closest valid name.

Snakemake's ``validate`` (snakemake.utils) reports a failure with the whole config and the whole schema
(1,700 lines for one misspelled section name). The Snakefile calls it as before, since it also fills the
schema's defaults in, and where it fails asks ``one_line`` what to say instead; its full message is shown
where the environment sets ``EAGLE3BUILD_FULL_CONFIG_ERRORS=1`` (``FULL_ERRORS_VAR``).

The first problem is jsonschema's own choice (``jsonschema.exceptions.best_match``); the closest name is
``difflib.get_close_matches`` over the keys the schema allows at that place (the standard library's
similarity ratio, cutoff 0.6).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import jsonschema
import yaml

FULL_ERRORS_VAR = "EAGLE3BUILD_FULL_CONFIG_ERRORS"
SUFFIX = f"; {FULL_ERRORS_VAR}=1 shows Snakemake's full message"
MESSAGE_CHARS = 300  # jsonschema's message quotes the value: a section's whole mapping is cut here


def full_errors_requested(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the user asked for Snakemake's full validation message (``FULL_ERRORS_VAR`` set, not ``0``)."""
    return environ.get(FULL_ERRORS_VAR, "0") not in ("", "0")


def _holds(tree, path: Sequence) -> bool:
    for part in path:
        if not isinstance(tree, Mapping) or part not in tree:
            return False
        tree = tree[part]
    return True


def source_of(path: Sequence, sources: Sequence[tuple[str, Mapping]]) -> str | None:
    """The name of the first of ``sources`` (``(name, config mapping)``, the one that wins first) that sets
    the key at ``path`` (its parts: ``["train", "epoch"]``); None where none does."""
    for name, tree in sources:
        if _holds(tree, path):
            return name
    return None


def config_sources(workflow) -> list[tuple[str, Mapping]]:
    """What a Snakemake ``workflow`` read its config from, the one that wins first: ``--config`` (named so),
    then the ``--configfile`` files last to first, then the Snakefile's ``configfile:`` files
    (snakemake.workflow.Workflow.configfile: the command line's config is merged over the Snakefile's). A file
    that does not parse (it did for Snakemake) is left out."""
    cli = [str(p) for p in workflow.config_settings.configfiles]
    own = [str(p) for p in workflow.configfiles if str(p) not in cli]
    out: list[tuple[str, Mapping]] = []
    if workflow.config_settings.config:
        out.append(("--config", workflow.config_settings.config))
    for f in [*reversed(cli), *reversed(own)]:
        try:
            out.append((f, yaml.safe_load(Path(f).read_text()) or {}))
        except (OSError, yaml.YAMLError):
            continue
    return out


def _in(source: str | None) -> str:
    return f" in {source}" if source else ""


def _dotted(path: Sequence) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path).replace(".[", "[") or "(top level)"


def one_line(config: Mapping, schema: Mapping, sources: Sequence[tuple[str, Mapping]]) -> str | None:
    """One line for the first way ``config`` fails ``schema`` (a JSON schema, draft 2020-12), None where it
    passes. Names the key (dotted: ``train.epoch``), the source that sets it (``source_of``; of an unknown
    key, that key's; of a missing one, the section's), and for a key the schema does not allow, the closest
    allowed name at that place::

        config: unknown key 'trian' in my.yaml (did you mean 'train'?); EAGLE3BUILD_FULL_CONFIG_ERRORS=1 shows ...
        config: train.epochs: 'three' is not of type 'integer' in my.yaml; EAGLE3BUILD_FULL_CONFIG_ERRORS=1 ...
    """
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(config))
    if error is None:
        return None
    where = list(error.absolute_path)
    allowed = list(error.schema.get("properties", {})) if isinstance(error.schema, Mapping) else []
    unknown = [k for k in error.instance if k not in allowed] if isinstance(error.instance, Mapping) else []
    if error.validator == "additionalProperties" and unknown:
        key = unknown[0]
        src = source_of([*where, key], sources)
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f"did you mean {_dotted([*where, close[0]])!r}?" if close else (
            f"the keys allowed {'in ' + _dotted(where) if where else 'at the top level'}: {', '.join(allowed)}")
        more = f"; {len(unknown) - 1} more unknown there" if len(unknown) > 1 else ""
        return f"config: unknown key {_dotted([*where, key])!r}{_in(src)} ({hint}{more}){SUFFIX}"
    src = source_of(where, sources) if where else None
    message = error.message if len(error.message) <= MESSAGE_CHARS else error.message[:MESSAGE_CHARS] + "..."
    return f"config: {_dotted(where)}: {message}{_in(src)}{SUFFIX}"


def explain(config: Mapping, schema_file: str | os.PathLike, workflow) -> str | None:
    """``one_line`` for ``config`` against the schema in ``schema_file`` (YAML), with the sources of
    ``workflow`` (a Snakemake workflow: ``config_sources``); None where the user asked for Snakemake's full
    message instead (``full_errors_requested``)."""
    if full_errors_requested():
        return None
    schema = yaml.safe_load(Path(schema_file).read_text())
    return one_line(config, schema, config_sources(workflow))
