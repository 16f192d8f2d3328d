"""The slurm profile against SLURM: the sbatch calls it makes (always), and the reduced config
end to end on a one-node cluster started here (tests/slurm/start_cluster.sh; needs root and
apt-get on Debian/Ubuntu, or SLURM already installed; skipped with the failing step otherwise)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from smk import REPO, SNAKEMAKE

pytestmark = pytest.mark.slurm
pytest.importorskip("snakemake_executor_plugin_slurm",
                    reason="the SLURM executor plugin is not installed (requirements-executors.txt)")

PARTITION = "e3test"
RUN = "results/reduced"
# What a job's files need before it can be submitted on its own (empty stand-ins, oldest first).
UPSTREAM = [
    *(f"resources/targets/smollm2-135m-instruct/{f}" for f in ("chat_template.jinja", "config.json",
      "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")),
    f"{RUN}/decisions.json", f"{RUN}/compat.json", f"{RUN}/compat.md",
    f"{RUN}/data/train.safetensors", f"{RUN}/data/eval.safetensors", f"{RUN}/data/prompts.jsonl",
    f"{RUN}/data/data_report.json",
    f"{RUN}/hidden_states/train/shard-00000.safetensors", f"{RUN}/hidden_states/train/shard-00001.safetensors",
    f"{RUN}/hidden_states/eval/shard-00000.safetensors",
    f"{RUN}/vocab/d2t.npy", f"{RUN}/vocab/t2d.npy", f"{RUN}/vocab/vocab.json",
    *(f"{RUN}/checkpoint/{f}" for f in ("config.json", "model.safetensors", "train_meta.json", "metrics.json",
                                         "curves.png")),
    f"{RUN}/head/config.json", f"{RUN}/head/model.safetensors", f"{RUN}/head/head_meta.json",
]
STUB = """#!/bin/sh
# stand-in for {name}: records its arguments, refuses to submit
echo "{name} $*" >> "{log}"
echo "stub {name}: no cluster here" >&2
exit 1
"""


# A site's GPU jobs as a user writes them in the config (the one source of resources; the profile
# says only where jobs run): what the sbatch calls must carry.
GPU_SITE = """resources:
  gpu_model: rtx_pro_6000
  capture: {gpu: 8, threads: 16, mem_mb: 256000, runtime: 240}
  train: {gpu: 8, threads: 32, mem_mb: 256000, runtime: 1440}
  serve: {gpu: 8, threads: 16, mem_mb: 256000, runtime: 180}
