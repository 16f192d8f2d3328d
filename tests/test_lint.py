"""Lint: `ruff check .` (pyflakes, pycodestyle, import order; pyproject.toml [tool.ruff]) and
`snakefmt --check` on the Snakefile and rules/ (pyproject.toml [tool.snakefmt]). Both are pinned in
requirements.txt and installed by `make test` (install.sh); a finding fails with the tool's own report."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from smk import REPO


def _tool(name: str) -> str:
    """The tool's executable beside this Python (the venv's), else on PATH; skip when neither exists."""
    exe = Path(sys.executable).parent / name
    found = str(exe) if exe.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (requirements.txt pins it; run ./install.sh)")
    return found


def test_ruff_check_is_clean():
    p = subprocess.run([_tool("ruff"), "check", "--no-cache", "."], capture_output=True, text=True, cwd=REPO,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]


def test_snakefmt_check_is_clean():
    p = subprocess.run([_tool("snakefmt"), "--check", "Snakefile", "rules"], capture_output=True, text=True,
                       cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
