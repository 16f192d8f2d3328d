"""The params of the rules added to the plan after tests/plan_params/ was recorded (tests/plan_params.py
``LATER_RULES``: serve_config, issue 60), pinned in tests/plan_params_later/<name>.json for the same configs as
tests/test_no_replan.py: a refactoring that changes one replans those jobs of every build. tests/plan_params/ itself
stays as recorded, the proof that no job of a build made before them replans. serve_config's output version 2
(serving.json's ``sampling``, 2026-12-07) replans that cheap local job once, on purpose: it rewrites the serving files
with the new field and nothing else."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from smk import REPO
from test_no_replan import CONFIGS, _config_file, _versions_by_name

RECORDED = REPO / "tests/plan_params_later"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_later_rules_params_are_the_recorded_ones(name, tmp_path):
    wd = tmp_path / f"wd-{name}"
    wd.mkdir()
    p = subprocess.run([sys.executable, str(REPO / "tests/plan_params.py"), _config_file(name, tmp_path), str(wd),
                        "--later"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    params = _versions_by_name(json.loads(p.stdout))
    assert list(params) == ["serve_config[]"]  # one job a build
    assert params == json.loads((RECORDED / f"{name}.json").read_text())
