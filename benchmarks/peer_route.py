"""The peers' own route beside ours (issue 40 item 4): the hidden states our build captured, trained by speculators'
own training entry point, to a head that our benchmark serves beside the run's own.

From a built run (its shards under ``results/<run>/hidden_states/``, its compat report's aux layers, its
``train`` and ``vocab`` settings), it
1. writes speculators' offline data directory from the shards (``benchlab.speculators_data``: the same
   train and eval samples, the same aux layers, token frequencies over the train samples only);
2. runs ``python -m speculators.train`` (speculators/train/__main__.py, the entry point behind ``speculators
   train``) on it with every run setting speculators has a flag for (``train_command``: epochs, lr, weight
   decay, schedule and warm-up, TTT steps and their loss decay, tokens per step, seed, max steps; the draft
   vocabulary size; the compat report's aux layers; full attention in the draft layer, as our heads have), and
   speculators' own choices for the rest: its optimizer (Muon on the 2-D weights, AdamW on the others, at the
   run's lr and weight decay), fused loss, flex attention, ``norm_before_fc`` and ``norm_output`` on; more flags
   after ``--`` (e.g. ``-- --optimizer adamw``). The resolved flags (speculators' ``run.yaml``) go into the record;
3. keeps the last epoch's checkpoint as a head (``config.json`` + ``model.safetensors``: what vLLM loads), to
   be listed in ``benchmark.compare_heads`` (``benchmarks/gpu/compare_peer.yaml``). Ours keeps the epoch of
   ``train.select``: the same one where the run has one epoch.

Both routes read the same captured states, so the capture is not part of either side's time. The record holds
the peer's conversion and training (wall seconds, its vocabulary map included) and, from the run's Snakemake
benchmark files, our train_draft job's seconds: our vocab map and export (with its vLLM load check) have no
such file, so they are not in it.

speculators' ``Trainer`` needs an accelerator (speculators/train/trainer.py picks ``cuda`` where
``torch.accelerator`` finds none): on a CPU, ``--dry-run`` passes speculators' own ``--dry-run`` (the head built
and saved untrained), which is what the smoke test runs.

    python benchmarks/peer_route.py --configfile benchmarks/gpu/dense_preflight.yaml --out results/heads/speculators \
        [--json peer_route.json] [--num-workers 8] [--dry-run] [-- MORE_SPECULATORS_TRAIN_FLAGS]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml
from benchlab.benchkit import load_config, stage_seconds
from benchlab.speculators_data import write_speculators_data

from eagle3build.atomic import atomic_path, write_json
from eagle3build.config.provenance import BENCHMARK_PACKAGES, hardware, software_versions
from eagle3build.draft import methods
from eagle3build.formats import artifacts

REPO = Path(__file__).resolve().parents[1]

HEAD_FILES = ("config.json", "model.safetensors")


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


# train.schedule -> speculators' --scheduler-type; speculators' "none" is a constant lr without our linear warm-up
SCHEDULES = {"cosine": "cosine", "constant": "none"}


def train_command(cfg: dict, target: str, data: Path, save: Path, log_dir: Path, aux_layer_ids: list[int],
                  ratio: float, num_workers: int, dry_run: bool, extra: list[str]) -> list[str]:
    """speculators' training command for the run's settings (``python -m speculators.train`` with its flags,
    speculators/train/config/schema.py): each ``train`` setting speculators has a flag for (epochs, lr, weight
    decay of both optimizer groups, schedule and warm-up ratio, TTT steps and their loss decay, tokens per step,
    seed, max steps, the loss implementation), the draft vocabulary size, the compat report's aux layers, full
    attention in the one draft layer (``--full-attention-indices 0``: speculators' default is a 2,048-token sliding
    window, which our heads do not have), every row's hidden states required (``--on-missing raise``), no resume
    (``save`` starts empty).

    The loss implementation is the run's ``train.loss_implementation`` (``eager`` by default), not speculators'
    default ``fused``: on the lent H200 (torch 2.11.0+cu130, 2026-12-05) the fused KL kernel failed inside the
    draft's compiled forward (speculators/losses/fused.py:343, ``loss_backward_kernel`` launched in the autograd
    backward; torch/_dynamo/side_effects.py:418 asserts that its autotune ``configs`` list, shared with
    ``loss_forward_kernel``, is "already tracked for mutation"), and our own train_draft trains with the same loss."""
    t = cfg["train"]
    cmd = [sys.executable, "-m", "speculators.train", "--verifier-name-or-path", target, "--data-path", str(data),
           "--save-path", str(save), "--log-dir", str(log_dir), "--speculator-type", "eagle3",
           "--target-layer-ids", *map(str, aux_layer_ids), "--draft-vocab-size", str(cfg["vocab"]["draft_vocab_size"]),
           "--full-attention-indices", "0",
           "--epochs", str(t["epochs"]), "--lr", str(t["lr"]), "--weight-decay", str(t["weight_decay"]),
           "--muon-weight-decay", str(t["weight_decay"]), "--scheduler-type", SCHEDULES[t["schedule"]],
           "--ttt-steps", str(t["ttt_steps"]), "--ttt-step-loss-decay", str(t["ttt_step_loss_decay"]),
           "--total-seq-len", str(t["total_seq_len"]), "--seed", str(t["seed"]),
           "--train-data-ratio", repr(ratio), "--on-missing", "raise", "--num-workers", str(num_workers),
           "--no-resume-from-checkpoint", "--loss-implementation", t["loss_implementation"]]
    if t["schedule"] == "cosine":
        cmd += ["--scheduler-warmup-ratio", str(t["warmup_ratio"])]
    if t.get("max_steps"):
        cmd += ["--max-steps", str(t["max_steps"])]
    if cfg["target"].get("trust_remote_code"):
        cmd += ["--trust-remote-code"]
    if dry_run:
        cmd += ["--dry-run"]
    return cmd + extra


def last_checkpoint(save: Path, epochs: int, max_steps: int | None, dry_run: bool) -> Path:
    """The folder of the checkpoint to serve: ``save/<epochs - 1>`` (speculators/train/checkpointer.py
    ``model_path``: ``save/<epoch>/model.safetensors``, epochs from 0; with ``max_steps`` the highest epoch
    saved), or ``save`` itself after ``--dry-run``.

    Raises:
        RuntimeError: ``save/interrupted`` exists: speculators caught a signal, saved there and exited 0
            (speculators/train/graceful_shutdown.py), so the run did not finish.
        FileNotFoundError: that checkpoint lacks config.json or model.safetensors (the epochs found named).
    """
    if (save / "interrupted").exists():
        raise RuntimeError(f"{save / 'interrupted'}: speculators' training was interrupted; no finished head")
    epochs_found = sorted(int(d.name) for d in save.iterdir() if d.is_dir() and not d.is_symlink() and d.name.isdigit())
    if dry_run:
        want = save
    elif max_steps:
        want = save / str(epochs_found[-1]) if epochs_found else save / "0"
    else:
        want = save / str(epochs - 1)
    if not all((want / f).exists() for f in HEAD_FILES):
        raise FileNotFoundError(f"{want}: no {' and '.join(HEAD_FILES)} (epochs saved: {epochs_found})")
    return want


def main(argv: list[str] | None = None) -> dict:
    """The command line (module docstring); writes ``OUT/data``, ``OUT/checkpoints``, ``OUT/train.log``,
    ``OUT/head`` and the record (``--json``, default ``OUT/peer_route.json``) and returns the record.

    Raises:
        SystemExit: a run whose ``draft.method`` is not eagle3, or speculators' training failed (its log's tail).
        artifacts.ArtifactError: the run has no readable compat decisions (``results/<run>/decisions.json``).
        FileNotFoundError: a split has no shards, or the training left no checkpoint (``run_shards``,
            ``last_checkpoint``).
        shards.ShardMismatch: a shard of another target or other aux layers than the decisions.
        RuntimeError: speculators' training was interrupted (``last_checkpoint``).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configfile", action="append", required=True, help="the run's overlays, as given to snakemake")
    ap.add_argument("--workdir", default=str(REPO), help="the build's working directory (results/ under it)")
    ap.add_argument("--out", required=True, help="folder for the data, checkpoints, logs and the head (out/head)")
    ap.add_argument("--json", help="the record (default: OUT/peer_route.json)")
    ap.add_argument("--num-workers", type=int, default=8, help="speculators' dataloader workers")
    ap.add_argument("--dry-run", action="store_true", help="speculators' --dry-run: build and save, no training")
    ap.add_argument("extra", nargs="*", help="more speculators train flags (after --)")
    a = ap.parse_args(argv)

    cfg = load_config(a.configfile)
    method = methods.get(cfg["draft"]["method"])
    if method.peer_route_type is None:
        raise SystemExit(f"peer_route.py: draft.method {method.name!r}; the peer route trains "
                         f"{[m.name for m in methods.METHODS.values() if m.peer_route_type]} heads")
    wd = Path(a.workdir).resolve()
    res = wd / "results" / cfg["run"]
    # a relative target.path is the workdir's, as for snakemake (speculators runs in OUT)
    target = str((wd / (cfg["target"]["path"] or f"resources/targets/{cfg['target']['bundled']}")).resolve())
    decisions = artifacts.Decisions.load(res / "decisions.json")
    aux = decisions.aux_layer_ids
    shards = run_shards(res)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    data = write_speculators_data(shards["train"], shards["eval"], out / "data", decisions.target_fingerprint, aux)
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
    ckpt = last_checkpoint(save, int(cfg["train"]["epochs"]), cfg["train"].get("max_steps"), a.dry_run)
    with atomic_path(out / "head") as tmp:
        tmp.mkdir()
        for f in HEAD_FILES:
            shutil.copy2(ckpt / f, tmp / f)
    total_s = round(time.perf_counter() - t0, 1)

    ours = stage_seconds(res / "benchmarks", since=0.0)  # the run's Snakemake benchmark files
    record = {
        "command": " ".join(sys.argv), "configfiles": a.configfile, "run": cfg["run"], "target": target,
        "dry_run": a.dry_run, "speculators_command": cmd[1:],
        "speculators_run_yaml": yaml.safe_load((save / "run.yaml").read_text()), "data": data,
        "peer": {"convert_s": data["seconds"], "train_s": train_s, "data_to_head_s": total_s,
                 "checkpoint": str(ckpt), "head": str(out / "head")},
        "ours": {"train_draft_s": ours.get("train_draft"), "capture_s": ours.get("capture_hidden_states")},
        "software": software_versions(BENCHMARK_PACKAGES, keep_missing=False), "hardware": hardware(),
    }
    write_json(a.json or out / "peer_route.json", record)
    print(json.dumps(record["peer"]))
    return record


if __name__ == "__main__":
    main()
