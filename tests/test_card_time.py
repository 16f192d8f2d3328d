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
    hosts = [{"host": "a", "probe": None,
              "runs": {"*": {"engines": 2, "rules": {"benchmark": {"s": 100, "from": "x"},
                                                     "train_draft": {"s": 7, "from": "y"}}}}}]
    assert card_time.job_estimate("benchmark", cfg, hosts) == card_time.JobEstimate(200, "a", None)
    assert card_time.job_estimate("train_draft_method", cfg, hosts).seconds == 7  # a compared method: its stage's rule
    assert card_time.job_estimate("serve_check", cfg, hosts) is None


def test_a_hosts_seconds_are_scaled_by_the_probe_of_the_nearest_probed_host():
    """Two hosts of one card measured the same rules; this host's probe is nearest the slow one's: its seconds scaled
    by the launch ratio (capture, training: launch-bound) or the CPU ratio (prepare_data); without a probe that
    compares (none here, or a CPU probe against CUDA ones), the latest host's seconds unscaled."""
    cfg = {"run": "r", "draft": {}, "benchmark": {"ks": [3]}}
    rules = {"train_draft": {"s": 400, "from": "x"}, "prepare_data": {"s": 30, "from": "x"},
             "export_head": {"s": 20, "from": "x", "bound": "gpu"}}
    fast = {"host": "fast", "probe": {"cpu_s": 1.0, "launch_us": 5.0, "device": "cuda"}, "runs": {"r": {"rules": rules}}}
    slow = {"host": "slow", "probe": {"cpu_s": 2.0, "launch_us": 10.0, "device": "cuda"},
            "runs": {"r": {"rules": {k: {**v, "s": 2 * v["s"]} for k, v in rules.items()}}}}
    here = {"cpu_s": 3.0, "launch_us": 12.0, "device": "cuda"}
    e = card_time.job_estimate("train_draft", cfg, [fast, slow], here)
    assert (e.host, e.factor, e.seconds) == ("slow", pytest.approx(1.2), pytest.approx(960))
    e = card_time.job_estimate("prepare_data", cfg, [fast, slow], here)
    assert (e.host, e.factor, e.seconds) == ("slow", pytest.approx(1.5), pytest.approx(90))
    assert card_time.job_estimate("export_head", cfg, [fast, slow], here).seconds == 40  # gpu-bound: as measured
    old = {**slow, "probe": None}
    assert card_time.job_estimate("train_draft", cfg, [fast, old], {**here, "device": "cpu"}) == \
        card_time.JobEstimate(800, "slow", None)  # no probe compares: the latest host, unscaled
    assert card_time.job_estimate("train_draft", cfg, [fast, old], here).host == "fast"  # the one probed host


def test_the_host_probe_measures_this_host():
    p = card_time.host_probe("cpu", launches=200, rounds=2)
    assert p["device"] == "cpu" and 0 < p["cpu_s"] < 30 and 0 < p["launch_us"] < 10_000


def test_a_cut_training_counts_whole_and_a_cut_export_starts_again():
    """A training cut by a call's end resumes (its cut part is its cost); an export cut starts again (its cut part is
    the call's loss): per_rule counts the training's parts together and the export's finished run alone; measured
    counts every part of both."""
    log = """Building DAG of jobs...
[Mon Dec  7 03:00:00 2026]
rule train_draft:
    jobid: 4
[Mon Dec  7 03:01:00 2026]
rule export_head:
    jobid: 5
    wildcards: method=eagle3
[Mon Dec  7 03:02:00 2026]
Terminating processes on user request, this might take some time.
Building DAG of jobs...
[Mon Dec  7 03:10:00 2026]
rule train_draft:
    jobid: 1
[Mon Dec  7 03:13:00 2026]
Finished jobid: 1 (Rule: train_draft)
[Mon Dec  7 03:13:00 2026]
rule export_head:
    jobid: 2
    wildcards: method=eagle3
[Mon Dec  7 03:13:30 2026]
Finished jobid: 2 (Rule: export_head)
"""
    jobs = card_time.job_seconds(log)
    assert card_time.per_rule(jobs) == {"export_head": 30.0, "train_draft": 120.0 + 180.0}
    assert card_time.measured(jobs) == {"export_head": 60.0 + 30.0, "train_draft": 300.0}


