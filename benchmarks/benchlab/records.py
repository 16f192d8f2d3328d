"""Records of measured figures (issue 51): one small JSON per figure the docs cite.

A record says what made a figure (the driver's record name and its command, the Snakemake config files and
targets, or a script and its arguments), the commit, the versions of vLLM, torch, transformers and speculators,
the hardware (card, GPU count, host CPU count), the date and the result fields the docs quote, flattened to
dotted keys (``k3.tau.chat``, ``k3.tau.mtbench.coding``, ``k3.speedup.all``, ``schedule.c16.speedup``). Records
live in ``benchmarks/records/<name>_<card>.json`` (``card``: ``h100``, ``h200``, ``cpu``, ...); a record may name one
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
from eagle3build.formats.benchmark_runs import OWN_HEAD, benchmark_runs, category_figures

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


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """A JSON value as dotted keys (``{"a": {"b": [1, 2]}}`` -> ``{"a.b.0": 1, "a.b.1": 2}``), floats rounded to 7
    significant places; for a record's ``results`` from an output the summaries do not cover (preflight.json)."""
    if isinstance(obj, Mapping):
        items = obj.items()
    elif isinstance(obj, list):
        items = enumerate(obj)
    else:
        return {prefix: float(f"{obj:.7g}") if isinstance(obj, float) else obj}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _round(x: Any, nd: int = 4) -> Any:
    return round(x, nd) if isinstance(x, float) else x


def summarise_benchmark(bench: Mapping[str, Any]) -> dict[str, Any]:
    """The figures a record quotes from one benchmark.json (serve/benchmark.py's output), flattened.

    Keys: ``concurrency``, ``num_prompts``, ``max_tokens``, ``baseline.tokens_per_s``; per served run
    ``<head.>k<k>.tau.<set|all>`` (mean acceptance length τ, tokens), ``...speedup.<set|all>`` (output tokens/s
    with the head over the target alone, same prompts, one job), per category of a set decoded by category
    (``mtbench``) ``...tau.<set>.<category>`` and ``...speedup.<set>.<category>``, ``...lossless``
    (``outputs_identical`` in outputs older than the lossless check; left out where the file has neither); the run's
    own head has no
    ``<head.>`` prefix, a compared head is prefixed by its name. With a ``k_schedule`` block:
    ``schedule.c<c>.speedup``, ``schedule.c<c>.best_k``, ``schedule.never_slower``, ``sweep.k<k>.c<c>.speedup``.
    Values are floats rounded to 4 places, ints, bools or None (τ where nothing was drafted).
    """
    s = bench["settings"]
    out: dict[str, Any] = {"concurrency": s["concurrency"], "num_prompts": s["num_prompts"],
                           "max_tokens": s["max_tokens"],
                           "baseline.tokens_per_s": _round(bench["baseline"]["output_tokens_per_s"], 2)}
    for r in benchmark_runs(dict(bench)):  # "runs", or "eagle3" before issue 55
        head = r.get("head")
        pre = (f"{head}." if head and head != OWN_HEAD else "") + f"k{r['num_speculative_tokens']}."
        out[pre + "tau.all"] = _round(r.get("mean_acceptance_length"))
        out[pre + "speedup.all"] = _round(r["speedup"])
        lossless = r.get("lossless", r.get("outputs_identical"))  # older outputs: outputs_identical only
        if lossless is not None:
            out[pre + "lossless"] = bool(lossless)
        for name, v in r["sets"].items():
            out[pre + f"tau.{name}"] = _round(v.get("mean_acceptance_length"))
            if "speedup" in v:
                out[pre + f"speedup.{name}"] = _round(v["speedup"])
        for name, by_cat in category_figures(r).items():
            for cat, f in by_cat.items():
                out[pre + f"tau.{name}.{cat}"] = _round(f["tau"])
                out[pre + f"speedup.{name}.{cat}"] = _round(f["speedup"])
        if r.get("method"):
            out[pre + "method"] = r["method"]
        if r.get("draft_layer"):
            out[pre + "draft_layer"] = r["draft_layer"]
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


