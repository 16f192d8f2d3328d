"""Card time per record (benchmarks/gpu/card_time.py, issue 65): job seconds read from Snakemake's log, a record's jobs
after the records before it, the benchmark counted per engine, and the driver's estimate lines."""
from __future__ import annotations

import sys

import pytest
from smk import REPO

sys.path.insert(0, str(REPO / "benchmarks/gpu"))
import card_time  # noqa: E402

LOG = """Building DAG of jobs...
Job stats:
job              count
-------------  -------
compat_report        1
[Mon Dec  7 03:00:00 2026]
localrule compat_report:
    input: resources/targets/t/config.json
    output: results/r/compat.json
    jobid: 3
    resources: tmpdir=/tmp

[Mon Dec  7 03:00:00 2026]
rule capture_hidden_states:
    output: results/r/hidden_states/train/shard-00000.safetensors
    jobid: 7
    wildcards: split=train, shard=00000

[Mon Dec  7 03:00:17 2026]
Finished jobid: 3 (Rule: compat_report)
1 of 4 steps (25%) done
[Mon Dec  7 03:00:40 2026]
Finished jobid: 7 (Rule: capture_hidden_states)
[Mon Dec  7 03:00:40 2026]
rule capture_hidden_states:
    jobid: 8
[Mon Dec  7 03:00:50 2026]
Finished jobid: 8 (Rule: capture_hidden_states)
[Mon Dec  7 03:00:50 2026]
rule train_draft:
    jobid: 2
[Mon Dec  7 03:05:00 2026]
Terminating processes on user request, this might take some time.
Building DAG of jobs...
[Mon Dec  7 03:06:00 2026]
rule capture_hidden_states:
    jobid: 1
[Mon Dec  7 03:06:30 2026]
Finished jobid: 1 (Rule: capture_hidden_states)
"""


def test_job_seconds_from_a_snakemake_log_over_two_calls():
    jobs = card_time.job_seconds(LOG)
    assert [(j["rule"], j["seconds"], j["finished"]) for j in jobs] == [
        ("compat_report", 17.0, True), ("capture_hidden_states", 40.0, True), ("capture_hidden_states", 10.0, True),
        ("train_draft", 250.0, False),  # cut by the call's end: to the log's last stamp before the next call
        ("capture_hidden_states", 30.0, True)]
    assert card_time.per_rule(jobs) == {"capture_hidden_states": 30.0, "compat_report": 17.0}  # medians, finished


def test_a_job_runs_again_where_it_or_what_it_reads_is_new():
    J = card_time.Job
    a, b, c = J("a", ("a",), ()), J("b", ("b",), (("a",),)), J("c", ("c", "p2"), (("b",),))
    assert card_time.runs_again([a, b, c], {("a",), ("b",), ("c", "p1")}) == [c]  # c's params changed
    assert card_time.runs_again([a, b, c], {("b",), ("c", "p2")}) == [a, b, c]  # a is new: what reads it reruns


def test_the_benchmark_is_estimated_per_engine():
    cfg = {"run": "x", "draft": {"compare_methods": ["peagle", "dflash"]},
           "benchmark": {"ks": [3], "compare_heads": [], "k_schedule_concurrencies": []}}
    assert card_time.benchmark_engines(cfg) == 4  # the target alone, three heads at k 3
    sched = {**cfg, "draft": {}, "benchmark": {"ks": [3], "k_schedule_concurrencies": [1, 4]}}
    assert card_time.benchmark_engines(sched) == 1 + 1 + 3  # the sweep's k 3 and k 0, and the schedule
    table = {"*": {"engines": 2, "rules": {"benchmark": {"s": 100, "from": "x"}, "train_draft": {"s": 7, "from": "y"}}}}
    assert card_time.job_estimate("benchmark", cfg, table) == 200
    assert card_time.job_estimate("train_draft_method", cfg, table) == 7  # a compared method: its stage's rule
    assert card_time.job_estimate("serve_check", cfg, table) is None


def test_a_sequence_counts_each_record_after_the_ones_before(tmp_path):
    """The recipe, then kschedule over it: kschedule's plan is the recipe's with other benchmark params, so only its
    benchmark runs again (5 engines at 119 s for 2); the recipe's estimate adds the measured jobs, materialize_target
    unmeasured."""
    sys.path.insert(0, str(REPO / "benchmarks/gpu"))
    import record

    seq = card_time.Sequence(tmp_path, "h100")
    recipe = record.estimate(seq, "recipe")
    assert recipe.jobs == {"materialize_target": 1, "compat_report": 1, "prepare_data": 1, "build_vocab_map": 1,
                           "capture_hidden_states": 5, "train_draft": 1, "export_head": 1, "benchmark": 1}
    t = card_time.load_table()["h100"]["smollm2-8k"]["rules"]
    want = sum(t[r]["s"] for r in ("compat_report", "prepare_data", "build_vocab_map", "train_draft", "export_head",
                                   "benchmark")) + 5 * t["capture_hidden_states"]["s"]
    assert recipe.seconds == pytest.approx(want) and recipe.unmeasured == ["materialize_target"]
    ks = record.estimate(seq, "kschedule")
    assert ks.jobs == {"benchmark": 1} and ks.seconds == pytest.approx(t["benchmark"]["s"] * 5 / 2)
    assert ks.cumulative == pytest.approx(recipe.seconds + ks.seconds)
    assert ks.line(1000).endswith(f"{ks.cumulative:.0f} s so far (fits one lease, 1000 s)")
