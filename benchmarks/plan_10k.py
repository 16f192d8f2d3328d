"""Planning cost of a 10,000-shard run: `snakemake -n` on this workflow with 10,000 capture jobs,
beside two bare Snakefiles of the same DAG (10,000 jobs feeding one aggregate), timed in the same
run on this machine:
- ``bare-script``: each job a ``script:`` with a ``log:``, as every rule here must be (an adapter
  under scripts/, a log per job). Snakemake checks per job that a ``script:`` is accessible
  (snakemake/dag.py, ``ScriptProcessor.process_job``): a cost of the rule kind, not of our params.
- ``bare-shell``: each job a one-line ``shell:`` without a log (the cheapest rule Snakemake has).
- ``bare-dag``: the DAG of our workflow's planned shard path, edges included, and nothing else:
  one job writes ``decisions.json``, one the two token files, each shard job a ``script:`` with
  a ``log:`` that reads ``decisions.json`` and its split's tokens (as ``capture_hidden_states``
  does), one job reads every shard (as ``train_draft`` does). The two bare DAGs above have no
  input edges; comparing ``bare-dag`` with ``bare-script`` gives what the edges cost.
Goal (issue 14: "the bare Snakefile of the same shape"): ours <= 1.25x bare-dag in CPU seconds;
all three ratios are printed.

    .venv/bin/python benchmarks/plan_10k.py        # writes benchmarks/plan_10k.txt
"""
from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
N = 10_000
_DAG = """N = {N}


rule all:
    input:
        expand("shards/shard-{{i:05d}}.txt", i=range(N)),


rule shard:
    output:
        "shards/shard-{{i}}.txt",
"""
# The same DAG twice: jobs that are `script:` rules with a `log:` (as every rule here is), and
# one-line `shell:` jobs (the cheapest rule Snakemake has).
BARE_SCRIPT = _DAG + """    log:
        "logs/shard-{{i}}.log",
    script:
        "shard.py"
"""
BARE = _DAG + """    shell:
        "echo {{wildcards.i}} > {{output}}"
"""
# Our shard path's shape: the same input edges as capture_hidden_states, train_draft's aggregate.
BARE_DAG = """N = {N}
N_EVAL = {N_EVAL}
SHARDS = [f"hidden_states/train/shard-{{i:05d}}.txt" for i in range(N - N_EVAL)] + [
    f"hidden_states/eval/shard-{{i:05d}}.txt" for i in range(N_EVAL)
]


rule all:
    input:
        "checkpoint.txt",


rule report:
    output:
        "decisions.json",
    log:
        "logs/report.log",
    script:
        "shard.py"


rule prepare:
    output:
        "data/train.txt",
        "data/eval.txt",
    log:
        "logs/prepare.log",
    script:
        "shard.py"


rule shard:
    input:
        decisions="decisions.json",
        tokens="data/{{split}}.txt",
    output:
        "hidden_states/{{split}}/shard-{{i}}.txt",
    log:
        "logs/{{split}}-{{i}}.log",
    script:
        "shard.py"


rule train:
    input:
        SHARDS,
    output:
        "checkpoint.txt",
    log:
        "logs/train.log",
    script:
        "shard.py"
"""