PREFLIGHT_ROW = ("step_ms", "decode_step_ms", "draft_ms_per_token", "step_cost_ratio", "tau_break_even", "step_source")


def summarise_preflight(pre: Mapping[str, Any]) -> dict[str, Any]:
    """The pre-flight bound's figures (compat/preflight_bound.py's preflight.json) per draft layer it served
    (``draft_layers``; the file's own ``table`` as ``settings.draft_layer``, else llama):
    ``preflight.<layer>.draft_kv_bytes_per_token`` (bytes) and, per row of its table,
    ``preflight.<layer>.c<concurrency>.k<k>.<field>`` for ``PREFLIGHT_ROW`` (milliseconds, ratios, τ)."""
    layers = pre.get("draft_layers") or {pre.get("settings", {}).get("draft_layer", "llama"): {"table": pre["table"]}}
    out: dict[str, Any] = {}
    for layer, v in layers.items():
        if v.get("draft_kv_bytes_per_token") is not None:
            out[f"preflight.{layer}.draft_kv_bytes_per_token"] = v["draft_kv_bytes_per_token"]
        for row in v["table"]:
            key = f"preflight.{layer}.c{row['concurrency']}.k{row['k']}."
            out.update({key + f: _round(row[f]) for f in PREFLIGHT_ROW if f in row})
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


def summarise_serve_check(check: Mapping[str, Any]) -> dict[str, Any]:
    """From a serve_check.json (eagle3build/serve/serve_check.py): ``serve.start_s`` (the server's start, seconds),
    ``serve.k``, ``serve.tau`` and ``serve.tau_benchmark`` (τ through the server over both passes, and benchmark.json's
    at that k and set, tokens), ``serve.lossless``, ``serve.tokens_per_s`` and ``serve.ttft_s`` (the streaming pass:
    output tokens/s of its sequential requests, median time to first token), ``serve.processes_left``; per concurrency
    ``c`` of the load generator (``vllm bench serve``) ``load.c<c>.tokens_per_s``, ``load.c<c>.requests_per_s``,
    ``load.c<c>.ttft_ms`` (median) and ``load.c<c>.tau``."""
    stream = check["passes"]["streaming"]
    out: dict[str, Any] = {
        "serve.start_s": _round(check["server"]["start_s"], 1), "serve.k": check["num_speculative_tokens"],
        "serve.tau": _round(check["tau"]["served"]), "serve.tau_benchmark": _round(check["tau"]["benchmark"]),
        "serve.lossless": bool(check["lossless"]), "serve.tokens_per_s": _round(stream["output_tokens_per_s"], 2),
        "serve.ttft_s": _round((stream.get("time_to_first_token_s") or {}).get("p50")),
        "serve.processes_left": check["stop"]["processes_left"]}
    for c, v in (check.get("load") or {}).items():
        out.update({f"load.c{c}.tokens_per_s": _round(v.get("output_tokens_per_s"), 2),
                    f"load.c{c}.requests_per_s": _round(v.get("request_throughput")),
                    f"load.c{c}.ttft_ms": _round((v.get("time_to_first_token_ms") or {}).get("median"), 1),
                    f"load.c{c}.tau": _round(v.get("tau"))})
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


def record_filename(record: Mapping[str, Any], tag: str | None = None) -> str:
    """``<name>_<card>.json``, or ``<name>_<card>_<tag>.json`` for a second measurement of the same record on the same
    kind of card (another host, another call): ``tag`` in ``[a-z0-9-]+``.

    Raises:
        RecordError: a tag outside that alphabet.
    """
    stem = f"{record['name']}_{card_slug(record['hardware']['card'])}"
    if tag is not None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", tag):
            raise RecordError(f"record {record['name']}: tag {tag!r}: use lower-case letters, digits and '-'")
        stem += f"_{tag}"
    return stem + ".json"


def write_record(folder: str | Path, record: Mapping[str, Any], tag: str | None = None) -> Path:
    """Write ``record`` atomically as ``folder/<name>_<card>[_<tag>].json`` (``record_filename``) and return the
    path."""
    path = Path(folder) / record_filename(record, tag)
    write_json(path, dict(record))
    return path


