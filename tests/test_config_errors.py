"""A config that fails the schema stops planning with a line per problem, every problem at once: the key, the file
that sets it and the closest valid name (eagle3build.config.errors); Snakemake's full message only where
EAGLE3BUILD_FULL_CONFIG_ERRORS=1."""
from __future__ import annotations

import os

import yaml
from smk import REPO, run

from eagle3build.config import errors

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
    assert errors.short_message(cfg, SCHEMA, sources) == (
        f"config: unknown key 'trian' in my.yaml (did you mean 'train'?){FULL}")
    mine = {"train": {"epoch": 3}}
    assert errors.short_message(_with(**mine), SCHEMA, [("my.yaml", mine), ("config.yaml", DEFAULT)]) == (
        f"config: unknown key 'train.epoch' in my.yaml (did you mean 'train.epochs'?){FULL}")


def test_other_failures_name_the_key_and_the_winning_source():
    cli, mine = {"train": {"epochs": "three"}}, {"train": {"epochs": 2}}
    sources = [("--config", cli), ("my.yaml", mine), ("config.yaml", DEFAULT)]
    assert errors.short_message(_with(**cli), SCHEMA, sources) == (
        f"config: train.epochs: 'three' is not of type 'integer' in --config{FULL}")
    nothing_close = {"capture": {"zzz": 1}}
    line = errors.short_message(_with(**nothing_close), SCHEMA, [("my.yaml", nothing_close)])
    assert line.startswith("config: unknown key 'capture.zzz' in my.yaml (the keys allowed in capture: mode, online, backend,")
    assert errors.short_message(DEFAULT, SCHEMA, [("config.yaml", DEFAULT)]) is None


def test_every_problem_is_named_at_once():
    """A misspelled section and a misspelled key of another section: both named, each with its file and the closest
    valid name, in one message (not the first only); a wrong type beside them too."""
    mine = {"trian": {"epochs": 3}, "benchmark": {"num_prompt": 4}}
    cli = {"train": {"lr": "fast"}}
    cfg = {**_with(benchmark={"num_prompt": 4}, train={"lr": "fast"}), "trian": {"epochs": 3}}
    sources = [("--config", cli), ("my.yaml", mine), ("config.yaml", DEFAULT)]
    assert errors.problems(cfg, SCHEMA, sources) == [
        "unknown key 'trian' in my.yaml (did you mean 'train'?)",
        "train.lr: 'fast' is not of type 'number' in --config",
        "unknown key 'benchmark.num_prompt' in my.yaml (did you mean 'benchmark.num_prompts'?)",
    ]
    assert errors.short_message(cfg, SCHEMA, sources) == "\n".join([
        f"config: 3 problems{FULL}",
        "config: unknown key 'trian' in my.yaml (did you mean 'train'?)",
        "config: train.lr: 'fast' is not of type 'number' in --config",
        "config: unknown key 'benchmark.num_prompt' in my.yaml (did you mean 'benchmark.num_prompts'?)",
    ])


def test_a_problem_inside_a_list_names_the_file_that_set_the_list():
    """data.sources[0].max_sample (a list item's key misspelled) and a missing key of another item: the file that
    set data.sources is named (a config merged over another replaces its lists whole)."""
    mine = {"data": {"sources": [{"path": "a.jsonl", "max_sample": 5}, {"path": "b.jsonl", "max_samples": 0}]}}
    cfg = _with(data={"sources": mine["data"]["sources"]})
    sources = [("my.yaml", mine), ("config.yaml", DEFAULT)]
    assert errors.problems(cfg, SCHEMA, sources) == [
        "unknown key 'data.sources[0].max_sample' in my.yaml (did you mean 'data.sources[0].max_samples'?)",
        "data.sources[0]: 'max_samples' is a required property in my.yaml",
        "data.sources[1].max_samples: 0 is less than the minimum of 1 in my.yaml",
    ]
    assert errors.source_of(["data", "sources", 1, "path"], sources) == "my.yaml"
    assert errors.source_of(["data", "sources", 0, "path"], [("config.yaml", DEFAULT)]) == "config.yaml"
    assert errors.source_of(["data", "sources", 0], [("x.yaml", {"train": {}})]) is None


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


def test_the_plan_names_both_misspelled_keys(tmp_path):
    """``trian:`` at the top and ``benchmark.num_prompt``: a real ``snakemake -n`` stops naming both, each with its
    file and the closest valid name (Snakemake's validate reports the first only)."""
    bad = tmp_path / "my.yaml"
    bad.write_text("trian:\n  epochs: 3\nbenchmark:\n  num_prompt: 4\n")
    p = run(["-n", "--configfile", str(bad)], tmp_path / "wd")
    out = (p.stdout + p.stderr).splitlines()
    assert p.returncode != 0
    at = out.index(f"config: 2 problems{FULL}")
    assert out[at + 1:at + 3] == [
        f"config: unknown key 'trian' in {bad} (did you mean 'train'?)",
        f"config: unknown key 'benchmark.num_prompt' in {bad} (did you mean 'benchmark.num_prompts'?)",
    ]
    assert len(out) < 12 and not any("ValidationError" in line for line in out)
