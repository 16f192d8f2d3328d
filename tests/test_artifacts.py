"""eagle3build/artifacts.py: typed loaders of the JSON artifacts against their schemas, and the
adapters under scripts/ that only unpack `snakemake` and call one library function."""
from __future__ import annotations

import ast
import json

import pytest
from smk import REPO

from eagle3build import artifacts
from eagle3build.artifacts import ArtifactError, Decisions, HeadMeta, TrainMeta, minimal_decisions
from eagle3build.compat import compat_report

TRAIN_META = {"target_fingerprint": "1492001c043ec99e", "aux_layer_ids": [2, 15, 27],
              "vocab_fingerprint": "a0b27a73f4a0450c", "draft_vocab_size": 2048, "head_variant": "eagle3.1",
              "head_flags": {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True,
                             "fc_norm": False},
              "ttt_steps": 3, "world_size": 1}


def test_every_schema_ships_in_the_package():
    names = sorted(p.name for p in artifacts.SCHEMA_DIR.glob("*.schema.json"))
    assert names == ["benchmark.schema.json", "compat.schema.json", "decisions.schema.json",
                     "head_meta.schema.json", "train_meta.schema.json"]
    assert 'schemas/*.schema.json' in (REPO / "pyproject.toml").read_text()  # package-data
    for name in ("decisions", "compat", "train_meta", "head_meta", "benchmark"):
        assert artifacts.schema(name)["$schema"].endswith("2020-12/schema")


def test_decisions_from_a_report_load_typed(tmp_path):
    report = {"target": {"fingerprint": "1492001c043ec99e", "vocab_size": 49152, "num_layers": 30,
                         "hidden_size": 576, "architecture": "LlamaForCausalLM"},
              "capture": {"backend": "hooks", "requested": "auto", "aux_layer_ids": [2, 15, 27],
                          "aux_layer_ids_requested": "auto", "storage_dtype": "bfloat16"},
              "head": {"recommended_variant": "eagle3.1"}}
    compat_report.write_decisions(report, tmp_path / "decisions.json")
    d = Decisions.load(tmp_path / "decisions.json")
    assert (d.target_fingerprint, d.target_vocab_size, d.aux_layer_ids, d.backend, d.head_variant) == (
        "1492001c043ec99e", 49152, [2, 15, 27], "hooks", "eagle3.1")
    assert d["schema"] == "eagle3build.decisions/1"


def test_errors_name_the_file_and_the_field(tmp_path):
    bad = minimal_decisions("fp", [1, 2], 100)
    bad["capture"]["aux_layer_ids"] = [1, "two"]
    (tmp_path / "decisions.json").write_text(json.dumps(bad))
    with pytest.raises(ArtifactError, match=r"decisions\.json: field capture\.aux_layer_ids\[1\]: 'two' is not of type"):
        Decisions.load(tmp_path / "decisions.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ArtifactError, match=r"broken\.json: not JSON"):
        Decisions.load(tmp_path / "broken.json")
    with pytest.raises(ArtifactError, match=r"missing\.json: cannot read"):
        Decisions.load(tmp_path / "missing.json")
    meta = dict(TRAIN_META)
    del meta["head_flags"]
    (tmp_path / "train_meta.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match=r"train_meta\.json: field <top level>: 'head_flags' is a required"):
        TrainMeta.load(tmp_path)


def test_meta_loaders_take_the_folder(tmp_path):
    (tmp_path / "train_meta.json").write_text(json.dumps(TRAIN_META))
    assert TrainMeta.load(tmp_path)["head_variant"] == "eagle3.1"
    head = {**TRAIN_META, "served_name": "org/m", "dtype": "bfloat16", "tensors": {"d2t": [2048]},
            "vllm_load_check": {"skipped": "vllm is not installed"}}
    (tmp_path / "head_meta.json").write_text(json.dumps(head))
    assert HeadMeta.load(tmp_path).path == tmp_path / "head_meta.json"
    head["vllm_load_check"] = {"drafts": 0, "accepted_tokens": 0, "seconds": 1.0}  # no draft: not a pass
    (tmp_path / "head_meta.json").write_text(json.dumps(head))
    with pytest.raises(ArtifactError, match="vllm_load_check"):
        HeadMeta.load(tmp_path)


def _calls(node):
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "scripts").glob("*.py")))
def test_adapter_only_unpacks_and_calls_one_library_function(script):
    """Top level: docstring, imports from eagle3build, assignments that read `snakemake`,
    `setup(snakemake)` and exactly one more call (the library's entry; its arguments may only read
    `snakemake` through attributes, subscripts and list())."""
    tree = ast.parse((REPO / "scripts" / script).read_text())
    entry = []
    for st in tree.body:
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
            continue
        if isinstance(st, ast.ImportFrom):
            assert st.module.startswith("eagle3build"), (script, st.module)
            continue
        if isinstance(st, ast.Assign):
            assert not _calls(st.value), (script, ast.unparse(st))
            continue
        assert isinstance(st, ast.Expr) and isinstance(st.value, ast.Call), (script, ast.unparse(st))
        if ast.unparse(st.value) == "setup(snakemake)":
            continue
        entry.append(st.value)
    assert len(entry) == 1, (script, [ast.unparse(e) for e in entry])
    inner = [ast.unparse(c.func) for c in _calls(entry[0]) if c is not entry[0]]
    assert set(inner) <= {"list"}, (script, inner)