# ---- Docs checked against records --------------------------------------------------------------------------------
#
# The citation convention: a measured figure in README.md, docs/ or benchmarks/ is a Markdown link to its record with
# the result key as the fragment, the link text being the figure as the record rounds to that many places:
#
#     decodes [1.55x](benchmarks/records/recipe_h200.json#k3.speedup.all) as fast as the target alone
#
# ``check_docs`` fails a citation whose record or key does not exist, or whose number differs from the record's value
# rounded to the places written; a speed-up (``1.55x``), τ (``τ 2.78``), throughput (``620 tokens/s``, ``1.3 GB/s``)
# or step time (``2.6 ms``) written outside a citation (code spans and blocks aside); and, where records of the same
# name were made on more than one card or host (``recipe_h100.json``, ``recipe_h200.json``), a citation of one that
# does not cite the same key of the others in the same paragraph (table row), each followed by its card in
# parentheses: ``[1.27x](…recipe_h100.json#k3.speedup.all) (H100) to [1.55x](…recipe_h200.json#k3.speedup.all)
# (H200)``. Written here rather than found in a library: it is this project's convention (a Markdown link checker
# such as lychee checks that targets exist, not the values they back).
#
# A citation may also be a CommonMark reference link, for a line that inline links would make too long (a table of
# figures): ``[1.55x][recipe H200]`` (or ``[1.55x][]``, ``[1.55x]``: the text as the label) with a definition line
# ``[recipe H200]: ../benchmarks/records/recipe_h200.json#k3.speedup.all`` after a blank line anywhere in the document.
# The definition's URL is what is checked, as an inline link's; a full or collapsed reference without a definition is
# an error. Lines of Markdown over ``MAX_LINE`` characters are reported too (``long_lines``): a reader's page, not a
# file whose length hides in a few lines.

CITATION = re.compile(r"\[(?P<text>[^\]\n]+)\]\((?P<path>[^)\s#]*?records/(?P<stem>[a-z0-9][a-z0-9_-]*)\.json)"
                      r"#(?P<key>[^)\s]+)\)")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
# Measured figures that must be citations: a decimal ratio (1.55x), a τ, a throughput, a step time.
UNCITED = re.compile(r"(?<![\w.])\d+\.\d+x\b|τ\s*(?:=|≈|of)?\s*\d+\.\d+|(?<![\w.])\d[\d,]*(?:\.\d+)?\s*k?\s*"
                     r"(?:tokens/s|tok/s|GB/s)|(?<![\w.])\d+(?:\.\d+)?\s*ms\b")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
CARD_AFTER = re.compile(r"\s*\*{0,2}\s*\((?P<card>[^)]*)\)")
RECORD_URL = re.compile(r"(?:[^\s#]*/)?records/(?P<stem>[a-z0-9][a-z0-9_-]*)\.json#(?P<key>\S+)")
# A link reference definition (CommonMark): up to 3 spaces, [label]: URL or <URL>, an optional title.
DEFINITION = re.compile(r"^ {0,3}\[(?P<label>[^\]\n]+)\]:[ \t]*<?(?P<url>[^\s>]+)>?(?:[ \t]+(?:\"[^\"\n]*\"|'[^'\n]*'|"
                        r"\([^)\n]*\)))?[ \t]*$", re.M)
# A reference link: [text][label] (full), [text][] (collapsed) or [text] (shortcut: a citation only where defined).
REFERENCE = re.compile(r"\[(?P<text>[^\]\n]+)\](?:\[(?P<label>[^\]\n]*)\])?(?![(:\[])")
MAX_LINE = 200


def _label(label: str) -> str:
    """A reference label as CommonMark matches it: case-folded, runs of white space as one space."""
    return " ".join(label.split()).casefold()


