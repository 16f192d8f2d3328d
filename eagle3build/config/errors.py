"""A config that fails its schema, said in a few lines: every problem at once, each with the key, the file that
sets it, and for an unknown key the closest valid name.

Snakemake's ``validate`` (snakemake.utils) reports a failure with the whole config and the whole schema
(1,700 lines for one misspelled section name), and only its first problem. The Snakefile calls it as before,
since it also fills the schema's defaults in, and where it fails asks ``short_message`` what to say instead;
its full message is shown where the environment sets ``EAGLE3BUILD_FULL_CONFIG_ERRORS=1`` (``FULL_ERRORS_VAR``).

The problems are jsonschema's own (``Draft202012Validator.iter_errors``: every one, in the schema's order),
each narrowed to its most relevant part (``jsonschema.exceptions.best_match``, for a value that fits none of
a ``oneOf``); the closest name is ``difflib.get_close_matches`` over the keys the schema allows at that place
(the standard library's similarity ratio, cutoff 0.6).
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
    the key at ``path`` (its parts: ``["train", "epoch"]``; an int is a list's index: ``["data", "sources", 0,
    "path"]``); None where none does. A config merged over another replaces its lists whole, so what is inside
    a list comes from the source that sets the list."""
    ints = [i for i, part in enumerate(path) if isinstance(part, int)]
    prefix = path[:ints[0]] if ints else path
    for name, tree in sources:
        if _holds(tree, prefix):
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


def problems(config: Mapping, schema: Mapping, sources: Sequence[tuple[str, Mapping]]) -> list[str]:
    """Every way ``config`` fails ``schema`` (a JSON schema, draft 2020-12), one line each, in the schema's
    order; [] where it passes. A line names the key (dotted, a list's item by its index: ``train.epochs``,
    ``data.sources[0].max_sample``), the source that sets it (``source_of``; of an unknown key, that key's; of a
    missing one, the section's), and for a key the schema does not allow, the closest allowed name at that
    place; each unknown key is a line of its own::

        unknown key 'trian' in my.yaml (did you mean 'train'?)
        train.epochs: 'three' is not of type 'integer' in my.yaml
    """
    out: list[str] = []
    for top in jsonschema.Draft202012Validator(schema).iter_errors(config):
        error = jsonschema.exceptions.best_match([top])
        where = list(error.absolute_path)
        allowed = list(error.schema.get("properties", {})) if isinstance(error.schema, Mapping) else []
        unknown = [k for k in error.instance if k not in allowed] if isinstance(error.instance, Mapping) else []
        if error.validator == "additionalProperties" and unknown:
            for key in unknown:
                src = source_of([*where, key], sources)
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f"did you mean {_dotted([*where, close[0]])!r}?" if close else (
                    f"the keys allowed {'in ' + _dotted(where) if where else 'at the top level'}: {', '.join(allowed)}")
                out.append(f"unknown key {_dotted([*where, key])!r}{_in(src)} ({hint})")
            continue
        src = source_of(where, sources) if where else None
        message = error.message if len(error.message) <= MESSAGE_CHARS else error.message[:MESSAGE_CHARS] + "..."
        out.append(f"{_dotted(where)}: {message}{_in(src)}")
    return list(dict.fromkeys(out))


def short_message(config: Mapping, schema: Mapping, sources: Sequence[tuple[str, Mapping]]) -> str | None:
    """What to say for a ``config`` that fails ``schema`` (None where it passes): its one problem
    (``problems``) in one line, or every problem, one a line under a line that counts them::

        config: unknown key 'trian' in my.yaml (did you mean 'train'?); EAGLE3BUILD_FULL_CONFIG_ERRORS=1 shows ...

        config: 2 problems; EAGLE3BUILD_FULL_CONFIG_ERRORS=1 shows Snakemake's full message
        config: unknown key 'trian' in my.yaml (did you mean 'train'?)
        config: unknown key 'benchmark.num_prompt' in my.yaml (did you mean 'benchmark.num_prompts'?)
    """
    found = problems(config, schema, sources)
    if not found:
        return None
    if len(found) == 1:
        return f"config: {found[0]}{SUFFIX}"
    return "\n".join([f"config: {len(found)} problems{SUFFIX}", *(f"config: {p}" for p in found)])


def explain(config: Mapping, schema_file: str | os.PathLike, workflow) -> str | None:
    """``short_message`` for ``config`` against the schema in ``schema_file`` (YAML), with the sources of
    ``workflow`` (a Snakemake workflow: ``config_sources``); None where the user asked for Snakemake's full
    message instead (``full_errors_requested``)."""
    if full_errors_requested():
        return None
    schema = yaml.safe_load(Path(schema_file).read_text())
    return short_message(config, schema, config_sources(workflow))
