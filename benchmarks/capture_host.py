"""Benchmark: a run's capture jobs through one job host against each job in its own process (issue 70, ask 3).

    .venv/bin/python benchmarks/capture_host.py --workdir WD --configfile CONFIG [CONFIG ...] [--cores 16]
        [--resources gpu=1] [--json OUT]

WD holds a build of CONFIG with its compat report and token files (later outputs may be there too: they go stale,
since only the capture jobs run, forced: ``--forcerun capture_hidden_states --until capture_hidden_states``). The
capture jobs run twice in one run of this script, each job in its own process first (``EAGLE3BUILD_JOB_HOST=0``, the
route before issue 70), then through job hosts (eagle3build/workflow/host.py); per route it prints the snakemake
call's wall seconds, each job's seconds (its benchmark file), the target loads (the "target loaded in" lines of that
route's job and host logs) and the hosts started, then whether both routes wrote the same shard bytes and the ratio
of their wall seconds. Goal: the recipe's 5 shards within 60 s through hosts on an H100; on CPU, one load.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from benchlab.benchkit import load_config

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def run_route(wd: Path, configs: list[str], cores: int, resources: list[str], hosted: bool) -> dict:
    """One forced run of the capture jobs in ``wd``: wall seconds, each job's seconds, target loads, hosts, digests."""
    run = load_config(configs)["run"]
    logs, bench = wd / "logs" / run / "capture_hidden_states", wd / "results" / run / "benchmarks/capture_hidden_states"
    env = {**os.environ, "EAGLE3BUILD_JOB_HOST": "1" if hosted else "0"}
    cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(wd), "--cores", str(cores), "--forcerun",
           "capture_hidden_states", "--until", "capture_hidden_states", "-q", "--configfile", *configs]
    if resources:
        cmd += ["--resources", *resources]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.time() - t0
    if p.returncode != 0:
        sys.exit(f"snakemake failed ({'hosts' if hosted else 'own process'}):\n{p.stderr[-3000:]}")
    time.sleep(2)  # a host writes its last line as its Snakemake process ends
    new_logs = [f for f in logs.glob("*.log") if f.stat().st_mtime >= t0]
    host_logs = [f for f in new_logs if f.name.startswith("host-")]
    jobs = {f.stem: float(f.read_text().splitlines()[1].split("\t")[0]) for f in sorted(bench.glob("*.tsv"))
            if f.stat().st_mtime >= t0}
    shards = sorted((wd / "results" / run / "hidden_states").glob("*/shard-*.safetensors"))
    return {"wall_s": round(wall, 2), "job_s": jobs, "jobs_s_sum": round(sum(jobs.values()), 2),
            "target_loads": sum(len(re.findall(r"target loaded in [\d.]+ s", f.read_text())) for f in new_logs),
            "hosts": len(host_logs),
            "shards": {f"{f.parent.name}/{f.name}": hashlib.sha256(f.read_bytes()).hexdigest() for f in shards}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True, type=Path)
    ap.add_argument("--configfile", nargs="+", required=True)
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--resources", nargs="*", default=[], help="snakemake --resources, e.g. gpu=1")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    configs = [str(Path(c).resolve()) for c in args.configfile]
    own = run_route(args.workdir, configs, args.cores, args.resources, hosted=False)
    hosted = run_route(args.workdir, configs, args.cores, args.resources, hosted=True)
    out = {"own_process": {k: v for k, v in own.items() if k != "shards"},
           "hosts": {k: v for k, v in hosted.items() if k != "shards"},
           "shards": len(hosted["shards"]), "same_bytes": own["shards"] == hosted["shards"],
           "wall_ratio_own_over_hosts": round(own["wall_s"] / hosted["wall_s"], 3), "cores": args.cores}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
