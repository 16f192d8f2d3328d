"""The records of measured figures (benchmarks/benchlab/records.py, benchmarks/records/) and the docs checked against them
(issue 51): every figure README.md, docs/ and benchmarks/ cite is a link to its record's result, equal to it."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from benchlab import records as R
from smk import REPO

RECS = R.load_records(REPO / "benchmarks/records")


def test_docs_cite_only_recorded_figures():
    """The gate: no figure in README.md, docs/, benchmarks/ or the example configs without its record, none that
    differs from it, and every configuration measured on more than one card or host given as a range."""
    errors = R.check_docs(REPO)
    assert errors == [], "\n".join(errors[:40])


def test_the_readme_cites_the_gpu_range_and_prints_its_command():
    """The README's GPU line: the recipe's speed-up from each card it was measured on, and the one command that
    makes that record."""
    text = (REPO / "README.md").read_text()
    for stem in ("recipe_h100", "recipe_h200"):
        assert f"benchmarks/records/{stem}.json#k3.speedup.all" in text
    assert "python benchmarks/gpu/record.py recipe --seconds" in text


# A number on the README's first screen: digits, with a decimal part, not inside a word (H100, bf16: names)
FIRST_SCREEN_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")


def first_screen_numbers(readme: str) -> list[str]:
    """The numbers of a README's first screen, before its first ``## `` heading: link text counts, link targets do
    not (``[1.27x](benchmarks/records/...)``, ``[1.27x][recipe H100]``; definitions), code does."""
    text = re.split(r"^## ", readme, maxsplit=1, flags=re.M)[0]
    text = re.sub(r"\]\([^)]*\)|\]\[[^\]]*\]", "]", text)
    text = re.sub(r"^ {0,3}\[[^\]]+\]:.*$", "", text, flags=re.M)
    return FIRST_SCREEN_NUMBER.findall(text)


def test_the_readmes_first_screen_quotes_one_figure_a_claim():
    """Issue 73: at most 30 numbers before the first ``##`` (20 now, 30 by this count before: make run's time three
    ways, the GPU speed-up seven); every other figure is in the records table (docs/figures.md), which it links."""
    readme = (REPO / "README.md").read_text()
    assert len(first_screen_numbers(readme)) <= 30, first_screen_numbers(readme)
    assert "(docs/figures.md)" in re.split(r"^## ", readme, maxsplit=1, flags=re.M)[0]
    assert first_screen_numbers("# eagle3build\nIn [9.8][a] to [12.0](x/y_2.json#k) minutes on an H100, bf16 `k = 3`\n\n"
                                "[a]: records/r_1.json#m\n## Two\n4 5") == ["9.8", "12.0", "3"]


def test_check_text_catches_each_kind_of_problem():
    recs = {"a_h200": R.make_record("a", command="c", commit="abc1234", date="2026-12-01", versions={},
                                    hardware={"gpus": ["NVIDIA H200"], "cpu_count": 16},
                                    results={"k3.speedup.all": 1.5525, "k3.lossless": True}),
            "a_h100": R.make_record("a", command="c", commit="abc1234", date="2026-12-05", versions={},
                                    hardware={"gpus": ["NVIDIA H100"], "cpu_count": 16},
                                    results={"k3.speedup.all": 1.27}),
            "b_cpu": R.make_record("b", command="c", commit="abc1234", date="2026-12-01", versions={},
                                   hardware={"gpus": [], "cpu_count": 2}, results={"tau": 1.1979})}
    link = "[{}](benchmarks/records/{}.json#{})"
    ok = (f"{link.format('1.27x', 'a_h100', 'k3.speedup.all')} (H100) to "
          f"{link.format('**1.55x**', 'a_h200', 'k3.speedup.all')} (H200), {link.format('lossless', 'a_h200', 'k3.lossless')};"
          f" τ {link.format('1.198', 'b_cpu', 'tau')} on a CPU; `1.50x in code` is not a figure")
    assert R.check_text(ok, recs, "ok.md") == []
    cases = {
        link.format("1.19", "b_cpu", "tau"): "the record says 1.1979",
        link.format("1.2", "c_cpu", "tau"): "no record benchmarks/records/c_cpu.json",
        link.format("1.2", "b_cpu", "tau.chat"): "has no result tau.chat",
        "decodes 1.61x as fast": "figure '1.61x' without a record",
        "τ 2.78 on chat": "figure 'τ 2.78' without a record",
        "at 620 tokens/s": "without a record",
        link.format("1.55x", "a_h200", "k3.speedup.all") + " (H200)": "give the range (cite a_h100#k3.speedup.all",
        f"{link.format('1.27x', 'a_h100', 'k3.speedup.all')} to {link.format('1.55x', 'a_h200', 'k3.speedup.all')}":
            "a range's end names its card",
    }
    for text, needle in cases.items():
        errors = R.check_text(text, recs, "doc.md")
        assert any(needle in e for e in errors), (text, errors)
        assert all(e.startswith("doc.md:1: ") for e in errors)


def test_check_text_reads_reference_links_as_citations():
    """A figure cited by a CommonMark reference link (``[1.55x][label]`` and a ``[label]: URL`` definition anywhere in
    the document) is checked as an inline one is: its value, its record and key, the range and its cards."""
    recs = {"a_h200": R.make_record("a", command="c", commit="abc1234", date="2026-12-01", versions={},
                                    hardware={"gpus": ["NVIDIA H200"], "cpu_count": 16},
                                    results={"k3.speedup.all": 1.5525, "k3.tau.chat": 2.7758}),
            "a_h100": R.make_record("a", command="c", commit="abc1234", date="2026-12-05", versions={},
                                    hardware={"gpus": ["NVIDIA H100"], "cpu_count": 16},
                                    results={"k3.speedup.all": 1.27})}
    defs = ("\n\n[a H100]: ../benchmarks/records/a_h100.json#k3.speedup.all\n"
            "[a  h200]: <../benchmarks/records/a_h200.json#k3.speedup.all> \"the recipe\"\n"
            "[2.78]: ../benchmarks/records/a_h200.json#k3.tau.chat\n[docs]: ../README.md\n")
    ok = ("| speed-up | [1.27x][A h100] (H100) to [**1.55x**][a H200] (H200) | τ [2.78][] or [2.78] |"
          " [the docs][docs] |" + defs)
    assert R.check_text(ok, recs, "ok.md") == []
    # mixed with an inline link in one paragraph, the definitions before the use
    mixed = (defs.lstrip() + "\nfrom [1.27x](benchmarks/records/a_h100.json#k3.speedup.all) (H100)\nto [1.55x][a h200]"
             " (H200)\n")
    assert R.check_text(mixed, recs, "ok.md") == []
    cases = {
        "decodes [1.61x][a h200] (H200)": "the record says 1.5525",
        "decodes [1.55x][nowhere] (H200)": "[nowhere]: no definition of this reference",
        "τ [2.7][] on chat": "[2.7]: no definition of this reference",
        "decodes [1.55x][a chat] (H200)": "record a_h200 has no result k3.speedup.chat",
        "decodes [1.55x][a h300] (H300)": "no record benchmarks/records/a_h300.json",
        "decodes [1.55x][a h200] (H200)": "give the range (cite a_h100#k3.speedup.all",
        "[1.27x][a h100] to [1.55x][a h200]": "a range's end names its card",
        "decodes 1.61x as fast [see][docs]": "figure '1.61x' without a record",
    }
    more = ("\n\n[a chat]: ../benchmarks/records/a_h200.json#k3.speedup.chat\n"
            "[a h300]: ../benchmarks/records/a_h300.json#k3.speedup.all\n")
    for text, needle in cases.items():
        errors = R.check_text(text + defs + more, recs, "doc.md")
        assert any(needle in e for e in errors), (text, errors)
        assert all(e.startswith("doc.md:1: ") for e in errors), errors
    errors = R.check_text("text\n\n\nsee [1.61x][a h200] (H200)" + defs, recs, "doc.md")
    assert errors and all(e.startswith("doc.md:4: [1.61x][a h200] (a_h200#k3.speedup.all, defined at line 7)")
                          for e in errors), errors
    # CommonMark: a definition cannot interrupt a paragraph; a label defined twice keeps the first
    errors = R.check_text("[1.27x][a h100] (H100)\n[a h100]: ../benchmarks/records/a_h100.json#k3.speedup.all\n",
                          recs, "doc.md")
    assert any(e.startswith("doc.md:2: [a h100]: a definition cannot interrupt a paragraph") for e in errors)
    errors = R.check_text("x\n\n[d]: ../benchmarks/records/a_h100.json#k3.speedup.all\n"
                          "[D]: ../benchmarks/records/a_h200.json#k3.speedup.all\n", recs, "doc.md")
    assert errors == ["doc.md:4: [D] is defined at line 3 already"]


def test_long_lines_counts_characters():
    """The test of the length rule: a 201-character line is reported with its file, line and length, a line of 200
    characters (non-ASCII ones counted as one) is not."""
    assert R.long_lines("τ" * 200 + "\n" + "x" * 200, "a.md") == []
    errors = R.long_lines("short\n" + "τ" * 201 + "\n" + "x" * 200 + "\n", "a.md")
    assert len(errors) == 1 and errors[0].startswith("a.md:2: 201 characters"), errors
    assert R.long_lines("| " + "x" * 199 + " |", "t.md")[0].startswith("t.md:1: 203 characters")


def test_no_doc_line_over_200_characters():
    """README.md, docs/ and benchmarks/ are read by people: no line over 200 characters (code blocks and tables
    included), counted in characters, not newlines."""
    paths = [REPO / "README.md", *sorted(REPO.glob("docs/**/*.md")), *sorted(REPO.glob("benchmarks/**/*.md"))]
    errors = [e for p in paths for e in R.long_lines(p.read_text(), str(p.relative_to(REPO)))]
    assert errors == [], "\n".join(errors)


def test_summarise_benchmark_on_the_recipe_run():
    """A real benchmark.json (the recipe's H200 run, its texts left out): the figures its record quotes."""
    bench = json.loads((REPO / "tests/data/benchmark_recipe_h200.json").read_text())
    out = R.summarise_benchmark(bench)
    assert (out["concurrency"], out["num_prompts"], out["max_tokens"]) == (1, 16, 256)
    assert (out["k3.tau.chat"], out["k3.tau.humaneval"], out["k3.speedup.all"], out["k3.lossless"]) == (
        2.7758, 2.638, 1.5525, True)
    assert out["baseline.tokens_per_s"] == 354.81
    assert not any(k.startswith(("k1.", "schedule.")) for k in out)
    rec = RECS["recipe_h200"]
    assert {k: rec["results"][k] for k in out} == out  # the record is this file's summary (plus training figures)
    assert rec["versions"] == {"vllm": "0.26.0", "torch": "2.11.0", "transformers": "5.17.0", "speculators": "0.9.0"}
    assert rec["hardware"] == {"card": "NVIDIA H200", "gpus": 1, "host_cpus": 16}


def test_summarise_serve_check_quotes_the_server_and_the_load():
    check = {"server": {"start_s": 28.13}, "num_speculative_tokens": 1, "lossless": True,
             "tau": {"served": 1.2158273381294964, "benchmark": 1.2158273381294964},
             "passes": {"streaming": {"output_tokens_per_s": 11.444, "time_to_first_token_s": {"p50": 0.25506}}},
             "stop": {"killed": 0, "processes_left": 0},
             "load": {"16": {"output_tokens_per_s": 950.123, "request_throughput": 4.56789, "tau": 2.41,
                             "time_to_first_token_ms": {"median": 12.345}}}}
    assert R.summarise_serve_check(check) == {
        "serve.start_s": 28.1, "serve.k": 1, "serve.tau": 1.2158, "serve.tau_benchmark": 1.2158, "serve.lossless": True,
        "serve.tokens_per_s": 11.44, "serve.ttft_s": 0.2551, "serve.processes_left": 0,
        "load.c16.tokens_per_s": 950.12, "load.c16.requests_per_s": 4.5679, "load.c16.ttft_ms": 12.3,
        "load.c16.tau": 2.41}


def test_records_are_valid_and_named_by_card():
    assert len(RECS) >= 40
    for stem, rec in RECS.items():
        name, card, *tag = stem.split("_")
        assert (name, card) == (rec["name"], R.card_slug(rec["hardware"]["card"])), stem
        assert R.record_filename(rec, tag[0] if tag else None) == f"{stem}.json"
    bad = dict(RECS["recipe_h200"], date="5 Dec")
    with pytest.raises(R.RecordError, match=r"x\.json: field date: '5 Dec' does not match"):
        R.validate_record(bad, "x.json")
    with pytest.raises(R.RecordError, match="tag 'Host 2'"):
        R.record_filename(RECS["recipe_h200"], "Host 2")


def test_records_cli(tmp_path):
    p = subprocess.run([sys.executable, str(REPO / "benchmarks/check_records.py"), "show", "recipe_h100"], capture_output=True,
                       text=True, cwd=REPO)
    assert p.returncode == 0 and "k3.speedup.all\t1.27" in p.stdout
    (tmp_path / "benchmarks/records").mkdir(parents=True)
    (tmp_path / "README.md").write_text("decodes 1.61x as fast\n")
    p = subprocess.run([sys.executable, str(REPO / "benchmarks/check_records.py"), "check", str(tmp_path)], capture_output=True,
                       text=True, cwd=REPO)
    assert p.returncode == 1 and "README.md:1: figure '1.61x' without a record" in p.stderr


def test_the_tree_holds_records_not_diaries():
    """Issue 51's bounds: no raw-log folder, no diary over 150 lines, one GPU driver, fewer than 450 tracked files,
    benchmarks/ under 1.5 MB."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    bench = [f for f in files if f.startswith("benchmarks/")]
    assert not [f for f in files if "_logs/" in f]
    assert len(files) < 450
    assert sum((REPO / f).stat().st_size for f in bench if (REPO / f).exists()) < 1.5e6
    assert [f for f in bench if f.endswith(".sh")] == []
    long = [f for f in files if f.endswith(".md") and f.startswith(("benchmarks/", "docs/"))
            and len((REPO / f).read_text().splitlines()) > 150]
    assert long == []


def test_flatten_gives_dotted_keys_for_a_preflight_record():
    pre = {"settings": {"concurrencies": [1, 16]}, "table": {"k3": {"tau_break_even": 1.6612345678, "ok": True}},
           "note": None}
    assert R.flatten(pre) == {"settings.concurrencies.0": 1, "settings.concurrencies.1": 16,
                              "table.k3.tau_break_even": 1.661235, "table.k3.ok": True, "note": None}
