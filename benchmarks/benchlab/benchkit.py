"""The shared bits of the benchmark scripts under ``benchmarks/`` (issue 51): configs read as the workflow reads them,
and the head copy the GPU records keep. A shared module: no stage imports it.
"""
from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from eagle3build.config import spec

REPO = Path(__file__).resolve().parents[2]


def load_config(configfiles: Sequence[str | Path], overrides: Mapping | None = None, *,
                root: str | Path = REPO) -> dict:
    """The config a Snakemake run with ``--configfile`` ``configfiles`` (in order) uses, read as the Snakefile reads
    it: ``root/config.yaml``, then each file merged over it (``snakemake.utils.update_config``, Snakemake's own merge
    of several ``--configfile``s), then ``overrides`` (a dict, e.g. a sweep row), then old keys moved to their new
    names (``spec.upgrade``) and the whole validated against ``schemas/config.schema.yaml`` (which also fills
    nothing: every key is required there).

    Raises:
        FileNotFoundError: a config file that does not exist (named).
        ValueError: a file that is not a YAML mapping, or a merged config the schema refuses; the message names the
            files and the failing field.
    """
    from snakemake.utils import update_config, validate

    root = Path(root)
    cfg = yaml.safe_load((root / "config.yaml").read_text())
    for f in configfiles:
        path = Path(f)  # relative to the working directory, as for snakemake --configfile
        if not path.exists():
            raise FileNotFoundError(f"config file {f}: not found")
        layer = yaml.safe_load(path.read_text()) or {}
        if not isinstance(layer, dict):
            raise ValueError(f"config file {f}: not a YAML mapping")
        update_config(cfg, layer)
    if overrides:
        update_config(cfg, copy.deepcopy(dict(overrides)))
    spec.upgrade(cfg)
    try:
        validate(cfg, str(root / "schemas" / "config.schema.yaml"))
    except Exception as e:  # snakemake.exceptions.WorkflowError wraps jsonschema's error
        raise ValueError(f"config files {[str(f) for f in configfiles]}: {e}") from None
    return cfg


GPU_STAGES = ("regenerate_responses", "capture_hidden_states", "train_draft", "export_head")


def stage_seconds(bench_dir: Path, since: float, stages: Sequence[str] = GPU_STAGES) -> dict[str, float]:
    """Seconds per stage of the jobs that ran after ``since`` (epoch seconds), summed over their Snakemake
    ``benchmark:`` files under ``bench_dir`` (``benchmarks/<run>/<stage>...tsv``, column ``s``, the first row)."""
    out: dict[str, float] = {}
    for f in Path(bench_dir).rglob("*.tsv"):
        if f.stat().st_mtime < since:
            continue
        stage = next((s for s in stages if str(f.relative_to(bench_dir)).startswith(s)), None)
        if stage is None:
            continue
        rows = f.read_text().splitlines()
        out[stage] = round(out.get(stage, 0.0) + float(rows[1].split("\t")[0]), 1)
    return out


def keep_head(res: Path, dest: Path) -> None:
    """Copy the head of ``res`` (``results/<run>``) without ``embed_tokens.weight`` (vLLM and speculators take it from
    the target) to ``dest``, and the benchmark prompts (``data/prompts.jsonl``) to ``dest``'s parent.

    Raises:
        FileNotFoundError: the run has no exported head or no prompts.
    """
    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True, exist_ok=True)
    state = load_file(str(res / "head/model.safetensors"))
    state.pop("embed_tokens.weight", None)
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    for f in ("config.json", "head_meta.json"):
        shutil.copy(res / "head" / f, dest / f)
    shutil.copy(res / "data/prompts.jsonl", dest.parent / "prompts.jsonl")
