"""Helpers to run the workflow through the snakemake CLI in a subprocess."""
from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
_PYTHONPATH = os.environ.get("PYTHONPATH")  # the session's: the fork server's, whatever a test sets later


def write_config(path: Path, **overrides) -> Path:
    """config.yaml with nested ``overrides`` (``{"capture": {"num_train_samples": 5}}``) applied."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    for section, values in overrides.items():
        if isinstance(values, dict):
            cfg[section].update(values)
        else:
            cfg[section] = values
    path.write_text(yaml.safe_dump(cfg))
    return path


_SERVER: dict = {}  # tests/smk_server.py of this process: its Popen


def _server() -> subprocess.Popen:
    proc = _SERVER.get("proc")
    if proc is None or proc.poll() is not None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(PYTHONUNBUFFERED="1", **({"PYTHONPATH": _PYTHONPATH} if _PYTHONPATH is not None else {}))
        proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("smk_server.py"))], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
        atexit.register(proc.kill)
        _SERVER["proc"] = proc
    return proc


def _run_forked(cmd: list[str], env: dict, timeout: int) -> subprocess.CompletedProcess:
    """``cmd`` (snakemake's arguments after SNAKEMAKE) as a child of the fork server (tests/smk_server.py)."""
    proc = _server()
    with tempfile.TemporaryDirectory(prefix="smk-") as d:
        out, err = Path(d) / "stdout", Path(d) / "stderr"
        proc.stdin.write(json.dumps({"args": cmd[1:], "cwd": str(REPO), "env": env, "stdout": str(out),
                                     "stderr": str(err), "timeout": timeout}) + "\n")
        proc.stdin.flush()
        reply = json.loads(proc.stdout.readline())
        stdout, stderr = out.read_text(), err.read_text()
    if reply["timed_out"]:
        raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr)
    return subprocess.CompletedProcess(cmd, reply["rc"], stdout, stderr)


def run(args: list[str], workdir: Path | None = None, timeout: int = 3600) -> subprocess.CompletedProcess:
    """snakemake on the repository's Snakefile with ``args`` (in ``workdir``), as a process of its own: a child
    of the fork server (tests/smk_server.py: snakemake imported once a session), or a fresh process where the
    environment's PYTHONPATH is not the server's (a test that puts packages first on the path) or
    EAGLE3BUILD_TEST_FORK_SNAKEMAKE=0."""
    cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--cores", "2"]
    if workdir is not None:
        cmd += ["-d", str(workdir)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if env.get("EAGLE3BUILD_TEST_FORK_SNAKEMAKE", "1") != "0" and env.get("PYTHONPATH") == _PYTHONPATH:
        return _run_forked(cmd + args, env, timeout)
    return subprocess.run(cmd + args, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def planned_jobs(args: list[str], workdir: Path | None = None) -> dict[str, int]:
    """Rule -> job count of a dry-run's "Job stats" table ({} when nothing is to be done)."""
    p = run(["-n", *args], workdir)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout + p.stderr
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1]
    jobs = {}
    for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M):
        if m.group(1) != "total":
            jobs[m.group(1)] = int(m.group(2))
    return jobs


def planned_resources(args: list[str], workdir: Path | None = None) -> dict[str, list[dict[str, str]]]:
    """Rule -> the ``resources:`` of each of its jobs in a dry-run (values as printed), with ``threads``."""
    p = run(["-n", *args], workdir)
    assert p.returncode == 0, p.stdout + p.stderr
    jobs: dict[str, list[dict[str, str]]] = {}
    for m in re.finditer(r"^(?:local)?rule (\w+):\n((?:    .*\n?)*)", p.stdout, re.M):
        r = re.search(r"^    resources: (.*)$", m.group(2), re.M)
        res = dict(kv.split("=", 1) for kv in r.group(1).split(", ")) if r else {}
        t = re.search(r"^    threads: (\d+)$", m.group(2), re.M)
        if t:
            res["threads"] = t.group(1)  # printed apart from the resources
        jobs.setdefault(m.group(1), []).append(res)
    return jobs


def plan_params(config: Path, workdir: Path) -> dict[str, list]:
    """Every planned job's params for ``config`` (tests/plan_params.py run in ``workdir``): job -> param values."""
    import ast

    p = subprocess.run([sys.executable, str(REPO / "tests/plan_params.py"), str(config), str(workdir)],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    return {job: [ast.literal_eval(v) for v in values] for job, values in json.loads(p.stdout).items()}


def copy_build(wd: Path, dest: Path) -> Path:
    """A copy of a build's workdir that Snakemake sees as built: the files with their times, and the
    metadata (.snakemake/metadata: the params, versions and checksums the rerun triggers compare)
    without the original's locks, logs and incomplete markers."""
    shutil.copytree(wd, dest, ignore=shutil.ignore_patterns(".snakemake"))
    shutil.copytree(wd / ".snakemake/metadata", dest / ".snakemake/metadata")
    return dest
