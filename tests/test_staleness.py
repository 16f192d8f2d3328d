"""What replans a stage besides its settings: output versions, library versions, `auto` values,
the target's files and fingerprint (eagle3build.workflow.staleness, eagle3build.target)."""
from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import pytest
from smk import REPO, planned_jobs, run

from eagle3build.target import content_files, fingerprint
from eagle3build.workflow import contract, missing, staleness

STAGES = ["materialize_target", "compat_report", "preflight_bound", "regenerate_responses", "prepare_data",
          "capture_hidden_states", "build_vocab_map", "train_draft", "export_head", "benchmark", "plot_benchmark",
          "serve_config", "serve_check"]


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_has_an_output_version(stage):
    import importlib

    v = contract.output_version(stage)
    assert isinstance(v, int) and v >= 1
    module = importlib.import_module(f"eagle3build.{contract.STAGE_GROUPS[stage]}.{stage}")
    assert module.OUTPUT_VERSION == v  # the text read = the constant
    assert set(contract.STAGE_PACKAGES) == set(STAGES)


def test_package_versions_and_switch():
    import torch

    got = staleness.package_versions(("torch", "transformers", "no-such-package-xyz"))
    assert list(got) == ["no-such-package-xyz", "torch", "transformers"]
    assert got["torch"] == torch.__version__ and got["no-such-package-xyz"] is None
    assert staleness.package_versions(("torch",), track=False) == {}
    assert contract.stage_version("capture_hidden_states") == {
        "output": 1, "packages": {"torch": torch.__version__, "transformers": got["transformers"]}}


DECIDED_AUTO = {"capture": {"aux_layer_ids": [2, 15, 27], "aux_layer_ids_requested": "auto",
                            "backend": "hooks", "backend_requested": "auto"}}
DECIDED_PINNED = {"capture": {"aux_layer_ids": [2, 15, 27], "aux_layer_ids_requested": [2, 15, 27],
                              "backend": "hooks", "backend_requested": "hooks"}}


@pytest.mark.parametrize("requested, decisions, key, expected", [
    ("auto", None, "aux_layer_ids", "auto"),
    ([2, 15, 27], None, "aux_layer_ids", [2, 15, 27]),          # first build, pinned from the start
    ([2, 15, 27], DECIDED_AUTO, "aux_layer_ids", "auto"),        # what auto chose, written down: no change
    ([3, 15, 27], DECIDED_AUTO, "aux_layer_ids", [3, 15, 27]),   # a real change
    ([2, 15, 27], DECIDED_PINNED, "aux_layer_ids", [2, 15, 27]),  # pinned build stays pinned
    ("hooks", DECIDED_AUTO, "backend", "auto"),
    ("vllm", DECIDED_AUTO, "backend", "vllm"),
    ("hooks", DECIDED_PINNED, "backend", "hooks"),
])
def test_canonical_request(requested, decisions, key, expected):
    assert staleness.canonical_request(requested, decisions, key) == expected


def _safetensors(path, payload: bytes):
    hdr = json.dumps({"w": {"dtype": "U8", "shape": [len(payload)], "data_offsets": [0, len(payload)]}}).encode()
    hdr += b" " * (-(8 + len(hdr)) % 8)
    path.write_bytes(struct.pack("<Q", len(hdr)) + hdr + payload)


def test_content_files_ignore_unrelated_files(tmp_path):
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 2}')
    for f in ("tokenizer.json", "chat_template.jinja", "model-00001-of-00002.safetensors",
              "model.safetensors.index.json", "modeling_x.py", "NOTES.md", "README.md"):
        (tmp_path / f).write_text("x")
    (tmp_path / ".git").mkdir()
    assert [p.rsplit("/", 1)[1] for p in content_files(tmp_path)] == [
        "chat_template.jinja", "config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
        "modeling_x.py", "tokenizer.json"]
    assert content_files(tmp_path / "missing") == [str(tmp_path / "missing/config.json")]


