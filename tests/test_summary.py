"""The screen a build ends with (workflow/summary.py, issue 67): the result from the run's files, and what failed."""
from __future__ import annotations

import json
import logging

from eagle3build.workflow import summary


def _run(head, method, tau, speedup, sets, lossless=True, k=3):
    return {"head": head, "method": method, "draft_layer": "llama", "trained_positions": None,
            "num_speculative_tokens": k, "mean_acceptance_length": tau, "speedup": speedup, "lossless": lossless,
            "sets": sets}


def test_the_result_screen_reads_the_runs_files(tmp_path):
    res = tmp_path / "results/r"
    (res / "serve").mkdir(parents=True)
    bench = {"settings": {"concurrency": 1, "num_prompts": 16}, "baseline": {"output_tokens_per_s": 594.69},
             "heads": [{"name": "head", "method": "eagle3", "draft_layer": "llama"}],
             "runs": [_run("head", "eagle3", 2.6945, 1.4364, {
                 "chat": {"mean_acceptance_length": 2.7791, "speedup": 1.4958},
                 "mtbench": {"mean_acceptance_length": 2.5, "speedup": 1.3,
                             "categories": {"writing": {"mean_acceptance_length": 2.9, "speedup": 1.5},
                                            "math": {"mean_acceptance_length": 2.1, "speedup": 1.1}}}}),
                      _run("peagle", "peagle", 1.9, 0.98, {"chat": {"mean_acceptance_length": 1.9, "speedup": 0.98}},
                           lossless=False)]}
    (res / "benchmark.json").write_text(json.dumps(bench))
    (res / "serve/serving.json").write_text(json.dumps({"k": {"num_speculative_tokens": 3}}))
    (res / "serve/serve.sh").write_text("#!/bin/sh\n")
    lines = summary.result_screen(res).splitlines()
    assert lines[0] == f"Result of run r ({res}/):"
    assert lines[1] == f"  eagle3 head, llama draft layer ({res / 'head'}), served at k 3"
    assert lines[2] == "  the target alone: 594.69 output tokens/s; 1 request(s) in flight, 16 prompts a set, greedy"
    assert lines[3] == ("  this run's head (eagle3, llama layer, k=3 (trained for any k)): tau 2.695, speed-up 1.44x over "
                        "the target alone, lossless")
    assert lines[4:8] == ["    chat       tau 2.779, 1.50x", "    mtbench    tau 2.500, 1.30x",
                          "      writing      tau 2.900, 1.50x", "      math         tau 2.100, 1.10x"]
    assert lines[8].startswith("  peagle (peagle, llama layer, k=3") and lines[8].endswith("0.98x over the target "
                                                                                          "alone, NOT lossless")
    assert lines[-2] == f"  report: {res / 'report/benchmark.png'}; figures: {res / 'benchmark.json'}"
    assert lines[-1].startswith(f"  serve it: {res / 'serve/serve.sh'}")
    assert summary.result_screen(tmp_path / "results/none") is None  # no benchmark.json yet


def test_the_failure_screen_names_each_jobs_own_line_and_log(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("Traceback ...\nValueError: x\ncapture failed: ValueError: x (set capture.aux_layer_ids)\n\n")
    text = summary.failure_screen([("capture_hidden_states", [str(log)]), ("benchmark", [str(tmp_path / "gone.log")])])
    assert text.splitlines() == [
        "What failed:", "  capture_hidden_states: capture failed: ValueError: x (set capture.aux_layer_ids)",
        f"    log: {log}", "  benchmark: (its log cannot be read: No such file or directory)",
        f"    log: {tmp_path / 'gone.log'}"]
    assert summary.failure_screen([]).startswith("No job failed: the build was stopped before its end")


def test_the_result_follows_snakemakes_nothing_to_be_done_line():
    lg = logging.getLogger("test-summary")
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    lg.handlers, lg.propagate = [Keep()], False
    lg.setLevel(logging.INFO)
    summary.after_message(lg, "Nothing to be done.", lambda: "the result")
    lg.info("Building DAG of jobs...")
    lg.info("Nothing to be done.")
    assert seen == ["Building DAG of jobs...", "Nothing to be done.", "the result"]
    lg.handlers = []


def _report(res, **over):
    """A data_report.json (data/prepare_data.py) with nothing lost, ``over`` put in (``sources``: one source's fields)."""
    src = {"path": "chats.jsonl", "bad_lines": 0, "truncated_at_byte": None, "bytes_lost": 0, "compressed_stream_cut": False,
           "records_lost": 0, "bad_utf8_bytes": 0, **over.pop("sources", {})}
    rep = {"sources": [src], "records_read": 50, "kept": 50, "skipped": {}, "skipped_total": 0,
           "truncated_to_max_seq_len": 0, "max_seq_len": 512, **over}
    (res / "data").mkdir(parents=True, exist_ok=True)
    (res / "data/data_report.json").write_text(json.dumps(rep))


def test_the_data_line_says_what_prepare_data_dropped_or_cut(tmp_path):
    """Issue 71: one line where prepare_data lost anything (lines that do not parse, a file cut mid-record, records
    skipped by reason, most first, conversations cut to data.max_seq_len), naming data_report.json; none where it lost
    nothing, nor where there is no report."""
    res = tmp_path / "results/r"
    assert summary.data_line(res) is None
    _report(res)
    assert summary.data_line(res) is None
    _report(res, sources={"bad_lines": 1, "truncated_at_byte": 1200, "bytes_lost": 37}, kept=40,
            skipped={"empty_text": 2, "too_few_supervised_tokens": 20, "unknown_role": 2, "bad_unicode": 0},
            skipped_total=24, truncated_to_max_seq_len=39, max_seq_len=128)
    assert summary.data_line(res) == (
        "  data lost: chats.jsonl: 1 line(s) not JSON, cut off at byte 1200 (37 bytes lost); 24 record(s) skipped "
        "(too_few_supervised_tokens 20, empty_text 2, unknown_role 2), 40 kept; 39 kept conversation(s) cut to "
        f"data.max_seq_len 128 tokens; see {res / 'data/data_report.json'}")
    _report(res, sources={"compressed_stream_cut": True, "records_lost": 3, "bad_utf8_bytes": 2})
    assert summary.data_line(res) == ("  data lost: chats.jsonl: its compressed stream cut short, 3 row(s) unreadable, "
                                      f"2 byte(s) not UTF-8; see {res / 'data/data_report.json'}")


def test_the_data_line_is_on_the_result_screen_and_on_a_build_without_benchmark(tmp_path):
    res = tmp_path / "results/r"
    _report(res, sources={"bad_lines": 2})
    line = f"  data lost: chats.jsonl: 2 line(s) not JSON; see {res / 'data/data_report.json'}"
    assert summary.build_end(res).splitlines() == [f"{res}/benchmark.json is not built yet", line]
    (res / "benchmark.json").write_text(json.dumps({"runs": []}))
    lines = summary.result_screen(res).splitlines()
    assert lines[-2:] == [line, f"  report: {res / 'report/benchmark.png'}; figures: {res / 'benchmark.json'}"]
    assert summary.build_end(res) == summary.result_screen(res)
    _report(res)  # nothing lost: no line
    assert not [x for x in summary.result_screen(res).splitlines() if "data lost" in x]
    assert summary.build_end(tmp_path / "results/none") == f"{tmp_path / 'results/none'}/benchmark.json is not built yet"
