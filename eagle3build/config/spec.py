"""The config's keys, each declared once: its JSON schema (type and bounds), default, doc line and the stages
it reaches, with their role there. The only source of

- the config schema, schemas/config.schema.yaml (``json_schema``; generated: ``python -m eagle3build.config.spec
  > schemas/config.schema.yaml``, tests/test_config_spec.py checks the file), which the Snakefile validates the
  config against;
- config.yaml, the shipped default config the Snakefile reads (``config_yaml``: every key at its default, its doc
  as the comment; generated: ``python -m eagle3build.config.spec --config-yaml > config.yaml``, checked the same way);
- the stage contracts' trigger, runtime and file keys and their rerun-trigger params (eagle3build.workflow.contract,
  ``build_contracts``), hence the jobs' settings (``contract.StageSettings``);
- the config fields of the stages' settings objects, their types, defaults (config.yaml's values) and choices
  (eagle3build.config.settings: ``train.trainer.TrainConfig``, the capture's, the data stages' and the
  benchmark's settings).

A key's ``uses`` maps each stage it reaches to its roles there, space-separated: ``trigger`` (a rerun-trigger
param of its own, named by the key's last part), ``trigger:<param>`` (part of the param ``<param>``: a section
of several keys, or a param the contract computes from its keys, such as ``version`` or ``online``;
``trigger:<param>/<name>``: named ``<name>`` in the section, not by its last part),
``runtime`` (read by the job at run time only: a change plans nothing) and ``files`` (decides which files the
stage reads or writes). Adding a config key is one ``Key`` (``key.Key``) in its section's module,
``keys_data`` (run, target, data, capture, vocab), ``keys_head`` (train, export, benchmark,
preflight, staleness) or ``keys_resources``, config.yaml regenerated, and its use; the ``draft`` section is
made from the method registry (``draft_keys``, eagle3build.draft.methods).

Planning imports this module: no torch.
"""

from __future__ import annotations

from typing import Mapping

from ..draft import methods
from .key import ALL_STAGES, ROLES, TARGET_READERS, Key, each  # noqa: F401 - the key declaration, used from here
from .keys_data import DATA_KEYS
from .keys_head import HEAD_KEYS
from .keys_resources import RESOURCE_KEYS

# The sections' one-line docs: the schema's descriptions of the sections, config.yaml's comments on them.
SECTION_DOCS = {
    "target": "the target LLM the head drafts for",
    "data": "the conversations the head is trained on (stages regenerate_responses, prepare_data)",
    "data.regenerate": (
        "opt-in (stage regenerate_responses): replace the assistant turns with the target's own answers, greedy or "
        "sampled"
    ),
    "capture": "the target's hidden states the head is trained on (stage capture_hidden_states; online: train_draft)",
    "capture.online": "read only where capture.mode is online",
    "vocab": "the draft's vocabulary (stage build_vocab_map)",
    "draft": "the draft head's kind and layer (the registries of eagle3build/draft/methods.py)",
    "train": "the head's training (stage train_draft)",
    "export": "the head as vLLM loads it (stage export_head)",
    "benchmark": "vLLM with and without the head, per k (stage benchmark)",
    "preflight": (
        "the pre-flight speed-up bound (results/R/preflight.json, in compat.md): before any training, the target's "
        "step time verifying 1..k+1 tokens per sequence, and the whole step with an untrained head at the "
        "benchmark's k, measured in vLLM engines on the serve job's GPUs (eagle3build/compat/preflight_bound.py)"
    ),
    "staleness": "what replans a stage besides its inputs and settings (docs/staleness.md)",
    "resources": (
        "what each job asks the scheduler for: the one source (profiles only say where jobs run; cluster executors "
        "read gpu_model, threads, mem_mb and runtime from here)"
    ),
    "resources.materialize": "the bundled target's materialize_target job",
    "resources.cpu": "the CPU stages: compat_report, prepare_data, build_vocab_map",
    "resources.capture": "a capture_hidden_states job (one shard)",
    "resources.train": "a train_draft job",
    "resources.serve": (
        "the jobs that serve the target in vLLM: regenerate_responses, export_head, benchmark, preflight_bound"
    ),
}
# draft.method's choices, as speculators and vLLM name them (the registry, eagle3build.draft.methods)
DRAFT_METHODS = list(methods.NAMES)


