"""Typed loaders of the workflow's JSON artifacts, each checked against its JSON schema.

One class per artifact, each with ``load(path)``:

- ``Decisions``: ``results/R/decisions.json`` (``compat_report.decisions``), what the stages act on;
- ``Compat``: ``results/R/compat.json`` (``compat_report.build_report``), the full report;
- ``TrainMeta``: ``checkpoint/train_meta.json`` (``train_draft.train``); ``load`` takes the file or its folder;
- ``HeadMeta``: ``head/head_meta.json`` (``export_head.export``); ``load`` takes the file or its folder;
- ``Benchmark``: ``results/R/benchmark.json`` (``benchmark.benchmark``);
- ``Serving``: ``results/R/serve/serving.json`` (``serve_config.write``), read by serve_check with the other serving
  files (``serving_files.read``); ``load`` takes the file or its folder;
- ``ServeCheck``: ``results/R/serve/serve_check.json`` (``serve_check.serve_check``).

The schemas ship inside the package (``eagle3build/schemas/*.schema.json``, JSON Schema draft
2020-12, https://json-schema.org/draft/2020-12/schema); ``schema_path(name)`` gives one's path.
A file that is not JSON or does not match its schema raises ``ArtifactError``, whose message
names the file and the field (a JSON path such as ``capture.aux_layer_ids[0]``).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"  # eagle3build/schemas/


class ArtifactError(ValueError):
    """An artifact is missing, is not JSON, or does not match its schema (the message names file and field)."""


def schema_path(name: str) -> Path:
    """The path of schema ``name`` (``decisions``, ``compat``, ``train_meta``, ``head_meta``, ``benchmark``,
    ``serving``, ``serve_check``).

    Raises:
        FileNotFoundError: no such schema in ``eagle3build/schemas/``.
    """
    p = SCHEMA_DIR / f"{name}.schema.json"
    if not p.is_file():
        raise FileNotFoundError(f"no schema {name!r} in {SCHEMA_DIR}")
    return p


@functools.lru_cache(maxsize=None)
def schema(name: str) -> dict:
    """The parsed schema ``name`` (cached; see ``schema_path``)."""
    return json.loads(schema_path(name).read_text())


def _field(error) -> str:
    """A jsonschema error's location as ``a.b[0]`` (``<top level>`` for the document itself)."""
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def validate(obj: Any, name: str, source: str | os.PathLike = "<object>") -> None:
    """Check ``obj`` against schema ``name``.

    Raises:
        ArtifactError: ``obj`` does not match; the message names ``source``, the field, what is
            wrong, and the schema file (the most relevant error of all, jsonschema's ``best_match``).
    """
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema(name))
    error = jsonschema.exceptions.best_match(validator.iter_errors(obj))
    if error is not None:
        raise ArtifactError(
            f"{os.fspath(source)}: field {_field(error)}: {error.message} (schema {schema_path(name).name})"
        )


def read(path: str | os.PathLike, name: str) -> dict:
    """Parse the JSON file ``path`` and check it against schema ``name``.

    Raises:
        ArtifactError: the file is missing or unreadable, is not JSON, or does not match the schema.
    """
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ArtifactError(f"{os.fspath(path)}: cannot read the {name} artifact: {e}") from e
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{os.fspath(path)}: not JSON ({e})") from e
    validate(obj, name, path)
    return obj


@dataclass(frozen=True)
class Artifact:
    """A loaded artifact: its ``path`` and parsed ``data`` (``artifact["key"]`` reads ``data``)."""

    path: Path
    data: dict
    SCHEMA: ClassVar[str] = ""
    FILENAME: ClassVar[str] = ""  # set where ``load`` also accepts the artifact's folder

    @classmethod
    def load(cls, path: str | os.PathLike):
        """Read and validate the artifact at ``path`` (or ``path/FILENAME`` when ``path`` is a folder).

        Raises:
            ArtifactError: missing, not JSON, or not matching the schema (file and field named).
        """
        p = Path(path)
        if cls.FILENAME and p.is_dir():
            p = p / cls.FILENAME
        return cls(p, read(p, cls.SCHEMA))

    def __getitem__(self, key: str):
        return self.data[key]


class Decisions(Artifact):
    """``decisions.json``: backend, aux layer ids, storage dtype, head variant and target summary."""

    SCHEMA = "decisions"

    @property
    def target_fingerprint(self) -> str:
        return self.data["target"]["fingerprint"]

    @property
    def target_quantization(self) -> str | None:
        """A quantized target's scheme (``target.quantization.scheme``), None for a dense one."""
        return (self.data["target"].get("quantization") or {}).get("scheme")

    @property
    def target_vocab_size(self) -> int:
        """The target's vocabulary size (tokens)."""
        return self.data["target"]["vocab_size"]

    @property
    def aux_layer_ids(self) -> list[int]:
        """The decoder layers whose hidden states are captured (0-based indices)."""
        return list(self.data["capture"]["aux_layer_ids"])

    @property
    def backend(self) -> str:
        """The capture backend: ``hooks`` or ``vllm``."""
        return self.data["capture"]["backend"]

    @property
    def head_variant(self) -> str:
        """The recommended head variant: ``eagle3`` or ``eagle3.1``."""
        return self.data["head"]["recommended_variant"]


class Compat(Artifact):
    """``compat.json``: the full compat report (probes, versions, target, capture, plans)."""

    SCHEMA = "compat"


class TrainMeta(Artifact):
    """``checkpoint/train_meta.json``: target and vocab fingerprints, aux ids, head variant and flags."""

    SCHEMA = "train_meta"
    FILENAME = "train_meta.json"


class HeadMeta(Artifact):
    """``head/head_meta.json``: train_meta plus served name, dtype, tensor shapes, the vLLM load check."""

    SCHEMA = "head_meta"
    FILENAME = "head_meta.json"


class Benchmark(Artifact):
    """``benchmark.json``: baseline and per-head, per-k runs over the prompt sets."""

    SCHEMA = "benchmark"


class Serving(Artifact):
    """``serve/serving.json``: the serving files' choice (route, k, engine layout, environment, command) and why."""

    SCHEMA = "serving"
    FILENAME = "serving.json"


class ServeCheck(Artifact):
    """``serve/serve_check.json``: the serving files checked through vLLM's server (τ, texts, per-pass figures)."""

    SCHEMA = "serve_check"


def minimal_decisions(target_fingerprint: str, aux_layer_ids: list[int], vocab_size: int,
                      head_variant: str = "eagle3.1", hidden_size: int = 1, backend: str = "hooks") -> dict:
    """A ``decisions.json`` dict valid under its schema, for tests and benchmarks that train or capture
    without running the compat report: the given fingerprint, aux layer ids (0-based), vocabulary size
    (tokens) and head variant; ``num_layers`` is ``max(aux_layer_ids) + 1``.

    Raises:
        ArtifactError: the values do not make a valid decisions.json (e.g. an unknown head variant).
    """
    d = {
        "schema": "eagle3build.decisions/1",
        "target": {"fingerprint": target_fingerprint, "vocab_size": vocab_size,
                   "num_layers": max(aux_layer_ids) + 1, "hidden_size": hidden_size},
        "capture": {"backend": backend, "backend_requested": backend, "aux_layer_ids": list(aux_layer_ids),
                    "aux_layer_ids_requested": list(aux_layer_ids), "storage_dtype": "bfloat16"},
        "head": {"recommended_variant": head_variant},
    }
    validate(d, "decisions", "minimal_decisions()")
    return d
