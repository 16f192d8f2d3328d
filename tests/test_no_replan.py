"""No refactoring replans a build: the rerun-trigger params of every job, as Snakemake compares them
(tests/plan_params.py), are those recorded in tests/plan_params/<name>.json for the shipped configs
(the default, the reduced test build, examples) and a regenerating variant.

The package versions in the ``version`` params are the environment's, so they are compared by name
(a package upgrade is meant to replan). A deliberate change of a stage's output (an OUTPUT_VERSION
bump, a new trigger) re-records the file: ``python tests/test_no_replan.py``.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml
from smk import REPO

RECORDED = REPO / "tests/plan_params"
CONFIGS = {
    "default": "config.yaml",
    "reduced": "tests/reduced.yaml",
    "smollm2-8k-gpu": "examples/configs/smollm2-8k-gpu.yaml",
    "llama-3.1-8b-1gpu": "examples/configs/llama-3.1-8b-1gpu.yaml",
    "kimi-k2.5-online-8x-b200": "examples/configs/kimi-k2.5-online-8x-b200.yaml",
    # regenerate_responses and preflight_bound in the plan too
    "reduced-regenerate": ("tests/reduced.yaml", {"data": {"regenerate": {"enabled": True}},
                                                  "preflight": {"enabled": "always"}}),
}


def _merge(base: dict, over: dict) -> dict:
    for k, v in over.items():
        base[k] = _merge(base.get(k, {}), v) if isinstance(v, dict) else v
    return base


def _config_file(name: str, tmp_path) -> str:
    spec = CONFIGS[name]
    if isinstance(spec, str):
        return str(REPO / spec)  # an absolute path stays itself
    cfg = _merge(yaml.safe_load((REPO / spec[0]).read_text()), spec[1])
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _versions_by_name(params: dict[str, list[str]]) -> dict[str, list[str]]:
    """The params with each installed package version replaced by ``*``."""
    return {job: [re.sub(r"('[\w-]+'): '[^']*'", r"\1: '*'", v) for v in values] for job, values in params.items()}


def plan_params(name: str, tmp_path) -> dict[str, list[str]]:
    """The params of the plan of config ``name`` in an empty working directory, versions by name."""
    wd = tmp_path / f"wd-{name}"
    wd.mkdir()
    p = subprocess.run([sys.executable, str(REPO / "tests/plan_params.py"), _config_file(name, tmp_path), str(wd)],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    return _versions_by_name(json.loads(p.stdout))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_params_are_the_recorded_ones(name, tmp_path):
    recorded = json.loads((RECORDED / f"{name}.json").read_text())
    assert plan_params(name, tmp_path) == recorded


def test_a_config_with_a_renamed_key_plans_the_same(tmp_path):
    """A config written before a key was renamed (benchmark.dtype, now target.serve_dtype: config.spec.RENAMED)
    plans with the params the new name gives."""
    cfg = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())
    cfg["benchmark"]["dtype"] = cfg["target"].pop("serve_dtype")
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(cfg))
    CONFIGS["old-key"] = str(tmp_path / "old.yaml")
    try:
        assert plan_params("old-key", tmp_path) == json.loads((RECORDED / "reduced.json").read_text())
    finally:
        del CONFIGS["old-key"]


def test_the_version_normalisation_keeps_the_names():
    assert _versions_by_name({"j": ["{'output': 3, 'packages': {'speculators': '0.9.0', 'torch': '2.13.0+cpu'}}"]}) \
        == {"j": ["{'output': 3, 'packages': {'speculators': '*', 'torch': '*'}}"]}


if __name__ == "__main__":
    import tempfile
    from pathlib import Path

    RECORDED.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        for n in sorted(CONFIGS):
            (RECORDED / f"{n}.json").write_text(json.dumps(plan_params(n, Path(d)), indent=1) + "\n")
