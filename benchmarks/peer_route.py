"""The peers' own route beside ours (issue 40 item 4): the hidden states our build captured, trained by speculators'
own training entry point, to a head that our benchmark serves beside the run's own.

From a built run (its shards under ``results/<run>/hidden_states/``, its compat report's aux layers, its
``train`` and ``vocab`` settings), it
1. writes speculators' offline data directory from the shards (``eagle3build.speculators_data``: the same
   train and eval samples, the same aux layers, token frequencies over the train samples only);
2. runs ``python -m speculators.train`` (speculators/train/__main__.py, the entry point behind ``speculators
   train``) on it with the run's epochs, learning rate, TTT steps, tokens per step, seed and draft vocabulary
   size, and speculators' own defaults for the rest (its optimizer, schedule, attention kernel and loss);
3. keeps the last epoch's checkpoint as a head (``config.json`` + ``model.safetensors``: what vLLM loads), to
   be listed in ``benchmark.compare_heads`` (``benchmarks/gpu/compare_peer.yaml``).

Both routes read the same captured states, so the capture is not part of either side's time: the record holds
the conversion and the peer's training (wall seconds), and our run's training job (its Snakemake benchmark
file) beside them.

speculators' ``Trainer`` needs an accelerator (speculators/train/trainer.py picks ``cuda`` where
``torch.accelerator`` finds none): on a CPU, ``--dry-run`` passes speculators' own ``--dry-run`` (the head built
and saved untrained), which is what the smoke test runs.

    python benchmarks/peer_route.py --configfile benchmarks/gpu/dense_preflight.yaml --out results/heads/speculators \
        [--json peer_route.json] [--num-workers 8] [--dry-run] [-- MORE_SPECULATORS_TRAIN_FLAGS]
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle3build import artifacts  # noqa: E402
from eagle3build.atomic import atomic_path, write_json  # noqa: E402
from eagle3build.provenance import BENCHMARK_PACKAGES, hardware, software_versions  # noqa: E402
from eagle3build.speculators_data import write_speculators_data  # noqa: E402

HEAD_FILES = ("config.json", "model.safetensors")


def merged_config(configfiles: list[str]) -> dict:
    """config.yaml updated by each of ``configfiles`` in turn (Snakemake's own merge of several ``--configfile``s,
    snakemake.utils.update_config)."""
    from snakemake.utils import update_config

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    for f in configfiles:
        update_config(cfg, yaml.safe_load(Path(f).read_text()))
    return cfg


def run_shards(res: Path) -> dict[str, list[Path]]:
    """The run's shard files per split (``results/<run>/hidden_states/<split>/shard-*.safetensors``), sorted.

    Raises:
        FileNotFoundError: a split has none (the run's capture has not run, or it is an online run), naming the
            folder and the command that makes them.
    """
    shards = {s: sorted((res / "hidden_states" / s).glob("shard-*.safetensors")) for s in ("train", "eval")}
    for s, found in shards.items():
        if not found:
            raise FileNotFoundError(f"{res / 'hidden_states' / s}: no shard-*.safetensors; the peer route trains on "
                                    "the run's captured shards: build them first (snakemake --until "
                                    "capture_hidden_states, capture.mode: offline)")
    return shards


def train_command(cfg: dict, target: str, data: Path, save: Path, log_dir: Path, aux_layer_ids: list[int],
                  ratio: float, num_workers: int, dry_run: bool, extra: list[str]) -> list[str]:
    """speculators' training command for the run's settings (``python -m speculators.train`` with its flags,
    speculators/train/config/schema.py): the run's epochs, lr, TTT steps, tokens per step, seed, max steps and
    draft vocabulary size; the aux layers of its compat report; speculators' defaults for the rest."""
    t = cfg["train"]
    cmd = [sys.executable, "-m", "speculators.train", "--verifier-name-or-path", target, "--data-path", str(data),
           "--save-path", str(save), "--log-dir", str(log_dir), "--speculator-type", "eagle3",
           "--target-layer-ids", *map(str, aux_layer_ids), "--draft-vocab-size", str(cfg["vocab"]["draft_vocab_size"]),
           "--epochs", str(t["epochs"]), "--lr", str(t["lr"]), "--ttt-steps", str(t["ttt_steps"]),
           "--total-seq-len", str(t["total_seq_len"]), "--seed", str(t["seed"]),
           "--train-data-ratio", repr(ratio), "--on-missing", "raise", "--num-workers", str(num_workers),
           "--no-resume-from-checkpoint"]
    if t.get("max_steps"):
        cmd += ["--max-steps", str(t["max_steps"])]
    if cfg["target"].get("trust_remote_code"):
        cmd += ["--trust-remote-code"]
    if dry_run:
        cmd += ["--dry-run"]
    return cmd + extra


def last_checkpoint(save: Path, dry_run: bool) -> Path:
    """The folder of the checkpoint to serve: the highest epoch under ``save`` (speculators/train/checkpointer.py
    ``model_path``: ``save/<epoch>/model.safetensors``), or ``save`` itself after ``--dry-run``.

    Raises:
        FileNotFoundError: no checkpoint holds config.json and model.safetensors.
    """
    epochs = sorted((int(d.name) for d in save.iterdir() if d.is_dir() and d.name.isdigit()), reverse=True)
    for d in ([save] if dry_run else [save / str(e) for e in epochs]):
        if all((d / f).exists() for f in HEAD_FILES):
            return d
    raise FileNotFoundError(f"{save}: no checkpoint with {' and '.join(HEAD_FILES)} (epochs found: {epochs})")


def job_seconds(tsv: Path) -> float | None:
    """Wall seconds of a Snakemake benchmark file (its ``s`` column), None where it is absent."""
    if not tsv.exists():
        return None
    with tsv.open() as f:
        return round(float(next(csv.DictReader(f, delimiter="\t"))["s"]), 1)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configfile", action="append", required=True, help="the run's overlays, as given to snakemake")
    ap.add_argument("--workdir", default=str(REPO), help="the build's working directory (results/ under it)")
    ap.add_argument("--out", required=True, help="folder for the data, checkpoints, logs and the head (out/head)")
    ap.add_argument("--json", help="the record (default: OUT/peer_route.json)")
    ap.add_argument("--num-workers", type=int, default=8, help="speculators' dataloader workers")
    ap.add_argument("--dry-run", action="store_true", help="speculators' --dry-run: build and save, no training")
    ap.add_argument("extra", nargs="*", help="more speculators train flags (after --)")
    a = ap.parse_args(argv)

    cfg = merged_config(a.configfile)
    if cfg["draft"]["method"] != "eagle3":
        raise SystemExit(f"peer_route.py: draft.method {cfg['draft']['method']!r}; the peer route trains eagle3 heads")
    wd = Path(a.workdir).resolve()
    res = wd / "results" / cfg["run"]
    target = cfg["target"]["path"] or str(wd / "resources/targets" / cfg["target"]["bundled"])
    aux = artifacts.Decisions.load(res / "decisions.json").aux_layer_ids
    shards = run_shards(res)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    data = write_speculators_data(shards["train"], shards["eval"], out / "data")
    print(f"peer_route: data {data['num_train']} + {data['num_eval']} rows, {data['tokens']} tokens, "
          f"{data['bytes']} bytes in {data['seconds']} s", file=sys.stderr, flush=True)
    save = out / "checkpoints"
    shutil.rmtree(save, ignore_errors=True)
    cmd = train_command(cfg, target, out / "data", save, out / "logs", aux, data["train_data_ratio"], a.num_workers,
                        a.dry_run, a.extra)
    t1 = time.perf_counter()
    with open(out / "train.log", "w") as log:
        p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=out)
    train_s = round(time.perf_counter() - t1, 1)
    if p.returncode != 0:
        tail = (out / "train.log").read_text()[-3000:]
        raise SystemExit(f"peer_route.py: speculators train failed (rc {p.returncode}), {out / 'train.log'}:\n{tail}")
    ckpt = last_checkpoint(save, a.dry_run)
    with atomic_path(out / "head") as tmp:
        tmp.mkdir()
        for f in HEAD_FILES:
            shutil.copy2(ckpt / f, tmp / f)
    total_s = round(time.perf_counter() - t0, 1)

    bench = res / "benchmarks"
    record = {
        "command": " ".join(sys.argv), "configfiles": a.configfile, "run": cfg["run"], "target": target,
        "dry_run": a.dry_run, "speculators_command": cmd[1:], "data": data,
        "peer": {"convert_s": data["seconds"], "train_s": train_s, "data_to_head_s": total_s,
                 "checkpoint": str(ckpt), "head": str(out / "head")},
        "ours": {"train_draft_s": job_seconds(bench / "train_draft.tsv"),
                 "capture_s": round(sum(job_seconds(f) for f in (bench / "capture_hidden_states").glob("*.tsv")), 1)},
        "software": software_versions(BENCHMARK_PACKAGES, keep_missing=False), "hardware": hardware(),
    }
    write_json(a.json or out / "peer_route.json", record)
    print(json.dumps(record["peer"]))
    return record


if __name__ == "__main__":
    main()
