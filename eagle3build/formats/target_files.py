"""A target folder's files (shared layer, no torch): which files decide what the stages compute
(``content_files``: the config, tokenizer and chat template, remote code, the weights and their index), which
materialize_target writes for a bundled target (``MATERIALIZED_FILES``), and what is wrong with a folder that is
no target (``target_dir_problem``: missing, a hub cache folder, no config.json; ``target_weights_problem``: no
weights), and its config.json as planning reads it (``planning_config``; ``BUNDLED_CONFIGS`` before a bundled target
is materialised) with its decoder layer count (``num_decoder_layers``). Read at planning (``workflow.plan``: a
target's files are the inputs of the rules that read it), by the target loader (eagle3build/target.py) and the engines
(``engine_args``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# The files materialize_target writes for a bundled target (transformers' save_pretrained of
# the model and the tokenizer); its rule declares them as outputs.
MATERIALIZED_FILES = ("chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
                      "tokenizer.json", "tokenizer_config.json")

# What planning knows of each bundled target before materialize_target writes its folder: the fields of its
# config.json that decide what can be built for it (``draft.layer: mla`` asks for ``kv_lora_rank``).
# SmolLM2-135M-Instruct is a llama model with grouped-query attention, no multi-head latent attention
# (tests/test_materialize.py checks the materialised config.json holds these fields).
BUNDLED_CONFIGS: dict[str, dict] = {
    "smollm2-135m-instruct": {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
}


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

    The plan warns (``workflow.plan.check_target``), so a dry-run shows it, and refuses a build whose planned
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


def planning_config(path: str | os.PathLike, bundled: str | None = None) -> tuple[dict | None, str]:
    """The target's ``config.json`` as planning reads it (no torch), and the config key naming the target, for a
    message: a folder's (``target.path`` ``path``; a bundled target's once materialised under ``path``), else a
    bundled target's known fields (``BUNDLED_CONFIGS`` of ``bundled``: its folder is not written before the build).
    ``(None, name)`` where neither can be read (a folder not there yet, a config.json that is no JSON object): what
    depends on it is then checked by the job that first reads the target."""
    name = f"target.bundled {bundled}" if bundled else f"target.path {path}"
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
        return (cfg if isinstance(cfg, dict) else None), name
    except (OSError, ValueError):
        return (dict(BUNDLED_CONFIGS[bundled]) if bundled in BUNDLED_CONFIGS else None), name


def num_decoder_layers(config: dict) -> int | None:
    """The decoder layers of a target's config.json (a dict, read without torch): ``num_hidden_layers`` of its text
    config (``text_config`` of a multimodal wrapper such as Kimi-K2.5's), else None."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    n = text.get("num_hidden_layers")
    return n if isinstance(n, int) else None