def definitions(text: str, where: str = "doc") -> tuple[dict[str, tuple[int, str]], list[str]]:
    """The link reference definitions of ``text`` (code already blanked) as ``{label: (line, url)}``, and the
    problems: a definition right below a paragraph, list or table line (CommonMark reads it as that text), a label
    defined twice with two URLs (the first would win)."""
    defs: dict[str, tuple[int, str]] = {}
    errors = []
    lines = text.split("\n")
    for m in DEFINITION.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        above = lines[line - 2] if line > 1 else ""
        label = _label(m.group("label"))
        if above.strip() and not DEFINITION.match(above) and not above.lstrip().startswith("#"):
            errors.append(f"{where}:{line}: [{m.group('label')}]: a definition cannot interrupt a paragraph: put a "
                          "blank line above it")
            continue
        if label in defs and defs[label][1] != m.group("url"):
            errors.append(f"{where}:{line}: [{m.group('label')}] is defined at line {defs[label][0]} already")
            continue
        defs.setdefault(label, (line, m.group("url")))
    return defs, errors


def _citations(block: str, defs: Mapping[str, tuple[int, str]]) -> tuple[list[dict], list[tuple[int, str]]]:
    """The citations of one block, inline or by reference, in order: dicts with ``start``, ``end``, ``text``,
    ``stem``, ``key`` and ``shown`` (how a message names the link); and (offset, label) of each full or collapsed
    reference whose label has no definition."""
    out = [dict(start=m.start(), end=m.end(), text=m.group("text"), stem=m.group("stem"), key=m.group("key"),
                shown=f"[{m.group('text')}]({m.group('stem')}#{m.group('key')})") for m in CITATION.finditer(block)]
    inline = [(c["start"], c["end"]) for c in out]
    undefined = []
    for m in REFERENCE.finditer(block):
        if any(a <= m.start() < b for a, b in inline):
            continue
        raw = m.group("label")
        label = _label(raw or m.group("text"))
        if label not in defs:
            if raw is not None:
                undefined.append((m.start(), raw or m.group("text")))
            continue
        url = RECORD_URL.fullmatch(defs[label][1])
        if url:
            ref = f"[{raw}]" if raw is not None else ""
            out.append(dict(start=m.start(), end=m.end(), text=m.group("text"), stem=url.group("stem"),
                            key=url.group("key"), shown=f"[{m.group('text')}]{ref} ({url.group('stem')}#"
                                                        f"{url.group('key')}, defined at line {defs[label][0]})"))
    return sorted(out, key=lambda c: c["start"]), undefined


def long_lines(text: str, where: str, limit: int = MAX_LINE) -> list[str]:
    """Each line of ``text`` over ``limit`` characters (not bytes), as ``where:line: N characters``."""
    return [f"{where}:{i}: {len(line)} characters (at most {limit}: wrap it; a long table cell becomes a section)"
            for i, line in enumerate(text.split("\n"), 1) if len(line) > limit]


def _matches(text: str, value: Any) -> bool:
    """Whether a citation's text states ``value``: booleans as ``lossless``/``yes``/``true`` (``no``/``false`` for
    False); strings verbatim; numbers as the first number in the text, equal to ``value`` rounded to its places."""
    plain = text.replace("*", "").strip()
    if isinstance(value, bool):
        words = {"lossless", "yes", "true", "passed"} if value else {"no", "false", "failed"}
        return plain.lower() in words
    if isinstance(value, str):
        return plain == value
    if value is None:
        return plain in ("—", "none", "null")
    m = NUMBER.search(plain)
    if not m:
        return False
    written = m.group(0).replace(",", "")
    places = len(written.split(".")[1]) if "." in written else 0
    return abs(round(float(value), places) - float(written)) < 10 ** -(places + 3)


