"""Issue 38.9: a build killed mid-job leaves Snakemake's lock; README's troubleshooting part says how to
recover, and its commands do recover a build killed here."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time

from smk import REPO, SNAKEMAKE, run


def troubleshooting_commands() -> tuple[str, list[list[str]]]:
    """README's troubleshooting section and the snakemake arguments of its commands."""
    text = (REPO / "README.md").read_text()
    section = re.search(r"^## Troubleshooting[^\n]*\n(.*?)(?=^## )", text, re.S | re.M).group(1)
    block = section.split("```", 2)[1]
    cmds = [line.split("#", 1)[0].split()[1:] for line in block.splitlines() if line.startswith(".venv/bin/snakemake")]
    return section, cmds


def test_readme_recovers_a_killed_build(tmp_path):
    section, cmds = troubleshooting_commands()
    assert "LockException" in section and [c[0] for c in cmds] == ["--unlock", "--cores"]
    assert "--rerun-incomplete" in cmds[1]
    # a build killed mid-job (SIGKILL: no cleanup), the bundled target's materialisation running
    p = subprocess.Popen([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--cores", "1", "-d", str(tmp_path),
                          "--until", "materialize_target"], cwd=REPO, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not list((tmp_path / ".snakemake/incomplete").glob("*")) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert list((tmp_path / ".snakemake/incomplete").glob("*")), "the job never started"
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    locked = run(["--until", "materialize_target"], tmp_path)  # the next run (a dry-run takes no lock)
    assert locked.returncode != 0 and "LockException" in locked.stdout + locked.stderr
    assert run(cmds[0], tmp_path).returncode == 0  # --unlock
    plan = run(["-n", *cmds[1][2:], "--until", "materialize_target"], tmp_path)  # the rerun's plan, not the build
    assert plan.returncode == 0, plan.stderr
    assert re.search(r"^materialize_target\s+1$", plan.stdout + plan.stderr, re.M)


def test_cluster_recovery_links_the_troubleshooting_section():
    """docs/running.md's SLURM part names the queued jobs a killed run leaves (scancel by the run's id) and links
    README's troubleshooting section by its heading's anchor; README links back."""
    section, _ = troubleshooting_commands()
    heading = re.search(r"^## (Troubleshooting[^\n]*)", (REPO / "README.md").read_text(), re.M).group(1)
    anchor = re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")  # GitHub's heading anchors
    running = (REPO / "docs/running.md").read_text()
    assert f"(../README.md#{anchor})" in running and "scancel --name <id>" in running and "SLURM run ID" in running
    assert "[docs/running.md](docs/running.md)" in section and "make run" in section
