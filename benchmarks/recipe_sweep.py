"""A recipe sweep: one build per variant of a base config, in one workdir, with the jobs each change reran.

Each variant of ``--variants`` (a YAML mapping name -> config overrides) is built with
``snakemake --configfile BASE VARIANT --until export_head`` in the same workdir, in file
order, so Snakemake rebuilds only what the change reaches (a new learning rate: training and
export; a new draft vocab: the vocab map too; fp8 shards: the capture too; regenerated
answers: everything from the data on). The dry-run before each build gives the planned jobs.
Per variant the record holds: the planned jobs, wall seconds of the build, the seconds of
the GPU stages (Snakemake's ``benchmark:`` files of the jobs that ran), the training figures
(``checkpoint/metrics.json``: steps, tokens/s, the final eval's simulated τ and per-step
accuracy), the data report's token counts and, where regeneration ran, its report.

The simulated τ is measured on each variant's own eval split; with regenerated answers that
split holds the target's own answers too, so compare that row by served τ (benchmark.json on
held-out prompts), not by the simulated one. ``--keep-heads`` copies each head without
``embed_tokens.weight`` (vLLM takes it from the target) to ``OUT/<variant>/head`` for serving.

    python benchmarks/recipe_sweep.py --configfile benchmarks/sweep/base_4k.yaml \
        --variants benchmarks/sweep/variants.yaml --gpus 1 --cores 16 --out OUT --keep-heads \
        -- --scheduler greedy

``--only a,b`` builds a subset and merges it into an existing ``OUT/sweep.json`` (a device
call is limited in time, so a sweep may span several calls on a machine that keeps its disk).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml
from benchlab.benchkit import keep_head, load_config, stage_seconds

REPO = Path(__file__).resolve().parents[1]


def planned_jobs(exe: list[str], args: list[str], workdir: Path) -> dict[str, int]:
    """Rule -> job count of a dry-run's "Job stats" table ({} when nothing is to be done).

    Raises:
        RuntimeError: the dry-run failed.
    """
    p = subprocess.run([*exe, "-s", str(REPO / "Snakefile"), "-d", str(workdir), "-n", *args], cwd=REPO,
                       capture_output=True, text=True)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        raise RuntimeError(f"dry-run failed:\n{out[-3000:]}")
    if "Nothing to be done" in out or "Job stats:" not in out:
        return {}
    table = out.split("Job stats:", 1)[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)
            if m.group(1) != "total"}


def record_variant(res: Path) -> dict:
    """The figures one build left under ``res`` (results/<run>)."""
    m = json.loads((res / "checkpoint/metrics.json").read_text())
    ev = m["final_eval"]
    d = json.loads((res / "data/data_report.json").read_text())
    row = {
        "steps": m["steps"], "train_loop_seconds": m["seconds"], "train_tokens_per_s": m["tokens_per_s"],
        "train_tokens_seen": m["train_tokens_this_process"],
        "simulated_tau": round(ev.get("simulated_acceptance_length", float("nan")), 4),
        "eval_full_acc_per_step": [round(x, 4) for x in ev.get("full_acc_per_step", [])],
        "eval_loss": ev.get("loss"),
        "data": {k: d.get(k) for k in ("kept", "train_samples", "eval_samples", "tokens", "supervised_tokens")},
    }
    regen = res / "data/regenerate_report.json"
    if regen.is_file():
        row["regenerate_report"] = json.loads(regen.read_text())
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configfile", required=True, help="base config (overrides config.yaml)")
    ap.add_argument("--variants", required=True, help="YAML mapping: variant name -> config overrides")
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all, in file order)")
    ap.add_argument("--workdir", default=str(REPO))
    ap.add_argument("--gpus", type=int, default=0, help="GPUs of the machine (snakemake --resources gpu=N)")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--out", required=True, help="folder for sweep.json, the variants' configs and heads")
    ap.add_argument("--keep-heads", action="store_true")
    ap.add_argument("--snakemake", default=f"{sys.executable} -m snakemake", help="command that runs snakemake")
    ap.add_argument("extra", nargs="*", help="more snakemake arguments (after --)")
    a = ap.parse_args(argv)
    exe = shlex.split(a.snakemake)
    base = Path(a.configfile).resolve()
    variants = yaml.safe_load(Path(a.variants).read_text())
    names = [n for n in a.only.split(",") if n] or list(variants)
    unknown = sorted(set(names) - set(variants))
    if unknown:
        raise SystemExit(f"{a.variants}: no variant named {unknown}")
    out = Path(a.out)
    (out / "configs").mkdir(parents=True, exist_ok=True)
    sweep_json = out / "sweep.json"
    sweep = json.loads(sweep_json.read_text()) if sweep_json.is_file() else {
        "base": str(a.configfile), "variants_file": str(a.variants), "rows": {}}
    wd = Path(a.workdir).resolve()
    import torch

    if torch.cuda.is_available():
        sweep["gpu_model"] = torch.cuda.get_device_name(0)
    sweep.setdefault("commands", []).append(" ".join(sys.argv))
    for name in names:
        vfile = out / "configs" / f"{name}.yaml"
        vfile.write_text(yaml.safe_dump(variants[name] or {}, sort_keys=True))
        cfg = load_config([base], variants[name] or {})
        res = wd / "results" / cfg["run"]
        args = ["--configfile", str(base), str(vfile.resolve()), "--cores", str(a.cores), "--until", "export_head",
                *(["--resources", f"gpu={a.gpus}"] if a.gpus else []), *a.extra]
        planned = planned_jobs(exe, args, wd)
        t_start = time.time()
        p = subprocess.run([*exe, "-s", str(REPO / "Snakefile"), "-d", str(wd), *args], cwd=REPO,
                           stdout=sys.stderr, stderr=sys.stderr)
        if p.returncode != 0:
            raise SystemExit(f"recipe_sweep: variant {name}: snakemake failed (exit {p.returncode})")
        row = {"overrides": variants[name] or {}, "planned_jobs": planned,
               "build_seconds": round(time.time() - t_start, 1),
               "gpu_stage_seconds": stage_seconds(res / "benchmarks", t_start), **record_variant(res)}
        sweep["rows"][name] = row
        if a.keep_heads:
            keep_head(res, out / name / "head")
        sweep_json.write_text(json.dumps(sweep, indent=2) + "\n")
        print(f"recipe_sweep: {name}: {json.dumps({k: row[k] for k in ('planned_jobs', 'build_seconds', 'simulated_tau')})}",
              file=sys.stderr, flush=True)
    print(json.dumps(sweep, indent=2))
    return sweep


if __name__ == "__main__":
    main()
