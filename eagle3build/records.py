"""Records of measured figures (issue 51): one small JSON per figure the docs cite.

A record says what made a figure (the driver's record name and its command, the Snakemake config files and
targets, or a script and its arguments), the commit, the versions of vLLM, torch, transformers and speculators,
the hardware (card, GPU count, host CPU count), the date and the result fields the docs quote, flattened to
dotted keys (``k3.tau.chat``, ``k3.speedup.all``, ``schedule.c16.speedup``). Records live in
``benchmarks/records/<name>_<card>.json`` (``card``: ``h100``, ``h200``, ``cpu``, ...); a record may name one
compressed archive beside it (``archive``) where a reader needs the raw log.

The record format is checked by ``RECORD_SCHEMA`` (jsonschema, as Snakemake's ``validate`` checks configs).
"""
from __future__ import annotations

import datetime as _dt
import json
import re
from pathlib import Path
from typing import Any, Mapping

import jsonschema

from eagle3build.atomic import write_json

RECORD_VERSION = 1
VERSION_KEYS = ("vllm", "torch", "transformers", "speculators")

RECORD_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["record_version", "name", "made_by", "commit", "date", "versions", "hardware", "results"],
    "additionalProperties": False,
    "properties": {
        "record_version": {"const": RECORD_VERSION},
        "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]*$"},
        "made_by": {
            "type": "object", "required": ["command"], "additionalProperties": False,
            "properties": {
                "command": {"type": "string", "minLength": 1},
                "configfiles": {"type": "array", "items": {"type": "string"}},
                "targets": {"type": "array", "items": {"type": "string"}},
                "script": {"type": "string"},
                "args": {"type": "array", "items": {"type": "string"}},
            },
        },
        "commit": {"type": "string", "pattern": "^[0-9a-f]{7,40}$"},
        "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
        "versions": {
            "type": "object", "required": list(VERSION_KEYS),
            "properties": {k: {"type": ["string", "null"]} for k in VERSION_KEYS},
        },
        "hardware": {
            "type": "object", "required": ["card", "gpus", "host_cpus"], "additionalProperties": False,
            "properties": {
                "card": {"type": "string", "minLength": 1},
                "gpus": {"type": "integer", "minimum": 0},
                "host_cpus": {"type": ["integer", "null"], "minimum": 1},
            },
        },
        "results": {
            "type": "object", "minProperties": 1,
            "additionalProperties": {"type": ["number", "string", "boolean", "null"]},
        },
        "archive": {"type": "string"},
        "notes": {"type": "string"},
    },
}


class RecordError(ValueError):
    """A record file that does not follow ``RECORD_SCHEMA``; the message names the file and the field."""


def card_slug(card: str) -> str:
    """``"NVIDIA H200"`` -> ``"h200"``, ``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``, ``"cpu"`` -> ``"cpu"``: the card
    part of a record's file name (the first word with a digit, lower-cased; else the name lower-cased)."""
    words = [w for w in re.split(r"[\s_]+", card) if w and w.upper() != "NVIDIA"]
    digit = next((w for w in words if any(c.isdigit() for c in w)), None)
    return re.sub(r"[^a-z0-9-]", "", (digit or "-".join(words) or "cpu").lower())


def validate_record(record: Mapping[str, Any], where: str = "record") -> None:
    """Check ``record`` against ``RECORD_SCHEMA``.

    Raises:
        RecordError: naming ``where`` (the file) and the failing field's path.
    """
    try:
        jsonschema.validate(dict(record), RECORD_SCHEMA)
    except jsonschema.ValidationError as e:
        field = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        raise RecordError(f"{where}: field {field}: {e.message}") from None


