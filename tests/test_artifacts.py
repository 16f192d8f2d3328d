"""eagle3build/formats/artifacts.py: typed loaders of the JSON artifacts against their schemas, and the one
adapter, scripts/run_stage.py, that only hands `snakemake`'s parts to one library function."""
from __future__ import annotations

import ast
import json

import pytest
from smk import REPO

from eagle3build.compat import compat_report
from eagle3build.formats import artifacts
from eagle3build.formats.artifacts import ArtifactError, Decisions, HeadMeta, TrainMeta, minimal_decisions
from eagle3build.workflow.contract import CONTRACTS, RULE_ENTRIES

TRAIN_META = {"target_fingerprint": "1492001c043ec99e", "aux_layer_ids": [2, 15, 27],
              "vocab_fingerprint": "a0b27a73f4a0450c", "draft_vocab_size": 2048, "head_variant": "eagle3.1",
              "head_flags": {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True,
                             "fc_norm": False},
              "ttt_steps": 3, "world_size": 1}


def test_every_schema_ships_in_the_package():
    """Each artifact's schema is in eagle3build/schemas/, has a typed loader and is listed in docs/schemas.md."""
    names = sorted(p.name for p in artifacts.SCHEMA_DIR.glob("*.schema.json"))
    assert names == ["benchmark.schema.json", "compat.schema.json", "decisions.schema.json",
                     "head_meta.schema.json", "serve_check.schema.json", "serving.schema.json",
                     "train_meta.schema.json"]
    assert 'schemas/*.schema.json' in (REPO / "pyproject.toml").read_text()  # package-data
    loaders = {c.SCHEMA: c for c in vars(artifacts).values()
               if isinstance(c, type) and issubclass(c, artifacts.Artifact) and c.SCHEMA}
    docs = (REPO / "docs/schemas.md").read_text()
    for name in ("decisions", "compat", "train_meta", "head_meta", "benchmark", "serving", "serve_check"):
        assert artifacts.schema(name)["$schema"].endswith("2020-12/schema")
        assert name in loaders and f"`{name}.json`" in docs, name


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


def test_one_adapter_serves_every_rule():
    """scripts/ holds the one adapter, and it is every rule's ``script:``."""
    import re

    assert sorted(p.name for p in (REPO / "scripts").iterdir() if p.suffix == ".py") == ["run_stage.py"]
    scripts = {}
    for smk in sorted((REPO / "rules").glob("*.smk")):
        text = smk.read_text()
        for rule, script in re.findall(r"^rule (\w+):.*?^    script:\n        \"([^\"]+)\"", text, re.M | re.S):
            scripts[rule] = script
    assert set(scripts) == set(CONTRACTS) | set(RULE_ENTRIES), scripts
    assert set(scripts.values()) == {"../scripts/run_stage.py"}


def test_the_adapter_only_unpacks_and_calls_one_library_function():
    """Top level: docstring, imports from eagle3build and exactly one call, the library's ``main(snakemake)``
    (eagle3build.workflow.job: ``setup``, then ``run_stage`` with the parts of ``snakemake``)."""
    tree = ast.parse((REPO / "scripts/run_stage.py").read_text())
    calls = []
    for st in tree.body:
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
            continue
        if isinstance(st, ast.ImportFrom):
            assert st.module.startswith("eagle3build"), st.module
            continue
        assert isinstance(st, ast.Expr) and isinstance(st.value, ast.Call), ast.unparse(st)
        calls.append(ast.unparse(st.value))
    assert calls == ["main(snakemake)"]


def test_a_failed_job_ends_its_log_with_one_line_naming_its_error(tmp_path, monkeypatch):
    """job.main (the adapter's one call): the entry gets its settings object, made from the parts of ``snakemake``;
    where it raises, the traceback is logged and then the error as one line, the log's last (the rule, the type, the
    message on one line: what the build's end prints for it, workflow/summary.py), and the job exits 1."""
    import logging
    import sys
    import types

    from eagle3build.workflow import job, summary

    seen = {}

    def entry(s):
        seen.update(benchmark_json=s.benchmark_json, out_png=s.out_png)
        raise ValueError("target has 6 decoder layers;\n  default aux ids need 7 (set capture.aux_layer_ids)")

    log = tmp_path / "job.log"

    def setup(smk):  # job.setup points logging and stderr at the job's log
        lg = logging.getLogger("test-job")
        monkeypatch.setattr(lg, "handlers", [logging.FileHandler(log)])  # put back after the test
        monkeypatch.setattr(sys, "stderr", open(log, "a"))
        return lg

    monkeypatch.setattr(job, "entry_function", lambda rule: entry)
    monkeypatch.setattr(job, "setup", setup)
    smk = types.SimpleNamespace(rule="plot_benchmark", input={"benchmark": "b.json"}, output={"png": "b.png"},
                                wildcards={}, params={"settings": {}, "version": 1}, resources={}, log=[str(log)])
    with pytest.raises(SystemExit) as e:
        job.main(smk)
    sys.stderr.close()
    logging.getLogger("test-job").handlers[0].close()
    assert e.value.code == 1 and seen == {"benchmark_json": "b.json", "out_png": "b.png"}
    text = log.read_text()
    assert "Traceback (most recent call last)" in text
    want = ("plot_benchmark failed: ValueError: target has 6 decoder layers; default aux ids need 7 "
            "(set capture.aux_layer_ids)")
    assert text.splitlines()[-1] == want and summary.error_line(log) == want


def test_run_stage_calls_the_entry_with_its_settings_object(tmp_path):
    """Without Snakemake: mappings in (or a Snakemake ``Namedlist``'s shape), the entry called with one settings object
    (here plot_benchmark's ``PlotSettings``: its ``inputs`` and ``outputs``), the settings taken out of the params."""
    from eagle3build.serve.plot_benchmark import PlotSettings
    from eagle3build.workflow import job

    calls = []

    class Named(list):  # a Snakemake Namedlist's shape: a list with named items
        def __init__(self, items):
            super().__init__(v for _, v in items)
            self._items = items

        def items(self):
            return iter(self._items)

    orig = job.entry_function
    job.entry_function = lambda rule: lambda s: calls.append(s) or "done"
    try:
        out = job.run_stage("plot_benchmark", inputs=Named([("benchmark", "r/benchmark.json"),
                                                            ("target", Named([("a", "t/a"), ("b", "t/b")]))]),
                            outputs={"png": tmp_path / "b.png"}, params={"settings": {}, "version": 1})
        assert out == "done"
        assert calls == [PlotSettings(benchmark_json="r/benchmark.json", out_png=str(tmp_path / "b.png"))]
    finally:
        job.entry_function = orig
    assert job.entry_function("compat_markdown").__name__ == "markdown_job"
    assert job.entry_function("benchmark").__module__ == "eagle3build.serve.benchmark"
    with pytest.raises(KeyError, match="rule 'all' has no entry"):
        job.entry_function("all")
