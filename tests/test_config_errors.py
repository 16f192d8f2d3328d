"""A config that fails the schema stops planning with one line: the key, the file that sets it and the closest
valid name (eagle3build.config.errors); Snakemake's full message only where EAGLE3BUILD_FULL_CONFIG_ERRORS=1."""
from __future__ import annotations

import os

import yaml
from smk import REPO, run

from eagle3build.config import errors as config_errors

SCHEMA = yaml.safe_load((REPO / "schemas/config.schema.yaml").read_text())
DEFAULT = yaml.safe_load((REPO / "config.yaml").read_text())
FULL = "; EAGLE3BUILD_FULL_CONFIG_ERRORS=1 shows Snakemake's full message"


def _with(**sections):
    cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in DEFAULT.items()}
    for k, v in sections.items():
        cfg[k] = {**cfg.get(k, {}), **v} if isinstance(v, dict) else v
    return cfg


def test_a_misspelled_section_and_a_nested_key_name_the_closest_valid_name():
    mine = {"trian": {"epochs": 3}}
    cfg = {**DEFAULT, **mine}
    sources = [("my.yaml", mine), ("config.yaml", DEFAULT)]
    assert config_errors.one_line(cfg, SCHEMA, sources) == (
        f"config: unknown key 'trian' in my.yaml (did you mean 'train'?){FULL}")
    mine = {"train": {"epoch": 3}}
    assert config_errors.one_line(_with(**mine), SCHEMA, [("my.yaml", mine), ("config.yaml", DEFAULT)]) == (
        f"config: unknown key 'train.epoch' in my.yaml (did you mean 'train.epochs'?){FULL}")


def test_other_failures_name_the_key_and_the_winning_source():
    cli, mine = {"train": {"epochs": "three"}}, {"train": {"epochs": 2}}
    sources = [("--config", cli), ("my.yaml", mine), ("config.yaml", DEFAULT)]
    assert config_errors.one_line(_with(**cli), SCHEMA, sources) == (
        f"config: train.epochs: 'three' is not of type 'integer' in --config{FULL}")
    nothing_close = {"capture": {"zzz": 1}}
    line = config_errors.one_line(_with(**nothing_close), SCHEMA, [("my.yaml", nothing_close)])
    assert line.startswith("config: unknown key 'capture.zzz' in my.yaml (the keys allowed in capture: mode, online, backend,")
    assert config_errors.one_line(DEFAULT, SCHEMA, [("config.yaml", DEFAULT)]) is None


def test_the_plan_stops_with_one_line_and_the_full_message_on_request(tmp_path):
    bad = tmp_path / "my.yaml"
    bad.write_text("trian:\n  epochs: 3\n")
    p = run(["-n", "--configfile", str(bad)], tmp_path / "wd")
    out = (p.stdout + p.stderr).splitlines()
    assert p.returncode != 0
    assert f"config: unknown key 'trian' in {bad} (did you mean 'train'?){FULL}" in out
    assert len(out) < 10 and not any("ValidationError" in line for line in out)
    os.environ["EAGLE3BUILD_FULL_CONFIG_ERRORS"] = "1"
    try:
        full = run(["-n", "--configfile", str(bad)], tmp_path / "wd")
    finally:
        del os.environ["EAGLE3BUILD_FULL_CONFIG_ERRORS"]
    assert full.returncode != 0
    assert "ValidationError: Additional properties are not allowed ('trian' was unexpected)" in full.stdout + full.stderr
