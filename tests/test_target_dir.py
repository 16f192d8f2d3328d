"""Issue 38.4: a target folder that is no model folder (a Hugging Face cache's ``models--org--name``,
an unfinished download) is refused at planning, naming the folder and what is missing."""
from __future__ import annotations

import json
import os

from smk import REPO, run, write_config

from eagle3build.formats.target_files import target_dir_problem, target_weights_problem


def hf_cache_model(root):
    """``models--org--name`` as huggingface_hub lays it out: blobs, refs/main, snapshots/<hash> of links."""
    m = root / "models--org--name"
    (m / "blobs").mkdir(parents=True)
    (m / "refs").mkdir()
    (m / "refs/main").write_text("abc123")
    snap = m / "snapshots/abc123"
    snap.mkdir(parents=True)
    for name, body in (("config.json", "{}"), ("model.safetensors", "x")):
        (m / "blobs" / name).write_text(body)
        os.symlink(m / "blobs" / name, snap / name)
    return m, snap


def test_cache_folder_points_to_its_snapshot(tmp_path):
    m, snap = hf_cache_model(tmp_path)
    problem = target_dir_problem(m)
    assert str(m) in problem and "no config.json" in problem and str(snap) in problem
    assert target_dir_problem(snap) is None
    assert "cache root" in target_dir_problem(tmp_path) and "models--org--name" in target_dir_problem(tmp_path)


def test_unfinished_download_names_the_missing_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model-00001-of-00002.safetensors").write_text("x")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    problem = target_dir_problem(tmp_path)
    assert "unfinished download" in problem and "model-00002-of-00002.safetensors" in problem
    (tmp_path / "model-00002-of-00002.safetensors").write_text("x")
    assert target_dir_problem(tmp_path) is None
    os.symlink(tmp_path / "gone", tmp_path / "tokenizer.json")  # a snapshot link whose blob is gone
    assert "tokenizer.json" in target_dir_problem(tmp_path)


def test_shape_only_and_missing_folders_still_plan():
    assert target_dir_problem(REPO / "examples/targets/llama-3.1-8b-instruct-shape") is None
    assert target_dir_problem(REPO / "no/such/folder") is None  # Snakemake names its missing config.json


def test_plan_refuses_a_cache_folder(tmp_path):
    m, snap = hf_cache_model(tmp_path / "hub")
    cfg = write_config(tmp_path / "c.yaml", target={"path": str(m)})
    p = run(["-n", "--configfile", str(cfg)], tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "IndexError" not in out
    assert f"set target.path to {snap}" in out


def test_cache_folder_names_a_snapshot_with_weights(tmp_path):
    """refs/main names a snapshot still downloading (config.json, no weights): the complete older one is named; a
    cache folder whose every snapshot lacks weights is an unfinished download, with the command that resumes it."""
    m, old = hf_cache_model(tmp_path)
    new = m / "snapshots/def456"
    new.mkdir()
    os.symlink(m / "blobs/config.json", new / "config.json")
    (m / "refs/main").write_text("def456")
    problem = target_dir_problem(m)
    assert problem.endswith(f"set target.path to {old}")
    (old / "model.safetensors").unlink()
    problem = target_dir_problem(m)
    assert "download is unfinished" in problem and f"its snapshot {new} has no weight files" in problem
    assert "hf download org/name resumes" in problem
    (m / "blobs/model.safetensors.incomplete").write_text("x")
    assert "1 file(s) still downloading in blobs/" in target_dir_problem(m)


def test_weights_problem_names_a_folder_without_weight_files(tmp_path):
    m, snap = hf_cache_model(tmp_path)
    assert target_weights_problem(snap) is None and target_weights_problem(m) is None  # m: target_dir_problem's
    (snap / "model.safetensors").unlink()
    (snap / "tokenizer.json").write_text("{}")  # the config and tokenizer came first, the weights are not there yet
    problem = target_weights_problem(snap)
    assert problem.startswith(f"target.path {snap} holds config.json but no weight files (*.safetensors, *.bin")
    assert "hf download org/name resumes" in problem
    (snap / "pytorch_model.bin").write_text("x")
    assert target_weights_problem(snap) is None


def test_plan_warns_and_build_refuses_a_folder_without_weights(tmp_path):
    """A folder with config.json and no weights (an unfinished download; the examples' config-only targets) plans,
    with a warning; a build stops before its first job, naming the folder and the jobs that read the weights."""
    shape = REPO / "examples/targets/llama-3.1-8b-instruct-shape"
    cfg = write_config(tmp_path / "c.yaml", target={"path": str(shape)})
    plan = run(["-n", "--configfile", str(cfg)], tmp_path / "wd")
    assert plan.returncode == 0, plan.stderr
    assert f"target.path {shape} holds config.json but no weight files" in plan.stdout + plan.stderr
    build = run(["--configfile", str(cfg)], tmp_path / "wd")
    out = build.stdout + build.stderr
    assert build.returncode != 0
    assert (f"target.path {shape} holds config.json but no weight files" in out
            and "the planned jobs of benchmark, capture_hidden_states, export_head, train_draft read them" in out)
    assert not (tmp_path / "wd/logs").exists() and not (tmp_path / "wd/results").exists()  # no job started
    assert not list((tmp_path / "wd/.snakemake/incomplete").glob("*")) and not (tmp_path / "wd/.snakemake/locks").exists()