def draft_keys() -> tuple[Key, ...]:
    """The config's ``draft`` section, from the method registry (``methods.METHODS``): ``draft.method``,
    ``draft.layer`` (the layer registry, ``methods.LAYERS``; in train_draft's ``train`` param as ``layer``
    and the pre-flight's ``preflight`` param as ``draft_layer``), ``draft.compare_methods`` and each method's
    options (``draft.<method>.<option>``, in train_draft's ``train`` param as ``<method>_<option>``). All were added
    after builds existed (``quiet_default``); ``draft.head`` (a given head, issue 72) chooses files only: the inputs
    of compat_report and export_head."""
    registered = methods.METHODS.values()
    return (
        Key(
            "draft.method",
            {"type": "string", "enum": list(methods.METHODS)},
            methods.DEFAULT_METHOD,
            "the draft head's kind, as speculators and vLLM name it: " + " | ".join(m.summary for m in registered)
            + "; one capture serves all three (docs/design/peagle_dflash.md)",
            {"train_draft": "trigger:train"},
            quiet_default=True,
        ),
        Key(
            "draft.layer",
            {"type": "string", "enum": list(methods.LAYERS)},
            methods.DEFAULT_LAYER,
            "the draft's decoder layer, where draft.method is built with it (other methods keep theirs): "
            + " | ".join(x.summary for x in methods.LAYERS.values()),
            {"train_draft": "trigger:train", "preflight_bound": "trigger:preflight/draft_layer",
             "export_head": "trigger:version"},  # its version param: the layer's format_version (contract.version)
            quiet_default=True,
        ),
        Key(
            "draft.compare_methods",
            {"type": "array", "items": {"type": "string", "enum": list(methods.METHODS)}, "uniqueItems": True},
            [],
            (
                "other draft methods trained from this run's shards (results/<run>/methods/<method>/checkpoint and "
                "head, each with this config's settings and its own draft.method) and served beside the run's head in "
                "its benchmark, one baseline, each named by its method: e.g. [peagle, dflash]; [] = none"
            ),
            {"benchmark": "trigger:benchmark"},
            quiet_default=True,
        ),
        Key(
            "draft.head",
            {"type": ["string", "null"], "minLength": 1},
            None,
            (
                "a head folder to benchmark and serve as the run's head, none trained (no capture, vocab map or "
                "training planned): speculators' format (what export writes, vLLM loads; taken as it is) or the EAGLE "
                "repo's EAGLE-3 format (converted by speculators' converter); checked against the target at planning "
                "and in the compat report; null = train the run's head"
            ),
            {"compat_report": "files", "export_head": "files"},
        ),
        *(Key(f"draft.{m.name}.{o.name}", dict(o.schema), o.default, o.doc,
              {"train_draft": f"trigger:train/{m.name}_{o.name}"}, quiet_default=True)
          for m in registered for o in m.options),
    )


KEYS: tuple[Key, ...] = (*DATA_KEYS, *draft_keys(), *HEAD_KEYS, *RESOURCE_KEYS)


# Keys renamed since: old path -> new path. ``upgrade`` moves a config's old key to the new one.
RENAMED = {
    "benchmark.dtype": "target.serve_dtype",  # issue 39: the regeneration and pre-flight read it too
    "target.dtype": "capture.compute_dtype",  # issue 52: dtype keys named for what they set
    "export.dtype": "export.weights_dtype",
}


def upgrade(config: dict, renamed: Mapping[str, str] = RENAMED) -> list[tuple[str, str]]:
    """Move each old key of ``renamed`` present in ``config`` (the workflow's config dict, in place) to its new
    path, over the value there: a config written before the rename names the old key, the default config
    (config.yaml, merged under it) the new one. Returns the ``(old, new)`` paths moved."""
    moved = []
    for old, new in renamed.items():
        *old_parts, old_name = old.split(".")
        parent = config
        for part in old_parts:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or old_name not in parent:
            continue
        value = parent.pop(old_name)
        *new_parts, new_name = new.split(".")
        target = config
        for part in new_parts:
            target = target.setdefault(part, {})
        target[new_name] = value
        moved.append((old, new))
    return moved


DESCRIPTION = (
    "Configuration of the EAGLE-3 draft-head workflow. Every key is required and no other key is "
    "allowed, so a missing or misspelled key stops the run before any job. Generated from "
    "eagle3build/config/spec.py: edit that, not this file."
)
SCHEMA_HEADER = (
    "# Generated from eagle3build/config/spec.py (python -m eagle3build.config.spec > "
    "schemas/config.schema.yaml); do not edit.\n# tests/test_config_spec.py checks it against the "
    "declarations.\n"
)


def key(path: str, keys: tuple[Key, ...] = KEYS) -> Key:
    """The declaration of config key ``path``.

    Raises:
        KeyError: no such key.
    """
    for k in keys:
        if k.path == path:
            return k
    raise KeyError(f"{path!r} is not a config key (eagle3build.config.spec.KEYS)")


def section_keys(section: str, keys: tuple[Key, ...] = KEYS) -> tuple[Key, ...]:
    """The keys directly under ``section`` (``"train"``), in declaration order."""
    return tuple(k for k in keys if k.section == section)


def _tree(keys: tuple[Key, ...]) -> dict:
    """The keys as nested dicts of their path parts (declaration order), a ``Key`` at each leaf.

    Raises:
        ValueError: a key is declared twice, or both a key and a section.
    """
    root: dict = {}
    for k in keys:
        node = root
        *parts, last = k.path.split(".")
        for part in parts:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"{k.path}: {part} is declared as a key and as a section")
        if last in node:
            raise ValueError(f"{k.path}: declared twice")
        node[last] = k
    return root