def cpu_of_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def dry_run(snakefile: Path, workdir: Path, *args: str) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system: less sensitive to other work on a shared machine), stdout."""
    cmd = [SNAKEMAKE, "-s", str(snakefile), "-d", str(workdir), "--cores", "2", "-n", *args]
    t, c = time.perf_counter(), cpu_of_children()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    dt, dc = time.perf_counter() - t, cpu_of_children() - c
    if p.returncode != 0:
        sys.exit(p.stderr[-3000:])
    return dt, dc, p.stdout


def jobs_of(out: str, rule: str) -> int:
    return int(next(line.split()[1] for line in out.split("Job stats:", 1)[1].splitlines()
                    if line.startswith(rule + " ")))


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=N, help="shard jobs to plan (tests: a few)")
    ap.add_argument("--reps", type=int, default=2, help="runs of each of the four plans, alternating; the best counts")
    ap.add_argument("--out", default=str(REPO / "benchmarks/plan_10k.txt"))
    args = ap.parse_args()
    n = args.shards
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cfg = yaml.safe_load((REPO / "config.yaml").read_text())
        cfg["run"] = "plan10k"
        cfg["target"]["path"] = str(REPO / "examples/targets/llama-3.1-8b-instruct-shape")  # config only: exists
        n_eval = min(10, n // 2)
        cfg["capture"].update(num_train_samples=n - n_eval, num_eval_samples=n_eval, samples_per_shard=1)
        (tmp / "plan10k.yaml").write_text(yaml.safe_dump(cfg))
        (tmp / "bare").mkdir()
        (tmp / "bare/Snakefile").write_text(BARE.format(N=n))
        (tmp / "bare_script").mkdir()
        (tmp / "bare_script/Snakefile").write_text(BARE_SCRIPT.format(N=n))
        (tmp / "bare_script/shard.py").write_text("open(snakemake.output[0], 'w').write(snakemake.wildcards.i)\n")
        (tmp / "bare_dag").mkdir()
        (tmp / "bare_dag/Snakefile").write_text(BARE_DAG.format(N=n, N_EVAL=n_eval))
        (tmp / "bare_dag/shard.py").write_text("open(snakemake.output[0], 'w').write('x')\n")
        (tmp / "ours").mkdir()
        rows = []
        for rep in range(args.reps):  # alternate, keep the fastest
            *bare, out_bare = dry_run(tmp / "bare/Snakefile", tmp / "bare")
            *bare_s, out_bare_s = dry_run(tmp / "bare_script/Snakefile", tmp / "bare_script")
            *bare_d, out_bare_d = dry_run(tmp / "bare_dag/Snakefile", tmp / "bare_dag")
            *ours, out_ours = dry_run(REPO / "Snakefile", tmp / "ours", "--configfile", str(tmp / "plan10k.yaml"))
            rows.append((*ours, *bare, *bare_s, *bare_d))
        assert jobs_of(out_bare, "shard") == n and jobs_of(out_bare_s, "shard") == n and jobs_of(out_bare_d, "shard") == n
        assert jobs_of(out_ours, "capture_hidden_states") == n
        t_ours, c_ours, t_bare, c_bare, t_bs, c_bs, t_bd, c_bd = (min(r[i] for r in rows) for i in range(8))
    lines = [
        f"snakemake -n, {n} shard jobs + aggregate, --cores 2, {os.cpu_count()} CPU(s), "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}",
        "runs (wall/cpu s: ours, bare-shell, bare-script, bare-dag): "
        + ", ".join("(" + ", ".join(f"{r[i]:.1f}/{r[i + 1]:.1f}" for i in range(0, 8, 2)) + ")" for r in rows),
        f"ours: {t_ours:.1f} s wall, {c_ours:.1f} s CPU (best of {len(rows)}; {n} capture_hidden_states + the other jobs)",
        f"bare-dag: {t_bd:.1f} s wall, {c_bd:.1f} s CPU (best of {len(rows)}; our shard path's shape: report, prepare, "
        f"{n} script jobs with a log reading both, one aggregate)",
        f"bare-script: {t_bs:.1f} s wall, {c_bs:.1f} s CPU (best of {len(rows)}; {n} script jobs with a log + all, no inputs)",
        f"bare-shell: {t_bare:.1f} s wall, {c_bare:.1f} s CPU (best of {len(rows)}; {n} one-line shell jobs + all, no inputs)",
        f"ratio to bare-dag: {t_ours / t_bd:.2f}x wall, {c_ours / c_bd:.2f}x CPU (goal <= 1.25x)",
        f"ratio to bare-script: {t_ours / t_bs:.2f}x wall, {c_ours / c_bs:.2f}x CPU",
        f"ratio to bare-shell: {t_ours / t_bare:.2f}x wall, {c_ours / c_bare:.2f}x CPU",
    ]
    print("\n".join(lines))
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
