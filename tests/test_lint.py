"""Lint: `ruff check` (pyflakes, pycodestyle, import order; pyproject.toml [tool.ruff]) on the project's own Python
files (those git tracks or is about to: a script a user keeps in the checkout is not the project's) and
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


def project_python_files(root: Path = REPO) -> list[str]:
    """The project's Python files: tracked by git, or added to its index (``git ls-files --cached``); not an
    untracked file in the checkout. Without git (an exported tree), every ``*.py`` under ``root``."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--", "*.py"], capture_output=True, text=True, cwd=root,
                             check=True, timeout=60).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return ["."]
    return [f for f in out if (root / f).exists()]


def test_ruff_check_is_clean():
    p = subprocess.run([_tool("ruff"), "check", "--no-cache", *project_python_files()], capture_output=True,
                       text=True, cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]


def test_a_script_kept_in_the_checkout_is_not_linted(tmp_path):
    """An untracked script in a git checkout (a user's scratch file) is not one of the project's files."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "kept.py").write_text("import os\n")
    (tmp_path / "mine.py").write_text("import os\n")
    subprocess.run(["git", "add", "kept.py"], cwd=tmp_path, check=True)
    assert project_python_files(tmp_path) == ["kept.py"]


def test_snakefmt_check_is_clean():
    p = subprocess.run([_tool("snakefmt"), "--check", "Snakefile", "rules"], capture_output=True, text=True,
                       cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
