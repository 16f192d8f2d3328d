"""The config's keys, each declared once: its JSON schema (type and bounds), default, doc line and the stages
it reaches, with their role there. The only source of

- the config schema, schemas/config.schema.yaml (``json_schema``; generated: ``python -m eagle3build.config.spec
  > schemas/config.schema.yaml``, tests/test_config_spec.py checks the file), which the Snakefile validates the
  config against;
- the stage contracts' trigger, runtime and file keys and their rerun-trigger params (eagle3build.workflow.contract,
  ``build_contracts``), hence the jobs' settings (``contract.StageSettings``);
- the defaults of the stages' settings objects (``train.trainer.TrainConfig``, from section ``train``), which
  are config.yaml's values (the shipped default config; tests/test_config_spec.py checks it holds every key
  at its default).

A key's ``uses`` maps each stage it reaches to its roles there, space-separated: ``trigger`` (a rerun-trigger
param of its own, named by the key's last part), ``trigger:<param>`` (part of the param ``<param>``: a section
of several keys, or a param the contract computes from its keys, such as ``version`` or ``online``;
``trigger:<param>/<name>``: named ``<name>`` in the section, not by its last part),
``runtime`` (read by the job at run time only: a change plans nothing) and ``files`` (decides which files the
stage reads or writes). Adding a config key is one ``Key`` (``config_key.Key``) in its section's module,
``config_keys_data`` (run, target, data, capture, vocab), ``config_keys_head`` (train, export, benchmark,
preflight, staleness) or ``config_keys_resources``, and config.yaml's line, plus its use; the ``draft`` section is
made from the method registry (``draft_keys``, eagle3build.draft.methods).

Planning imports this module: no torch.
"""

from __future__ import annotations

from typing import Mapping

from ..draft import methods as draft_methods
from .key import ALL_STAGES, ROLES, TARGET_READERS, Key, each  # noqa: F401 - the key declaration, used from here
from .keys_data import DATA_KEYS
from .keys_head import HEAD_KEYS
from .keys_resources import RESOURCE_KEYS

SECTION_DOCS = {"resources.cpu": "the CPU stages: compat_report, prepare_data, build_vocab_map"}
# draft.method's choices, as speculators and vLLM name them (the registry, eagle3build.draft.methods)
DRAFT_METHODS = list(draft_methods.NAMES)


def draft_keys() -> tuple[Key, ...]:
    """The config's ``draft`` section, from the method registry (``draft_methods.METHODS``): ``draft.method``,
    ``draft.layer`` (the layer registry, ``draft_methods.LAYERS``; in train_draft's ``train`` param as ``layer``
    and the pre-flight's ``preflight`` param as ``draft_layer``), ``draft.compare_methods`` and each method's
    options (``draft.<method>.<option>``, in train_draft's ``train`` param as ``<method>_<option>``). All were added
    after builds existed (``quiet_default``)."""
    methods = draft_methods.METHODS.values()
    return (
        Key(
            "draft.method",
            {"type": "string", "enum": list(draft_methods.METHODS)},
            draft_methods.DEFAULT_METHOD,
            "the draft head's kind, as speculators and vLLM name it: " + " | ".join(m.summary for m in methods)
            + "; one capture serves all three (docs/design/peagle_dflash.md)",
            {"train_draft": "trigger:train"},
            quiet_default=True,
        ),
        Key(
            "draft.layer",
            {"type": "string", "enum": list(draft_methods.LAYERS)},
            draft_methods.DEFAULT_LAYER,
            "the draft's decoder layer, where draft.method is built with it (other methods keep theirs): "
            + " | ".join(x.summary for x in draft_methods.LAYERS.values()),
            {"train_draft": "trigger:train", "preflight_bound": "trigger:preflight/draft_layer",
             "export_head": "trigger:version"},  # its version param: the layer's format_version (contract.version)
            quiet_default=True,
        ),
        Key(
            "draft.compare_methods",
            {"type": "array", "items": {"type": "string", "enum": list(draft_methods.METHODS)}, "uniqueItems": True},
            [],
            (
                "other draft methods trained from this run's shards (results/<run>/methods/<method>/checkpoint and "
                "head, each with this config's settings and its own draft.method) and served beside the run's head in "
                "its benchmark, each named by its method; [] = none"
            ),
            {"benchmark": "trigger:benchmark"},
            quiet_default=True,
        ),
        *(Key(f"draft.{m.name}.{o.name}", dict(o.schema), o.default, o.doc,
              {"train_draft": f"trigger:train/{m.name}_{o.name}"}, quiet_default=True)
          for m in methods for o in m.options),
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


if __name__ == "__main__":
    print(schema_yaml(), end="")
