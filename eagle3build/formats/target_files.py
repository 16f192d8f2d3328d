"""A target folder's files (shared layer, no torch): which files decide what the stages compute
(``content_files``: the config, tokenizer and chat template, remote code, the weights and their index), which
materialize_target writes for a bundled target (``MATERIALIZED_FILES``), and what is wrong with a folder that is
no target (``target_dir_problem``: missing, a hub cache folder, no config.json; ``target_weights_problem``: no
weights), and its config.json as planning reads it (``planning_config``; ``BUNDLED_CONFIGS`` before a bundled target
is materialised), and the variables that keep the Hugging Face libraries to the local files (``OFFLINE_VARS``,
config ``target.offline``); how many aux layers a head reads (``num_aux_layers``) and which by default
(``default_aux_layer_ids``), and how an engine of the target is laid out over a job's GPUs (``engine_layout``). Read at
planning (``workflow.plan``: a target's files are the inputs of the rules that read it), by the target loader
(eagle3build/target.py), the jobs (``job.setup``), the engines (``engine_args``, ``engine_process.child_env``) and the
serving files (serve.env).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# Hugging Face's offline switches (huggingface_hub, transformers, datasets): set to 1 where ``target.offline`` is true,
# so that the target and its tokenizer are read from their local files and nothing is fetched from the Hub.
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")

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


# Fewer decoder layers than this and EAGLE-3's default ids [2, N//2, N-3] repeat a layer or leave the stack.
EAGLE3_MIN_LAYERS = 7


def engine_layout(gpus: int, pipeline_parallel_size: int) -> dict[str, int]:
    """How an engine on a job's ``gpus`` GPUs (0 = CPU) is laid out: ``{"tensor_parallel_size": gpus (1 on
    CPU), "pipeline_parallel_size": pipeline_parallel_size}`` (``target.pipeline_parallel_size``), vLLM's
    argument names. ``vllm.engine_args.engine_args`` passes these to vLLM; the planner shows them in each engine job's
    resources (``workflow.plan.engine_layout_resources``), so the dry-run reads the layout from this one function.

    Raises:
        ValueError: ``pipeline_parallel_size`` < 1.
    """
    if pipeline_parallel_size < 1:
        raise ValueError(f"target.pipeline_parallel_size must be >= 1, got {pipeline_parallel_size}")
    return {"tensor_parallel_size": max(1, gpus), "pipeline_parallel_size": pipeline_parallel_size}


def num_aux_layers(aux_layer_ids: str | list[int]) -> int:
    """How many aux layers a head reads for ``capture.aux_layer_ids``: 3 for ``auto`` (``default_aux_layer_ids``),
    else the ids' count."""
    return 3 if aux_layer_ids == "auto" else len(aux_layer_ids)


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """The aux layers a head reads where ``capture.aux_layer_ids`` is ``auto``: EAGLE-3's ``[2, N//2, N-3]`` (vLLM's
    and speculators' default; EAGLE-3, arXiv 2503.01840) for ``N`` >= 7 decoder layers; below that, where those would
    repeat a layer (6 layers: ``[2, 3, 3]``), three distinct layers spread over the stack the same way, low, middle and
    high: ``[1, N//2, N-2]`` for 5-6 layers, ``[1, 2, 3]`` for 4, ``[0, 1, 2]`` for 3 (``aux_layer_ids_rule`` says
    which). Layer id ``k`` is the residual stream *entering* decoder layer ``k``.

    Raises:
        ValueError: fewer than 3 layers (no three distinct ones; give ``capture.aux_layer_ids`` fewer ids).
    """
    n = num_layers
    if n >= EAGLE3_MIN_LAYERS:
        return [2, n // 2, n - 3]
    if n < 3:
        raise ValueError(f"target has {n} decoder layer(s): no three distinct aux layers; set capture.aux_layer_ids "
                         f"to ids in [0, {n - 1}]")
    lo, hi = (1 if n >= 4 else 0), (n - 2 if n >= 5 else n - 1)
    mid = n // 2 if lo < n // 2 < hi else lo + 1
    return [lo, mid, hi]


def aux_layer_ids_rule(num_layers: int) -> str:
    """Why ``default_aux_layer_ids`` chose its ids for a ``num_layers``-layer target, as the compat report says it."""
    ids = default_aux_layer_ids(num_layers)
    if num_layers >= EAGLE3_MIN_LAYERS:
        return f"EAGLE-3's default [2, N//2, N-3] for N = {num_layers} layers: {ids}"
    n = num_layers
    return (f"a shallow target ({n} layers, fewer than {EAGLE3_MIN_LAYERS}): EAGLE-3's [2, N//2, N-3] would be "
            f"{[2, n // 2, n - 3]}, so three distinct layers spread over the stack: {ids}")


def check_aux_layer_ids(ids: list[int], num_layers: int) -> list[int]:
    """Validate user-given aux layer ids: integers in ``[0, num_layers)``, unique, sorted.

    Raises:
        ValueError: naming the offending ids and the valid range.
    """
    if not ids:
        raise ValueError("capture.aux_layer_ids is empty")
    bad = [i for i in ids if not isinstance(i, int) or i < 0 or i >= num_layers]
    if bad:
        raise ValueError(f"capture.aux_layer_ids {ids}: {bad} out of range [0, {num_layers - 1}] for a {num_layers}-layer "
                         "target")
    if len(set(ids)) != len(ids):
        raise ValueError(f"capture.aux_layer_ids {ids}: ids must be unique")
    if list(ids) != sorted(ids):
        raise ValueError(f"capture.aux_layer_ids {ids}: ids must be sorted ascending")
    return list(ids)


def num_decoder_layers(config: dict) -> int | None:
    """The decoder layers of a target's config.json (a dict, read without torch): ``num_hidden_layers`` of its text
    config (``text_config`` of a multimodal wrapper such as Kimi-K2.5's), else None."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    n = text.get("num_hidden_layers")
    return n if isinstance(n, int) else None

