"""The slurm profile against SLURM: the sbatch calls it makes (always), and jobs of the reduced config
through sbatch on a one-node cluster started here (tests/slurm/start_cluster.sh; needs root and
apt-get on Debian/Ubuntu, or SLURM already installed; skipped with the failing step otherwise).

The cluster run works on a copy of the session's reduced build (tests/conftest.py; test_e2e.py checks
that build): 8 more training samples replan one new shard, the vocab map, training and export (without its vLLM
load check, as tests/reduced.yaml: an engine in a job costs a minute here; the sbatch call of export with it is checked
against the stub), each an sbatch job, and a deleted compat.md is rendered by Snakemake itself
(a localrule). The benchmark, the other vLLM job, is left out: its sbatch call is checked against the stub,
and on this cluster each job costs its run time rounded up to the plugin's status checks (2 s, then 10 s
more each time), several minutes for the benchmark's two engines."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from smk import REPO, SNAKEMAKE, copy_build

pytestmark = pytest.mark.slurm
pytest.importorskip("snakemake_executor_plugin_slurm",
                    reason="the SLURM executor plugin is not installed (requirements-executors.txt)")

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
GPU_SITE = """export: {vllm_load_check: always}   # tests/reduced.yaml has never
resources:
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
def cluster(slurm_cluster_start):
    """The one-node cluster (started once a session, tests/conftest.py): its partition; skip naming the step and
    error line when it cannot run."""
    p = slurm_cluster_start
    if p.returncode != 0:
        pytest.skip(f"no SLURM cluster here (start_cluster.sh exit {p.returncode}): "
                    f"{(p.stderr.strip().splitlines() or ['?'])[-1]}")
    return p.stdout.split()[-1]


# The change and the jobs it plans (the rerun matrix's "more samples", test_e2e.py, up to the head), and the
# ones submitted: the Snakefile's localrules (all, compat_markdown, plot_benchmark, serve_config) run in Snakemake's own
# process, no sbatch.
MORE_SAMPLES = "capture: {num_train_samples: 24}\n"  # export without its vLLM load check, as reduced.yaml
TARGETS = [f"{RUN}/head/config.json", f"{RUN}/compat.md"]
SUBMITTED = {"capture_hidden_states": 1, "build_vocab_map": 1, "train_draft": 1, "export_head": 1}
PLANNED = {**SUBMITTED, "compat_markdown": 1}


@pytest.fixture(scope="module")
def built(cluster, reduced_build, tmp_path_factory):
    """The change built through the slurm profile on a copy of the reduced build: ``(workdir, process, start)``."""
    d = tmp_path_factory.mktemp("slurm")
    wd = copy_build(reduced_build[0], d / "wd")
    (wd / RUN / "compat.md").unlink()
    (d / "more.yaml").write_text(MORE_SAMPLES)
    start = time.time()
    args = [*TARGETS, "--jobs", "2", "--slurm-status-command", "squeue", "--slurm-no-account",
            # the plugin's status checks 2 s after a job ends or starts, then 10 s more each time: 82-104 s for this
            # build here against 112 s from 5 s (its four jobs run 62 s; make test at 8d28b85, 7956d91 and 4ee873c)
            "--slurm-keep-successful-logs", "--slurm-init-seconds-before-status-checks", "2",
            # the test node's partition; the jobs' CPUs, memory and time are the config's (no GPUs)
            "--default-resources", f"slurm_partition={cluster}"]
    p = smk(args, wd, timeout=3000, configs=[d / "more.yaml"])
    if p.returncode != 0:
        logs = "\n".join(f"== {f}\n{f.read_text()[-2000:]}" for f in sorted(wd.rglob("*.log")))
        pytest.fail(f"workflow through SLURM failed:\n{p.stderr[-4000:]}\n{logs[-12000:]}")
    return wd, p, start


def test_reduced_run_through_slurm(built):
    """The copy counts as built (the plan holds the change's jobs only), and the SLURM jobs wrote the change's
    outputs: a third training shard, the vocab map and checkpoint of 24 samples, the exported head."""
    wd, p, start = built
    out = p.stdout + p.stderr
    table = out.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    assert {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)
            if m.group(1) != "total"} == PLANNED, out[-3000:]
    res = wd / RUN
    assert sorted(f.name for f in (res / "hidden_states/train").glob("shard-*.safetensors")) == [
        "shard-00000.safetensors", "shard-00001.safetensors", "shard-00002.safetensors"]
    vocab = json.loads((res / "vocab/vocab.json").read_text())
    assert vocab["num_samples"] == 24 and vocab["draft_vocab_size"] == 2048
    assert json.loads((res / "checkpoint/train_meta.json").read_text())["vocab_fingerprint"] == vocab["fingerprint"]
    assert json.loads((res / "head/config.json").read_text())["speculators_model_type"] == "eagle3"
    for f in ("hidden_states/train/shard-00002.safetensors", "vocab/vocab.json", "checkpoint/model.safetensors",
              "head/model.safetensors", "compat.md"):
        assert (res / f).stat().st_mtime > start, f
    assert "backend: **hooks**" in (res / "compat.md").read_text()


def test_every_job_went_through_sbatch(built):
    """One kept SLURM log per submitted job (the plugin writes .snakemake/slurm_logs/rule_<rule>/.../<jobid>.log),
    and SLURM's job-completion log lists those job ids as COMPLETED in this workdir. compat.md, a localrule's
    output, was written without one."""
    wd, _, _ = built
    logs = sorted((wd / ".snakemake/slurm_logs").rglob("*.log"))
    by_rule = {}
    for f in logs:
        rule = next(part for part in f.relative_to(wd / ".snakemake/slurm_logs").parts if part.startswith("rule_"))
        by_rule[rule[5:]] = by_rule.get(rule[5:], 0) + 1
    assert by_rule == SUBMITTED
    ids = {f.stem for f in logs}
    comp = Path("/var/log/slurm/jobcomp.log").read_text()
    done = {m.group(1) for m in re.finditer(r"JobId=(\d+) .*?JobState=COMPLETED .*?WorkDir=(\S+)", comp)
            if Path(m.group(2)).resolve() == wd.resolve()}
    assert ids <= done and len(ids) == 4, (ids, done)
