"""docs/card-time.md's one-call carry (issue 70): benchmarks/gpu/train-carry.txt lists what
benchmarks/train_throughput.py needs on a lent card beyond its image, and train_carry.py's ``check`` runs the
benchmark with nothing else importable, so a package or path missing from the list fails here, on the CPU."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile

import pytest
from smk import REPO

sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
import train_carry  # noqa: E402

CARRY = REPO / "benchmarks/gpu/train-carry.txt"
TINY = ["--device", "cpu", "--hidden", "64", "--vocab", "1000", "--draft-vocab", "100", "--distinct", "50",
        "--samples", "4", "--eval-samples", "2", "--seq", "64", "--total-seq-len", "128", "--epochs", "1"]


def _tree(tmp_path, carry_text: str | None = None):
    """A working tree of only the carry's paths, the carry script and its list (``carry_text`` in its place)."""
    carry = train_carry.read_carry(CARRY)
    for p in [*carry["paths"], "benchmarks/gpu/train_carry.py"]:
        src, dst = REPO / p, tmp_path / p
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    (tmp_path / "benchmarks/gpu/train-carry.txt").write_text(carry_text or CARRY.read_text())
    return tmp_path


def _check(tree, *args, timeout=900):
    return subprocess.run([sys.executable, "benchmarks/gpu/train_carry.py", "check", "--", *args], cwd=tree,
                          capture_output=True, text=True, timeout=timeout)


def test_the_carry_file_reads_and_pins_every_wheel():
    carry = train_carry.read_carry(CARRY)
    assert "eagle3build/" in carry["paths"] and "examples/targets/llama-3.1-8b-instruct-shape/config.json" in carry[
        "paths"]
    assert all((REPO / p).exists() for p in carry["paths"])
    names = [w.split("==")[0] for w in carry["wheels"]]
    assert "speculators" in names and len(names) == len(set(names))
    # each pin is the version this CPU checks with (the one installed here)
    import importlib.metadata as md

    assert {w for w in carry["wheels"] if md.version(w.split("==")[0]) != w.split("==")[1]} == set()


def test_a_bad_line_is_named(tmp_path):
    (tmp_path / "c.txt").write_text("# fine\npath: eagle3build/\nspeculators>=0.9\n")
    with pytest.raises(ValueError, match=r"c.txt:3: 'speculators>=0.9' is not 'path: P', 'image: NAME' or "):
        train_carry.read_carry(tmp_path / "c.txt")


def test_the_docs_read_the_list_from_the_file():
    text = (REPO / "docs/card-time.md").read_text()
    assert "benchmarks/gpu/train-carry.txt" in text and "train_carry.py unpack .whl-train" in text
    assert "hs-connectors 0.9.0" not in text  # the list lives in the file, not in the page


def test_unpack_unzips_every_wheel(tmp_path):
    (tmp_path / "w").mkdir()
    for name, mod in (("a-1.0-py3-none-any.whl", "a.py"), ("b-2.0-py3-none-any.whl", "b/__init__.py")):
        with zipfile.ZipFile(tmp_path / "w" / name, "w") as z:
            z.writestr(mod, "X = 1\n")
    assert train_carry.unpack(str(tmp_path / "w"), str(tmp_path / "site")) == ["a-1.0-py3-none-any.whl",
                                                                              "b-2.0-py3-none-any.whl"]
    assert (tmp_path / "site/a.py").is_file() and (tmp_path / "site/b/__init__.py").is_file()


def test_a_package_left_out_of_the_carry_is_missing_in_the_check(tmp_path):
    """Without loguru's line, speculators' loader (the model loads the verifier's weights with it) cannot be imported
    in the check, as on the card, and an installed package neither in the image nor carried (snakemake) is missing;
    with the list as it is, the loader imports."""
    (tmp_path / "probe.py").write_text("import sys\ntry:\n    import snakemake\nexcept ImportError:\n    print('no "
                                       "snakemake')\nimport speculators.utils.loading\nprint('speculators', sys.flags.no_site)\n")
    tree = _tree(tmp_path / "ok")
    shutil.copy(tmp_path / "probe.py", tree)
    p = _check(tree, "probe.py")
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.splitlines()[-2:] == ["no snakemake", "speculators 1"]
    without = "".join(line for line in CARRY.read_text().splitlines(keepends=True) if not line.startswith("loguru=="))
    tree = _tree(tmp_path / "bad", without)
    shutil.copy(tmp_path / "probe.py", tree)
    p = _check(tree, "probe.py")
    assert p.returncode != 0 and "No module named 'loguru'" in p.stderr


@pytest.mark.slow
def test_train_throughput_runs_with_only_the_carry(tmp_path):
    """The benchmark's tiny smoke (a training run and the step A/B's eager path) in a tree of only the listed paths,
    with only the image and the listed wheels importable."""
    tree = _tree(tmp_path / "tree")
    p = _check(tree, "benchmarks/train_throughput.py", *TINY, "--step-ab", "--step-paths", "eager", "--step-warmup",
               "1", "--steps", "1", "--profile-steps", "1", "--json", str(tmp_path / "t.json"), "--out",
               str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads((tmp_path / "t.json").read_text())
    assert r["ours"]["tokens_per_s"] > 0 and 1.0 <= r["ours"]["simulated_acceptance_length"] <= 4.0
    assert r["step_ab"]["eager"]["kernel_ops"] > 100 and r["step_ab"]["eager"]["graph_breaks"] is None
    # a path left out of the list is missing there too
    shutil.rmtree(tree / "examples")
    p = _check(tree, "benchmarks/train_throughput.py", *TINY, "--skip-ours", "--out", str(tmp_path / "o2"))
    assert p.returncode != 0 and "llama-3.1-8b-instruct-shape/config.json" in p.stderr