def test_fingerprint_sees_every_byte_not_unrelated_files_or_times(tmp_path):
    """Same header and size, one other byte anywhere in the weights: another fingerprint (a new user
    found that the earlier sampled fingerprint missed an edit between its blocks). A NOTES.md, other
    file times, or one worker instead of several: the same. File names and the tokenizer count."""
    import os

    (tmp_path / "config.json").write_text('{"num_hidden_layers": 2}')
    payload = bytearray(3 * 1024 * 1024 + 5)  # more than one 256 KiB read chunk
    _safetensors(tmp_path / "model-00001-of-00002.safetensors", bytes(payload))
    _safetensors(tmp_path / "model-00002-of-00002.safetensors", bytes(payload[:1000]))
    fp = fingerprint(tmp_path)
    assert len(fp) == 16 and fingerprint(tmp_path, workers=1) == fp
    (tmp_path / "NOTES.md").write_text("notes")
    os.utime(tmp_path / "model-00001-of-00002.safetensors", (1, 1))
    assert fingerprint(tmp_path) == fp
    seen = set()
    for pos in (0, 256 * 1024 + 7, len(payload) // 2, len(payload) - 1):
        payload[pos] ^= 1
        _safetensors(tmp_path / "model-00001-of-00002.safetensors", bytes(payload))
        seen.add(fingerprint(tmp_path))
        payload[pos] ^= 1
    assert len(seen) == 4 and fp not in seen
    _safetensors(tmp_path / "model-00001-of-00002.safetensors", bytes(payload))
    assert fingerprint(tmp_path) == fp
    # the same bytes under another shard name: names count
    (tmp_path / "model-00001-of-00002.safetensors").rename(tmp_path / "model-00001-of-00003.safetensors")
    assert fingerprint(tmp_path) != fp
    (tmp_path / "model-00001-of-00003.safetensors").rename(tmp_path / "model-00001-of-00002.safetensors")
    assert fingerprint(tmp_path) == fp
    (tmp_path / "tokenizer.json").write_text("{}")  # the tokenizer decides token ids: it counts
    assert fingerprint(tmp_path) != fp


def test_env_digest_covers_the_lock_files_the_environment_names(tmp_path):
    (tmp_path / "envs").mkdir()
    env = tmp_path / "envs/e.yaml"
    env.write_text("dependencies:\n  - pip:\n      - -r ../req.txt\n      - -c ../con.txt\n      - -e ..\n")
    (tmp_path / "req.txt").write_text("torch\n")
    (tmp_path / "con.txt").write_text("torch==2.13.0\n")
    first = staleness.env_digest(env)
    assert staleness.env_digest(env) == first and len(first) == 64
    (tmp_path / "con.txt").write_text("torch==2.14.0\n")  # an upgrade in the lock, the environment file unchanged
    second = staleness.env_digest(env)
    assert second != first
    env.write_text(env.read_text() + "  - python=3.11\n")
    assert staleness.env_digest(env) not in (first, second)
    (tmp_path / "req.txt").unlink()
    with pytest.raises(FileNotFoundError):
        staleness.env_digest(env)


def test_a_job_environment_stands_for_the_planners_packages():
    env = {"conda": "abc"}
    v = contract.output_version("capture_hidden_states")
    assert contract.stage_version("capture_hidden_states", True, env) == {"output": v, "packages": {"environment": env}}
    assert contract.stage_version("capture_hidden_states", False, env) == {"output": v, "packages": {}}
    assert contract.stage_version("compat_report", True, env)["packages"] == {}  # no packages shape its output


def test_every_rule_runs_in_the_conda_environment_whose_pins_key_the_versions():
    """rules/common.smk digests envs/eagle3build.yaml (CONDA_ENV) for the `version` params under --sdm conda."""
    import re
    from pathlib import Path

    rules = Path(__file__).resolve().parents[1] / "rules"
    named = {f.name: re.findall(r"conda:\n\s+(.+)\n", f.read_text()) for f in rules.glob("*.smk") if f.name != "common.smk"}
    assert named and all(envs and set(envs) == {'"../envs/eagle3build.yaml"'} for envs in named.values()), named
    assert 'CONDA_ENV = f"{workflow.basedir}/envs/eagle3build.yaml"' in (rules / "common.smk").read_text()


@pytest.mark.parametrize("sdm", [[], ["--sdm", "conda"]])
def test_version_params_carry_the_job_environment_under_sdm_conda(tmp_path, sdm):
    """The rules' parsed `version` params: the planner's installed versions, or under `--sdm conda` the
    digest of the environment the jobs run in (the rules are parsed, no environment is made)."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    for part in ("Snakefile", "config.yaml", "rules", "scripts", "schemas", "envs", "profiles", "eagle3build",
                 "report", "requirements.txt", "constraints.txt"):
        (shutil.copytree if (repo / part).is_dir() else shutil.copy2)(repo / part, tmp_path / part)
    with open(tmp_path / "Snakefile", "a") as f:  # write each rule's version param once parsed
        f.write('\nimport json as _j\nopen("versions.json", "w").write(_j.dumps('
                '{r.name: r.params["version"] for r in workflow.rules if "version" in r.params.keys() '
                'and not callable(r.params["version"])}))\n')  # (draft.compare_methods\' rules: by wildcard)
    p = subprocess.run([str(Path(sys.executable).with_name("snakemake")), "-l", *sdm], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert p.returncode == 0, p.stderr[-3000:]
    versions = json.loads((tmp_path / "versions.json").read_text())
    env = {"conda": staleness.env_digest(repo / "envs/eagle3build.yaml")}
    expected = env if sdm else staleness.package_versions(contract.STAGE_PACKAGES["train_draft"])
    assert versions["train_draft"]["packages"] == ({"environment": expected} if sdm else expected)
    assert versions["compat_report"]["packages"] == {}


def _touch(*paths):
    for p in paths:
        Path(p).parent.mkdir(parents=True, exist_ok=True)
        Path(p).touch()


def test_a_missing_intermediate_is_named_with_its_reader_rebuild_and_followers(tmp_path, monkeypatch):
    """A built run's shard gone while the checkpoint made from it is present: one entry naming the file, its producer
    and reader, the command that rebuilds it and the rules replanned after; nothing for a fresh run or a target."""
    monkeypatch.chdir(tmp_path)
    shards = [f"h/shard-{i:05d}.st" for i in range(5)]
    steps = [missing.Step("train_draft", (*shards, "d.json"), ("ckpt/config.json", "ckpt/model.st")),
             missing.Step("export_head", ("ckpt/model.st",), ("head/config.json", "head/model.st")),
             missing.Step("benchmark", ("head/model.st",), ("bench.json",)),
             missing.Step("plot", ("bench.json",), ("bench.png",))]
    producers = {**dict.fromkeys(shards, "capture"), "d.json": "compat_report", "ckpt/model.st": "train_draft",
                 "head/model.st": "export_head", "bench.json": "benchmark"}
    assert missing.missing_intermediates(steps, producers.get) == []  # nothing built: nothing to say
    _touch(*shards, "d.json", "ckpt/config.json", "ckpt/model.st", "head/config.json", "head/model.st", "bench.json",
           "bench.png")
    assert missing.missing_intermediates(steps, producers.get) == []
    Path(shards[1]).unlink()
    (m,) = missing.missing_intermediates(steps, producers.get)
    assert m == missing.MissingIntermediate("capture", ("h/shard-00001.st",), ("train_draft",), "ckpt/config.json",
                                              ("train_draft", "export_head", "benchmark", "plot"))
    assert missing.missing_intermediate_message(m) == (
        "h/shard-00001.st is missing while ckpt/config.json, made from it by train_draft, is present: Snakemake "
        "rebuilds a missing file only for a job planned to read it, so unless this plan runs train_draft it stays "
        "missing (docs/staleness.md). Rebuild with `snakemake h/shard-00001.st <your options>`; the next run then "
        "replans train_draft, export_head, benchmark, plot (the rebuilt file is newer than what they made)")
    assert missing.missing_intermediates(steps, producers.get, frozenset({"h/shard-00001.st"})) == []  # a target
    for s in shards:
        Path(s).unlink(missing_ok=True)
    Path("head/model.st").unlink()
    many, head = missing.missing_intermediates(steps, producers.get)
    assert (many.producer, len(many.files), head.files, head.readers, head.follows) == (
        "capture", 5, ("head/model.st",), ("benchmark",), ("benchmark", "plot"))
    assert missing.missing_intermediate_message(many).startswith(
        "5 files of rule capture (h/shard-00000.st, h/shard-00001.st, h/shard-00002.st, ...) are missing while "
        "ckpt/config.json, made from them by train_draft, is present")
    assert "Rebuild with `snakemake <your options> --forcerun capture --until capture (every capture job)`" in (
        missing.missing_intermediate_message(many))


def _fake_finished_run(wd: Path, config: Path) -> None:
    """Every output of the plan of ``config`` in ``wd``, as empty files of one time: what a finished run looks like to
    Snakemake's plan (no input newer than an output; no metadata, so no params compared)."""
    p = run(["-n", "--configfile", str(config)], wd)
    assert p.returncode == 0, p.stderr[-2000:]
    outputs = [f for m in re.finditer(r"^    output: (.*)$", p.stdout, re.M) for f in m.group(1).split(", ")]
    assert len(outputs) > 20
    for f in outputs:
        _touch(wd / f)
        os.utime(wd / f, (1e9, 1e9))


def test_the_plan_names_a_deleted_intermediate(tmp_path):
    """A finished run with one shard deleted: Snakemake plans nothing (its reader, train_draft, is up to date), and
    the plan says which file is gone, the command that rebuilds it and what the next run replans."""
    wd = tmp_path / "wd"
    wd.mkdir()
    config = REPO / "tests/reduced.yaml"
    _fake_finished_run(wd, config)
    clean = run(["-n", "--configfile", str(config)], wd)
    assert "Nothing to be done" in clean.stdout + clean.stderr and "is missing while" not in clean.stdout + clean.stderr
    shard = "results/reduced/hidden_states/train/shard-00001.safetensors"
    (wd / shard).unlink()
    p = run(["-n", "--configfile", str(config)], wd)
    out = (p.stdout + p.stderr).splitlines()
    assert p.returncode == 0 and "Nothing to be done (all requested files are present and up to date)." in out
    assert (f"{shard} is missing while results/reduced/checkpoint/config.json, made from it by train_draft, is "
            "present: Snakemake rebuilds a missing file only for a job planned to read it, so unless this plan runs "
            "train_draft it stays missing (docs/staleness.md). Rebuild with `snakemake "
            f"{shard} <your options>`; the next run then replans train_draft, export_head, benchmark, serve_config, "
            "plot_benchmark, serve_check (the rebuilt file is newer than what they made)") in out
    assert planned_jobs([shard, "--configfile", str(config)], wd) == {"capture_hidden_states": 1}  # the command