"""


def smk(args, workdir, env=None, timeout=600, configs=()):
    cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--profile", str(REPO / "profiles/slurm"),
           *args, "--configfile", str(REPO / "tests/reduced.yaml"), *map(str, configs)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


@pytest.mark.parametrize("target, expect", [
    (f"{RUN}/hidden_states/train/shard-00001.safetensors",
     ["-p gpu", "--gpus=rtx_pro_6000:8", "--cpus-per-task=16", "--mem 256000", "-t 240"]),
    (f"{RUN}/checkpoint/model.safetensors",
     ["-p gpu", "--gpus=rtx_pro_6000:8", "--cpus-per-task=32", "--mem 256000", "-t 1440"]),
    (f"{RUN}/benchmark.json",
     ["-p gpu", "--gpus=rtx_pro_6000:8", "--cpus-per-task=16", "--mem 256000", "-t 180"]),
    (f"{RUN}/head/config.json",  # export's vLLM load check serves the target like the benchmark
     ["-p gpu", "--gpus=rtx_pro_6000:8", "--cpus-per-task=16", "--mem 256000", "-t 180"]),
    (f"{RUN}/vocab/vocab.json", ["-p gpu", "--ntasks=1", "--cpus-per-task=1", "--mem 8000", "-t 60"]),
])
def test_sbatch_call_of_the_profile(tmp_path, target, expect):
    """The unmodified slurm profile over a config with a site's GPU jobs, one job at a time, against a stub
    sbatch: the submission carries the profile's partition and the config's GPUs (model:count), CPUs (the
    job's threads), memory and time limit."""
    wd, bin_, log = tmp_path / "wd", tmp_path / "bin", tmp_path / "calls.log"
    bin_.mkdir()
    for name in ("sbatch", "squeue", "sacct", "sinfo", "scontrol", "sacctmgr", "sshare"):
        (bin_ / name).write_text(STUB.format(name=name, log=log))
        (bin_ / name).chmod(0o755)
    now = time.time()
    for i, f in enumerate(UPSTREAM):
        (wd / f).parent.mkdir(parents=True, exist_ok=True)
        (wd / f).write_text("")
        os.utime(wd / f, (now - 1000 + i, now - 1000 + i))
    os.utime(wd / Path(UPSTREAM[0]).parent, (now - 1000, now - 1000))  # the target is a directory output
    (tmp_path / "site.yaml").write_text(GPU_SITE)
    p = smk([target, "--force", "--rerun-triggers", "mtime", "--slurm-status-command", "squeue", "--slurm-no-account",
             "--slurm-init-seconds-before-status-checks", "1"], wd, env={"PATH": f"{bin_}:{os.environ['PATH']}"}, timeout=300,
            configs=[tmp_path / "site.yaml"])
    calls = [c for c in log.read_text().splitlines() if c.startswith("sbatch ")] if log.exists() else []
    # the jobs that may start vLLM (capture with backend auto, benchmark, export with its load check) are
    # submitted once more after the stub's refusal: `retries: VLLM_RETRIES` (rules/common.smk), attempt 2;
    # training and the vocab map (no engine) are not
    retried = not ("vocab" in target or "checkpoint" in target)
    assert len(calls) == (2 if retried else 1), p.stdout + p.stderr
    assert " --attempt 1 " in calls[0] and (not retried or " --attempt 2 " in calls[1]), calls
    for flag in expect:
        assert f" {flag} " in calls[0] + " ", (flag, calls[0])
    if "--gpus" not in " ".join(expect):
        assert "--gpus" not in calls[0]


@pytest.fixture(scope="module")
def cluster():
    """Start (or find) the one-node cluster; skip naming the step and error line when it cannot run."""
    p = subprocess.run(["bash", str(REPO / "tests/slurm/start_cluster.sh")], capture_output=True, text=True,
                       timeout=1200, env={**os.environ, "SLURM_TEST_PARTITION": PARTITION})
    if p.returncode != 0:
        pytest.skip(f"no SLURM cluster here (start_cluster.sh exit {p.returncode}): "
                    f"{(p.stderr.strip().splitlines() or ['?'])[-1]}")
    return p.stdout.split()[-1]


@pytest.fixture(scope="module")
def built(cluster, tmp_path_factory):
    wd = tmp_path_factory.mktemp("slurm")
    args = ["--jobs", "2", "--slurm-status-command", "squeue", "--slurm-no-account",
            "--slurm-keep-successful-logs", "--slurm-init-seconds-before-status-checks", "5",
            # the test node's partition; the jobs' CPUs, memory and time are the config's (no GPUs)
            "--default-resources", f"slurm_partition={cluster}"]
    p = smk(args, wd, timeout=3000)
    if p.returncode != 0:
        logs = "\n".join(f"== {f}\n{f.read_text()[-2000:]}" for f in sorted(wd.rglob("*.log")))
        pytest.fail(f"workflow through SLURM failed:\n{p.stderr[-4000:]}\n{logs[-12000:]}")
    return wd, p


def test_reduced_run_through_slurm(built):
    wd, p = built
    res = wd / RUN
    b = json.loads((res / "benchmark.json").read_text())
    assert b["baseline"]["output_tokens"] > 0 and b["eagle3"][0]["num_speculative_tokens"] == 2
    assert b["eagle3"][0]["drafts"] > 0
    assert json.loads((res / "head/config.json").read_text())["speculators_model_type"] == "eagle3"
    assert len(list((res / "hidden_states/train").glob("shard-*.safetensors"))) == 2


def test_every_job_went_through_sbatch(built):
    """One kept SLURM log per job (the plugin writes .snakemake/slurm_logs/rule_<rule>/.../<jobid>.log),
    and SLURM's job-completion log lists those job ids as COMPLETED in this workdir. The Snakefile's
    localrules (all, compat_markdown, plot_benchmark) run in Snakemake's own process: no sbatch."""
    wd, p = built
    logs = sorted((wd / ".snakemake/slurm_logs").rglob("*.log"))
    by_rule = {}
    for f in logs:
        rule = next(part for part in f.relative_to(wd / ".snakemake/slurm_logs").parts if part.startswith("rule_"))
        by_rule[rule[5:]] = by_rule.get(rule[5:], 0) + 1
    assert by_rule == {"materialize_target": 1, "compat_report": 1, "prepare_data": 1,
                       "capture_hidden_states": 3, "build_vocab_map": 1, "train_draft": 1, "export_head": 1,
                       "benchmark": 1}
    ids = {f.stem for f in logs}
    comp = Path("/var/log/slurm/jobcomp.log").read_text()
    done = {m.group(1) for m in re.finditer(r"JobId=(\d+) .*?JobState=COMPLETED .*?WorkDir=(\S+)", comp)
            if Path(m.group(2)).resolve() == wd.resolve()}
    assert ids <= done and len(ids) == 10, (ids, done)
    assert (wd / "results/reduced/compat.md").exists() and (wd / "results/reduced/report/benchmark.png").exists()