def json_schema(keys: tuple[Key, ...] = KEYS, section_docs: Mapping[str, str] | None = None) -> dict:
    """The config's JSON schema (draft 2020-12): every section an object of exactly its declared keys, all
    required; each key its ``schema`` with its ``doc`` as description. ``section_docs``: descriptions of
    sections by path (default ``SECTION_DOCS``).

    Raises:
        ValueError: as ``_tree``.
    """
    docs = SECTION_DOCS if section_docs is None else section_docs

    def node(tree: dict, path: str) -> dict:
        out: dict = {"type": "object", "additionalProperties": False, "required": list(tree)}
        if path in docs:
            out["description"] = docs[path]
        out["properties"] = {
            name: (
                dict(sub.schema, **({"description": sub.doc} if sub.doc else {}))
                if isinstance(sub, Key)
                else node(sub, f"{path}.{name}" if path else name)
            )
            for name, sub in tree.items()
        }
        return out

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "description": DESCRIPTION,
        **node(_tree(keys), ""),
    }


def defaults(keys: tuple[Key, ...] = KEYS) -> dict:
    """The config of every key at its default, nested (config.yaml's content)."""

    def fill(tree: dict) -> dict:
        return {name: (sub.default if isinstance(sub, Key) else fill(sub)) for name, sub in tree.items()}

    return fill(_tree(keys))


def schema_yaml(keys: tuple[Key, ...] = KEYS) -> str:
    """``json_schema`` as schemas/config.schema.yaml's text (YAML, keys in declaration order)."""
    import yaml

    return SCHEMA_HEADER + yaml.safe_dump(json_schema(keys), sort_keys=False, width=120, allow_unicode=True)


CONFIG_HEADER = (
    "# Default run: SmolLM2-135M-Instruct (bundled GGUF) + ShareGPT V3 (bundled), sized for a 2-core CPU.\n"
    "# Every key is required and checked against schemas/config.schema.yaml before any job runs; a --configfile\n"
    "# given on the command line is merged over this file.\n"
    "# Generated from the key declarations (eagle3build/config/spec.py, keys_*.py) by\n"
    "#   python -m eagle3build.config.spec --config-yaml > config.yaml\n"
    "# and checked against them by tests/test_config_spec.py: edit the declarations, not this file.\n"
)
COMMENT_COLUMN = 36  # config.yaml's comments start here, or two spaces after a longer line
LINE_WIDTH = 120  # no line of config.yaml is longer (a doc is wrapped onto comment lines)


def _flow(value) -> str:
    """``value`` as one line of YAML (flow style, mappings in their own order)."""
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=2**20, allow_unicode=True)
    return text.removesuffix("\n").removesuffix("\n...").rstrip()


def _commented(line: str, doc: str, width: int = LINE_WIDTH) -> list[str]:
    """``line`` with ``doc`` as its comment, from ``COMMENT_COLUMN`` (or two spaces after ``line``), wrapped onto
    comment lines at the same column so that none passes ``width`` characters (a word longer than that alone
    excepted)."""
    import textwrap

    if not doc:
        return [line]
    col = max(COMMENT_COLUMN, len(line) + 2)
    parts = textwrap.wrap(doc, max(width - col - 2, 20), break_long_words=False, break_on_hyphens=False)
    return [line.ljust(col) + "# " + parts[0], *(" " * col + "# " + p for p in parts[1:])]


def config_yaml(keys: tuple[Key, ...] = KEYS, section_docs: Mapping[str, str] | None = None) -> str:
    """config.yaml's text: ``CONFIG_HEADER``, then every key of ``keys`` at its default (one line of YAML, flow style
    for lists and mappings) in declaration order, nested by section, each with its ``doc`` as the comment, each
    section with its doc of ``section_docs`` (default ``SECTION_DOCS``) where it has one; a blank line before each
    top-level section. ``yaml.safe_load`` of it is ``defaults(keys)``.

    Raises:
        ValueError: as ``_tree``.
    """
    docs = SECTION_DOCS if section_docs is None else section_docs
    lines = CONFIG_HEADER.splitlines()

    def emit(tree: dict, path: str, depth: int) -> None:
        indent = "  " * depth
        for name, sub in tree.items():
            if isinstance(sub, Key):
                lines.extend(_commented(f"{indent}{name}: {_flow(sub.default)}", sub.doc))
                continue
            full = f"{path}.{name}" if path else name
            if not depth:
                lines.append("")
            lines.extend(_commented(f"{indent}{name}:", docs.get(full, "")))
            emit(sub, full, depth + 1)

    emit(_tree(keys), "", 0)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    if sys.argv[1:] not in ([], ["--config-yaml"]):
        sys.exit("usage: python -m eagle3build.config.spec [--config-yaml]: the config schema "
                 "(schemas/config.schema.yaml), or config.yaml with --config-yaml")
    print(config_yaml() if sys.argv[1:] else schema_yaml(), end="")