def test_a_record_holds_its_measured_seconds_beside_its_estimate(tmp_path):
    """record.py's card_time_results: each rule's measured seconds from the record's Snakemake log, its estimate, the
    calls' wall seconds against the estimate's total, and the host probe."""
    sys.path.insert(0, str(REPO / "benchmarks/gpu"))
    import record

    call = record.Call(100, tmp_path / "out", tmp_path)
    (call.out / "logs" / "x.log").write_text(LOG)
    state = tmp_path / "state"
    assert record._timed(state, "x", "snakemake", lambda: 0) == 0
    (state / "x.seconds.json").write_text('{"snakemake": 330.0}')
    est = card_time.Estimate("x", {"compat_report": 1, "capture_hidden_states": 3}, 300.0, [],
                             per_rule={"compat_report": 20.0, "capture_hidden_states": 280.0})
    probe = {"cpu_s": 0.5, "launch_us": 7.5, "device": "cuda"}
    r = record.card_time_results("x", call, state, est, probe)
    assert r["card_time.measured_s.capture_hidden_states"] == 80.0 and r["card_time.measured_s.compat_report"] == 17.0
    assert r["card_time.measured_s.train_draft"] == 250.0  # cut, never finished in this log
    assert r["card_time.estimate_s.capture_hidden_states"] == 280.0 and r["card_time.estimate_s.total"] == 300.0
    assert r["card_time.measured_s.total"] == 330.0 and r["card_time.measured_over_estimate"] == 1.1
    assert (r["host.launch_us"], r["host.device"]) == (7.5, "cuda")
    f = tmp_path / "rec.json"
    f.write_text(__import__("json").dumps({"results": r}))
    assert card_time.read_probe(f) == probe  # card_time.py update --probe reads it back from the record


def test_a_sequence_counts_each_record_after_the_ones_before(tmp_path):
    """The recipe, then kschedule over it: kschedule's plan is the recipe's with other benchmark params, so only its
    benchmark runs again (5 engines at the measured seconds for 2); the recipe's estimate adds the measured jobs
    (materialize_target: only the 2026-12-07 evening host's, which ran a given head's records)."""
    sys.path.insert(0, str(REPO / "benchmarks/gpu"))
    import record

    seq = card_time.Sequence(tmp_path, "h100")
    recipe = record.estimate(seq, "recipe")
    assert recipe.jobs == {"materialize_target": 1, "compat_report": 1, "prepare_data": 1, "build_vocab_map": 1,
                           "capture_hidden_states": 5, "train_draft": 1, "export_head": 1, "benchmark": 1}
    # each rule's seconds: the latest host's that measured it (on a host that is not probed: unscaled)
    t = {}
    for h in card_time.load_table()["h100"]:
        t.update(h["runs"]["smollm2-8k"]["rules"])
    want = sum(t[r]["s"] for r in ("materialize_target", "compat_report", "prepare_data", "build_vocab_map",
                                   "train_draft", "export_head", "benchmark")) + 5 * t["capture_hidden_states"]["s"]
    assert recipe.seconds == pytest.approx(want) and recipe.unmeasured == []
    ks = record.estimate(seq, "kschedule")
    assert ks.jobs == {"benchmark": 1} and ks.seconds == pytest.approx(t["benchmark"]["s"] * 5 / 2)
    assert ks.cumulative == pytest.approx(recipe.seconds + ks.seconds)
    assert ks.line(3000).endswith(f"unscaled (not probed); {ks.cumulative:.0f} s so far (fits one lease, 3000 s)")
    assert ks.line(1000).endswith("(beyond one lease, 1000 s)")


def test_the_docs_table_is_the_card_time_table():
    """docs/card-time.md shows card_seconds.yaml as `card_time.py table` prints it (update it after `update`)."""
    assert card_time.markdown(card_time.load_table()) in (REPO / "docs/card-time.md").read_text()