def _blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each paragraph; a table row or list item is a block of its own."""
    out, cur, start = [], [], 1
    for i, line in enumerate(text.split("\n"), 1):
        s = line.strip()
        if not s or s.startswith(("|", "#")) or re.match(r"[-*] |\d+\. ", s):
            if cur:
                out.append((start, "\n".join(cur)))
            cur, start = ([line], i) if s else ([], i + 1)
            if s.startswith(("|", "#")):
                out.append((i, line))
                cur, start = [], i + 1
            continue
        if not cur:
            start = i
        cur.append(line)
    if cur:
        out.append((start, "\n".join(cur)))
    return out


def check_text(text: str, recs: Mapping[str, Mapping[str, Any]], where: str) -> list[str]:
    """Problems with the figures of one document (``where`` names it in each message); [] where it keeps the
    convention above. ``recs``: ``load_records``' result (keyed by file stem)."""
    by_name: dict[str, list[str]] = {}
    for stem, rec in recs.items():
        by_name.setdefault(rec["name"], []).append(stem)
    text = CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    defs, errors = definitions(text, where)
    text = DEFINITION.sub(lambda m: " " * len(m.group(0)), text)  # a definition is no figure, and no paragraph
    for line0, block in _blocks(text):
        found, undefined = _citations(block, defs)
        for start, label in undefined:
            errors.append(f"{where}:{line0 + block[:start].count(chr(10))}: [{label}]: no definition of this "
                          f"reference ([{label}]: ../benchmarks/records/<record>.json#<key>)")
        cited = {(c["stem"], c["key"]) for c in found}
        for c in found:
            line = line0 + block[:c["start"]].count("\n")
            stem, key = c["stem"], c["key"]
            at = f"{where}:{line}: {c['shown']}"
            rec = recs.get(stem)
            if rec is None:
                errors.append(f"{at}: no record benchmarks/records/{stem}.json")
                continue
            if key not in rec["results"]:
                errors.append(f"{at}: record {stem} has no result {key}")
                continue
            if not _matches(c["text"], rec["results"][key]):
                errors.append(f"{at}: the record says {rec['results'][key]!r}")
            others = [s for s in by_name[rec["name"]] if s != stem and key in recs[s]["results"]]
            for other in others:
                if (other, key) not in cited:
                    errors.append(f"{at}: {other} measured the same on another card or host: give the range "
                                  f"(cite {other}#{key} in the same paragraph)")
            if others:
                card = CARD_AFTER.match(block, c["end"])
                slug = card_slug(rec["hardware"]["card"])
                if not card or slug not in card.group("card").lower():
                    errors.append(f"{at}: a range's end names its card: follow the link with ({slug.upper()} ...)")
        bare = block
        for c in found:
            bare = bare[:c["start"]] + " " * (c["end"] - c["start"]) + bare[c["end"]:]
        for m in UNCITED.finditer(bare):
            line = line0 + bare[:m.start()].count("\n")
            errors.append(f"{where}:{line}: figure {m.group(0)!r} without a record: cite it "
                          f"([{m.group(0)}](benchmarks/records/<record>.json#<key>))")
    return sorted(errors, key=_line_of)


def _line_of(error: str) -> tuple[str, int]:
    where, line, _ = (error.split(":", 2) + ["0", ""])[:3]
    return where, int(line) if line.isdigit() else 0


DOCS = ("README.md", "docs/**/*.md", "benchmarks/**/*.md", "examples/configs/*.yaml")


def check_docs(root: str | Path, patterns: tuple[str, ...] = DOCS) -> list[str]:
    """``check_text`` over the files of ``root`` that ``patterns`` match, against ``root/benchmarks/records``, and
    ``long_lines`` over the Markdown ones.

    Raises:
        RecordError: a record file that fails the schema.
    """
    root = Path(root)
    recs = load_records(root / "benchmarks" / "records")
    errors = []
    for pat in patterns:
        for path in sorted(root.glob(pat)):
            text, where = path.read_text(), str(path.relative_to(root))
            errors += check_text(text, recs, where)
            if path.suffix == ".md":
                errors += long_lines(text, where)
    return errors


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/check_records.py check [ROOT]``: every cited figure against its record; exit 1 with the
    problems listed. ``python benchmarks/check_records.py show NAME_CARD``: a record's results."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python benchmarks/check_records.py", description=main.__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="the docs' figures against the records")
    c.add_argument("root", nargs="?", default=".", type=Path)
    s = sub.add_parser("show", help="one record's results")
    s.add_argument("stem")
    s.add_argument("--root", default=".", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "show":
        rec = load_records(a.root / "benchmarks" / "records")[a.stem]
        for k, v in rec["results"].items():
            print(f"{k}\t{v}")
        return 0
    errors = check_docs(a.root)
    for e in errors:
        print(e, file=sys.stderr)
    print(f"{len(errors)} problem(s) in the docs' figures and line lengths",
          file=sys.stderr if errors else sys.stdout)
    return 1 if errors else 0