def load_records(folder: str | Path) -> dict[str, dict]:
    """Every ``*.json`` record in ``folder``, validated, keyed by file stem (``recipe_h200``).

    Raises:
        RecordError: a file is not JSON or fails the schema (the message names it).
    """
    out = {}
    for path in sorted(Path(folder).glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise RecordError(f"{path}: not JSON: {e}") from None
        validate_record(rec, str(path))
        out[path.stem] = rec
    return out


def _round(x: Any, nd: int = 4) -> Any:
    return round(x, nd) if isinstance(x, float) else x


def head_runs(bench: Mapping[str, Any]) -> list[dict]:
    """The served-head runs of a benchmark.json: its ``heads`` list where the file has one (benchmark output 8 and
    newer), else its ``eagle3`` list (older files). Each run carries ``num_speculative_tokens``; compared heads carry
    ``head``. Raises KeyError where the file has neither."""
    return list(bench["heads"] if "heads" in bench else bench["eagle3"])


def summarise_benchmark(bench: Mapping[str, Any]) -> dict[str, Any]:
    """The figures a record quotes from one benchmark.json (serve/benchmark.py's output), flattened.

    Keys: ``concurrency``, ``num_prompts``, ``max_tokens``, ``baseline.tokens_per_s``; per served run
    ``<head.>k<k>.tau.<set|all>`` (mean acceptance length τ, tokens), ``...speedup.<set|all>`` (output tokens/s
    with the head over the target alone, same prompts, one job), ``...lossless``; the run's own head has no
    ``<head.>`` prefix, a compared head is prefixed by its name. With a ``k_schedule`` block:
    ``schedule.c<c>.speedup``, ``schedule.c<c>.best_k``, ``schedule.never_slower``, ``sweep.k<k>.c<c>.speedup``.
    Values are floats rounded to 4 places, ints, bools or None (τ where nothing was drafted).
    """
    s = bench["settings"]
    out: dict[str, Any] = {"concurrency": s["concurrency"], "num_prompts": s["num_prompts"],
                           "max_tokens": s["max_tokens"],
                           "baseline.tokens_per_s": _round(bench["baseline"]["output_tokens_per_s"], 2)}
    for r in head_runs(bench):
        head = r.get("head")
        pre = (f"{head}." if head and head not in ("eagle3", "own") else "") + f"k{r['num_speculative_tokens']}."
        out[pre + "tau.all"] = _round(r.get("mean_acceptance_length"))
        out[pre + "speedup.all"] = _round(r["speedup"])
        out[pre + "lossless"] = bool(r["lossless"])
        for name, v in r["sets"].items():
            out[pre + f"tau.{name}"] = _round(v.get("mean_acceptance_length"))
            out[pre + f"speedup.{name}"] = _round(v["speedup"])
        if r.get("method"):
            out[pre + "method"] = r["method"]
    ks = bench.get("k_schedule")
    if ks:
        for c, v in ks["scheduled"].items():
            out[f"schedule.c{c}.speedup"] = _round(v["speedup"])
            out[f"schedule.c{c}.best_k"] = ks["best_k"][c]
        out["schedule.never_slower"] = bool(ks["never_slower"])
        for sw in ks["sweep"]:
            for c, v in sw["by_concurrency"].items():
                out[f"sweep.k{sw['k']}.c{c}.speedup"] = _round(v["speedup"])
                out[f"sweep.k{sw['k']}.c{c}.tau"] = _round(v.get("mean_acceptance_length"))
        out["baseline_sweep.tokens_per_s"] = ";".join(
            f"c{c}={_round(v['output_tokens_per_s'], 1)}" for c, v in ks["baseline"]["by_concurrency"].items())
    return out


def summarise_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """From a checkpoint's metrics.json (train/train_metrics.py): ``train.epochs``, ``train.tau_sim`` (the last
    epoch's eval ``simulated_acceptance_length``, tokens), ``train.seconds`` and ``train.tokens_per_s`` of the
    training process; keys the file lacks are left out."""
    out: dict[str, Any] = {}
    epochs = metrics.get("epochs") or []
    if epochs:
        out["train.epochs"] = len(epochs)
        tau = (epochs[-1].get("eval") or {}).get("simulated_acceptance_length")
        if tau is not None:
            out["train.tau_sim"] = _round(tau)
    for key in ("seconds", "tokens_per_s"):
        if isinstance(metrics.get(key), (int, float)):
            out[f"train.{key}"] = _round(float(metrics[key]), 1)
    return out


def make_record(name: str, *, command: str, commit: str, versions: Mapping[str, Any], hardware: Mapping[str, Any],
                results: Mapping[str, Any], date: str | None = None, configfiles: list[str] | None = None,
                targets: list[str] | None = None, notes: str | None = None) -> dict:
    """One record (``RECORD_SCHEMA``). ``hardware`` as ``provenance.hardware()`` or a benchmark.json's
    ``hardware`` (``gpus``: card names; ``cpu_count``); the card is the first GPU's name, ``cpu`` without one.

    Raises:
        RecordError: the result fails the schema.
    """
    gpus = list(hardware.get("gpus") or [])
    made_by: dict[str, Any] = {"command": command}
    if configfiles:
        made_by["configfiles"] = list(configfiles)
    if targets:
        made_by["targets"] = list(targets)
    rec = {"record_version": RECORD_VERSION, "name": name, "made_by": made_by, "commit": commit,
           "date": date or _dt.date.today().isoformat(),
           "versions": {k: (versions.get(k) or None) for k in VERSION_KEYS},
           "hardware": {"card": gpus[0] if gpus else "cpu", "gpus": len(gpus), "host_cpus": hardware.get("cpu_count")},
           "results": dict(results)}
    if notes:
        rec["notes"] = notes
    validate_record(rec, f"record {name}")
    return rec


def write_record(folder: str | Path, record: Mapping[str, Any]) -> Path:
    """Write ``record`` atomically as ``folder/<name>_<card>.json`` and return the path."""
    path = Path(folder) / f"{record['name']}_{card_slug(record['hardware']['card'])}.json"
    write_json(path, dict(record))
    return path
