"""The benchmark scripts under benchmarks/ at tiny size on the CPU: they run and print real figures.
(gpu_build.py and capture_host.py are smoke-run over the reduced build in test_e2e.py, capture_backends.py in
test_vllm_capture.py, peer_route.py in test_peer_route.py, check_records.py in test_records.py.)"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from smk import REPO


def _run(script, *args, timeout=600):
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args], capture_output=True, text=True,
                       timeout=timeout, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


@pytest.mark.slow
def test_capture_throughput_tiny(tmp_path):
    """A model passed in without a target directory (the benchmark's case) still gets its disk check. The disk is timed
    on 64 MiB, not 2 GiB twice (~10 s of writes here)."""
    _run("capture_throughput.py", "--device", "cpu", "--layers", "7", "--hidden", "64", "--intermediate", "128",
         "--batch", "2", "--seq", "32", "--batches", "2", "--disk-gb", "0.0625", "--out", str(tmp_path / "o"),
         "--json", str(tmp_path / "c.json"))
    r = json.loads((tmp_path / "c.json").read_text())
    assert r["disk_write_gb_per_s"]["page_cache"] > 0 and r["disk_write_gb_per_s"]["with_fsync"] > 0
    assert r["tokens_timed"] == 2 * 2 * 32 and r["aux_layer_ids"] == [2, 3, 4]
    bf16 = r["capture_bfloat16"]
    assert bf16["tokens_per_s"] > 0 and bf16["bytes_per_token"] >= 4 * 64 * 2  # 3 aux + 1 last state, bf16
    assert r["capture_float8_e4m3fn"]["bytes_per_token"] < bf16["bytes_per_token"]


@pytest.mark.slow
def test_train_throughput_tiny(tmp_path):
    """A training run beside one the old way (--baseline-compile), and the step A/B (--step-ab) of the eager step and
    the whole step compiled (inductor, both breaks removed) into a record: no graph break in the compiled step, under
    a third of the eager step's kernel ops (issue 70's goal), the same first loss (same weights and batch)."""
    _run("train_throughput.py", "--device", "cpu", "--hidden", "64", "--vocab", "1000", "--draft-vocab", "100",
         "--distinct", "50", "--samples", "4", "--eval-samples", "2", "--seq", "64", "--total-seq-len", "128",
         "--epochs", "1", "--baseline-compile", "off", "--compile", "off", "--step-ab", "--step-paths",
         "eager,whole:default:remove", "--step-warmup", "2", "--steps", "1", "--profile-steps", "1",
         "--out", str(tmp_path / "o"), "--json", str(tmp_path / "t.json"), "--record", str(tmp_path / "rec"))
    r = json.loads((tmp_path / "t.json").read_text())
    assert r["flops_per_token"] > 0 and r["ours"]["tokens_per_s"] > 0
    assert 1.0 <= r["ours"]["simulated_acceptance_length"] <= 4.0
    assert r["ours_over_baseline"]["simulated_tau_rel_diff"] == 0.0  # both eager: the same run twice
    eager, whole = r["step_ab"]["eager"], r["step_ab"]["whole:default:remove"]
    assert eager["graph_breaks"] is None and eager["compiled_graphs"] == 0 and eager["kernel_ops"] > 300
    assert whole["graph_breaks"] == 0 and whole["warmup"]["graph_breaks_traced"] == 0
    assert whole["steady"] == {"graph_breaks_traced": 0, "graphs_compiled": 0, "recompiles": 0}
    assert r["step_ab"]["whole:default:remove_over_eager"]["kernel_ops"] < 1 / 3
    assert whole["first_loss"] == pytest.approx(eager["first_loss"], rel=1e-4)
    rec = json.loads((tmp_path / "rec/train-step-graphs_cpu.json").read_text())
    assert rec["results"]["whole:default:remove.graph_breaks"] == 0 and "--record" not in rec["made_by"]["command"]


@pytest.mark.slow
def test_compat_report_kimi_small(smol_target):
    """The compat-report benchmark on the bundled 135M target (the Kimi shape starts vLLM's capture probe: minutes)."""
    p = _run("compat_report_kimi.py", "--target", str(smol_target), "--backend", "hooks")
    assert "backend: **hooks**" in p.stdout and "num_layers: 30" in p.stdout
    assert re.search(r"report: \d+\.\d s; total: \d+\.\d s", p.stdout)


@pytest.mark.slow
def test_plan_10k_tiny(tmp_path):
    """Planning benchmark with 8 shard jobs, each plan once: all four hold exactly that many shard jobs (asserted
    inside)."""
    _run("plan_10k.py", "--shards", "8", "--reps", "1", "--out", str(tmp_path / "plan.txt"))
    text = (tmp_path / "plan.txt").read_text()
    assert "8 shard jobs + aggregate" in text and "(best of 1; 8 capture_hidden_states" in text
    assert re.search(r"ratio to bare-dag: \d+\.\d\dx wall, \d+\.\d\dx CPU \(goal <= 1\.25x\)", text)
    assert re.search(r"ratio to bare-script: \d+\.\d\dx wall, \d+\.\d\dx CPU", text)
    assert re.search(r"ratio to bare-shell: \d+\.\d\dx wall, \d+\.\d\dx CPU", text)


@pytest.mark.slow
def test_prepare_data_throughput_tiny(smol_target, tmp_path):
    p = _run("prepare_data_throughput.py", str(smol_target), "--max-seq-len", "256", "--max-samples", "12",
             "--workers", "1", "2", "--record", str(tmp_path))
    assert '"kept": 12' in p.stdout and re.search(r"conversations/s \(records read\): \d+\.\d", p.stdout)
    assert re.search(r"workers 2: .*speed-up over workers 1: \d+\.\d\dx", p.stdout)
    assert "the same files and report with workers [1, 2]" in p.stdout
    rec = json.loads((tmp_path / "prepare-data-workers_cpu.json").read_text())
    assert rec["results"]["kept"] == 12 and rec["results"]["same_bytes"] == 1 and rec["results"]["workers2.seconds"] > 0


def test_every_benchmark_script_is_smoke_run():
    """Each benchmarks/*.py is run by a test: this file, or the three named in the module docstring."""
    tests = "".join((REPO / "tests" / f).read_text()
                    for f in ("test_benchmark_scripts.py", "test_e2e.py", "test_vllm_capture.py", "test_peer_route.py",
                          "test_records.py"))
    missing = [p.name for p in sorted([*(REPO / "benchmarks").glob("*.py"), REPO / "benchmarks/gpu/record.py"])
               if f'"{p.name}"' not in tests and f"benchmarks/{p.name}" not in tests and f"import {p.stem}\n" not in tests]
    assert not missing, f"benchmark scripts without a smoke test: {missing}"


def test_fingerprint_cost_tiny(tmp_path):
    """The fingerprint benchmark on 2 files of 1 MB: four timed fingerprints agree (asserted inside), rates printed."""
    _run("fingerprint_cost.py", "--gb", "0.002", "--files", "2", "--dir", str(tmp_path), "--out", str(tmp_path / "f.txt"))
    text = (tmp_path / "f.txt").read_text()
    assert "0.00 GB in 2 safetensors files" in text
    assert len(re.findall(r"= \d+\.\d\d GB/s", text)) == 4
    assert re.search(r"600 GB target: \d+\.\d min at this disk's cold rate", text)


def test_speedup_split_tiny(tmp_path):
    """A benchmark.json whose steps take exactly 2 ms + 0.5 ms per draft token: the split finds both."""
    def run(tpot, tau=None, k=None):
        f = {"time_per_output_token_s": {"p50": tpot, "p95": tpot, "mean": tpot}}
        if tau is not None:
            f.update(mean_acceptance_length=tau, speedup=0.002 / tpot)
        f["sets"] = {"chat": dict(f)}
        return dict(f, num_speculative_tokens=k) if k else f

    taus = {1: 1.6, 2: 2.0, 3: 2.3, 5: 2.5}
    # a compared head (benchmark.compare_heads) drafting all k in one forward: 2.4 ms + 0.1 ms a draft, fitted apart
    result = {"settings": {"concurrency": 1, "sets": {"chat": {}}}, "baseline": run(0.002),
              "runs": [dict(run((2 + 0.5 * k) / 1e3 / t, t, k), head="head") for k, t in taus.items()]
              + [dict(run((2.4 + 0.1 * k) / 1e3 / t, t, k), head="peagle") for k, t in taus.items()]}
    (tmp_path / "b.json").write_text(json.dumps(result))
    p = _run("speedup_split.py", str(tmp_path / "b.json"), "--json", str(tmp_path / "s.json"))
    assert "[head, overall, concurrency 1]: baseline step 2.0 ms; fixed a = 2.0 ms (1.0x the baseline step), " \
           "b = 0.5 ms per draft token" in p.stdout
    assert "[peagle, overall, concurrency 1]: baseline step 2.0 ms; fixed a = 2.4 ms (1.2x the baseline step), " \
           "b = 0.1 ms per draft token" in p.stdout
    splits = json.loads((tmp_path / "s.json").read_text())
    assert [(s["head"], s["set"]) for s in splits] == [("head", "overall"), ("head", "chat"), ("peagle", "overall"),
                                                       ("peagle", "chat")]
    overall = splits[0]
    assert overall["rows"][2] == {"k": 3, "tau": 2.3, "tpot_ms": round(3.5 / 2.3, 3), "step_ms": 3.5,
                                  "speedup": round(2.3 * 2 / 3.5, 3), "ceiling_speedup": round(4 * 2 / 3.5, 3)}
    # a benchmark.json of before issue 55 (same OUTPUT_VERSION 7) (runs under "eagle3") without compared heads (no `head` on its
    # runs) is the run's own head alone
    result["eagle3"] = result.pop("runs")[:4]
    for r in result["eagle3"]:
        r.pop("head")
    (tmp_path / "b.json").write_text(json.dumps(result))
    p = _run("speedup_split.py", str(tmp_path / "b.json"))
    assert "[head, overall, concurrency 1]: baseline step 2.0 ms; fixed a = 2.0 ms" in p.stdout and "peagle" not in p.stdout


@pytest.mark.slow
def test_vocab_coverage_tiny(tmp_path, smol_target):
    """Train counts 3, 2, 1 of a served text's first three tokens (the rest never counted): a draft vocab of
    n tokens covers the n most frequent, so n of the served tokens and (3, 5, 6)/6 of the train ones."""
    import numpy as np
    from transformers import AutoTokenizer

    from eagle3build.formats.tokens import write_tokens

    text = " apple banana cherry dragonfruit"
    ids = AutoTokenizer.from_pretrained(smol_target)(text, add_special_tokens=False).input_ids
    assert len(ids) == len(set(ids)) >= 4
    a, b, c = ids[:3]
    train = np.array([a, a, a, b, b, c], dtype=np.int32)
    write_tokens(tmp_path / "train.safetensors", [("s0", train, np.ones(6, np.uint8)),
                                                 ("s1", np.array([ids[-1]] * 4, np.int32), np.ones(4, np.uint8))])
    bench = {"baseline": {"sets": {"chat": {"texts": [text]}, "empty": {"texts": [""]}}}}
    (tmp_path / "b.json").write_text(json.dumps(bench))
    p = _run("vocab_coverage.py", "--tokens", str(tmp_path / "train.safetensors"), "--num-samples", "1",
             "--target", str(smol_target), "--benchmark", str(tmp_path / "b.json"), "--sizes", "1", "2", "3",
             "--json", str(tmp_path / "c.json"))
    out = json.loads((tmp_path / "c.json").read_text())
    assert (out["tokens_counted"], out["distinct_tokens_seen"]) == (6, 3)  # sample s1 is past --num-samples
    n_served = len(ids)
    assert [(r["draft_vocab_size"], r["train"], r["sets"]) for r in out["rows"]] == [
        (n, round(t / 6, 4), {"chat": {"tokens": n_served, "coverage": round(n / n_served, 4)}})
        for n, t in ((1, 3), (2, 5), (3, 6))]
    assert f"draft vocab 2: train {5 / 6:.2%}; served chat {2 / n_served:.2%} of {n_served}" in p.stdout


def test_tau_guard_refuses_a_reference_of_other_settings(tmp_path):
    """A τ recorded at k = 3 is not comparable with a run at k = 5 (τ ≤ k + 1): the guard exits 2 before any
    engine starts, naming the file and the field; a reference without 'tau' likewise. (Serving itself is
    smoke-run in test_e2e.py.)"""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import tau_guard

    ref = {"k": 3, "num_prompts": 16, "max_tokens": 256, "tau": {"chat": 2.7758}}
    assert tau_guard.settings_mismatch(ref, 3, 16, 256) == []
    assert tau_guard.settings_mismatch(ref, 5, 16, 128) == ["k: reference 3, this run 5",
                                                             "max_tokens: reference 256, this run 128"]
    assert tau_guard.settings_mismatch({"tau": {}}, 5, 1, 1) == []  # settings not recorded: nothing to compare
    path = tmp_path / "ref.json"
    for content, needle in ((ref, "k: reference 3, this run 5"), ({"k": 5}, "no field 'tau'")):
        path.write_text(json.dumps(content))
        p = subprocess.run([sys.executable, str(REPO / "benchmarks/tau_guard.py"), "--target", "T", "--head", "H",
                            "--k", "5", "--num-prompts", "16", "--max-tokens", "256", "--reference", str(path)],
                           capture_output=True, text=True, timeout=300, cwd=REPO)
        assert p.returncode == 2 and str(path) in p.stderr and needle in p.stderr, p.stderr[-2000:]


@pytest.mark.slow
def test_decode_step_ab_on_vllm_cpu(tmp_path, smol_target):
    """One engine of vLLM's CPU backend (max_num_seqs 1), the decode step timed at two lengths after a cached
    context: a row per length, the longest the reference (ratio 1), the figures positive."""
    p = _run("decode_step_ab.py", str(smol_target), "--gpus", "0", "--engines", "1:1", "--lengths", "4", "8",
             "--repeats", "1", "--json", str(tmp_path / "ab.json"))
    r = json.loads((tmp_path / "ab.json").read_text())
    assert [(x["max_num_seqs"], x["graph_tokens"], x["decode_tokens"]) for x in r["rows"]] == [(1, 1, 4), (1, 1, 8)]
    assert all(x["decode_step_ms"] > 0 for x in r["rows"]) and r["rows"][1]["ratio_to_reference"] == 1.0
    assert r["reference"] == {"max_num_seqs": 1, "graph_tokens": 1, "decode_tokens": 8}
    assert (r["versions"].get("vllm") or r["versions"]["vllm-cpu"]) and r["engine_start_s"]["1:1"] > 0
    assert re.search(r"^\s+1\s+1\s+4\s+\d+\.\d{3}\s+\d\.\d{3}$", p.stdout, re.M)


@pytest.mark.slow
def test_gpu_record_driver_dry_run(tmp_path):
    """benchmarks/gpu/record.py --dry-run: each named record's config files validate and Snakemake plans its build up
    to the benchmark (a log per record), no record written."""
    p = _run("gpu/record.py", "recipe", "kimi-online", "--dry-run", "--seconds", "300", "--out", str(tmp_path))
    assert "recipe_plan: rc 0" in p.stdout and "kimi-online_plan: rc 0" in p.stdout
    plan = (tmp_path / "logs/recipe_plan.log").read_text()
    assert plan.split("\n")[0].endswith(f"--configfile {REPO / 'examples/configs/smollm2-8k-gpu.yaml'} "
                                         f"{REPO / 'benchmarks/gpu/no_preflight.yaml'}")
    assert re.search(r"^benchmark\s+1$", plan, re.M) and re.search(r"^train_draft\s+1$", plan, re.M)
    assert not re.search(r"^preflight_bound\s", plan, re.M)  # no recipe-based record quotes it (issue 65)
    # the card time of each, in this order (card_seconds.yaml): the recipe's 12 jobs; kimi-online's own plan
    assert "card time on h100, in this order" in p.stdout
    assert re.search(r"^  recipe: ~\d+ s \(12 jobs: .*; \d+ s so far \((fits|beyond) one lease, 1500 s\)$", p.stdout, re.M)
    assert re.search(r"^  kimi-online: ~\d+ s \(\d+ jobs: ", p.stdout, re.M)
    online = (tmp_path / "logs/kimi-online_plan.log").read_text()
    assert not re.search(r"^capture_hidden_states\s+\d", online, re.M)  # online: no shards
    assert not (tmp_path / "records").exists()


def test_test_loop_tiny(tmp_path):
    """The test-loop timer over a fresh clone of HEAD with two steps of its own: the clone holds the repository, each
    step's pytest summaries are added up into its record, the first record says it includes the install."""
    work = tmp_path / "work"
    p = _run("test_loop.py", "--work", str(work), "--out", str(tmp_path / "records"),
             "--step", "one=test -f Makefile && echo '3 passed, 1 skipped, 2 deselected in 0.50s'",
             "--step", "two=echo '1 failed, 4 passed in 1.0s'; echo '2 passed in 0.1s'")
    assert (work / "clone/Snakefile").exists() and "one: exit 0" in p.stdout
    one = json.loads((tmp_path / "records/one_cpu.json").read_text())
    two = json.loads((tmp_path / "records/two_cpu.json").read_text())
    assert one["results"] == {"minutes": pytest.approx(0, abs=0.05), "passed": 3, "skipped": 1, "failed": 0,
                              "errors": 0}
    assert (two["results"]["passed"], two["results"]["failed"]) == (6, 1) and "install" in one["notes"]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    assert one["commit"] == head.strip() and one["hardware"]["card"] == "cpu"


def test_test_loop_quotes_the_make_run_builds_result(tmp_path):
    """The make-run step's record quotes the build's figures from the clone's results/default/benchmark.json (the
    first run: its k, tau and speed-up overall and per set, lossless), beside its minutes."""
    bench = {"runs": [{"num_speculative_tokens": 1, "mean_acceptance_length": 1.19812, "speedup": 1.04231,
                       "lossless": True, "sets": {"chat": {"mean_acceptance_length": 1.21, "speedup": 1.05},
                                                  "mtbench": {"mean_acceptance_length": None, "speedup": 0.9}}}]}
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(bench))
    _run("test_loop.py", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "records"),
         "--step", f"make-run=mkdir -p results/default && cp {src} results/default/benchmark.json")
    rec = json.loads((tmp_path / "records/make-run_cpu.json").read_text())["results"]
    assert {k: v for k, v in rec.items() if k.startswith("result.")} == {
        "result.k": 1, "result.tau": 1.1981, "result.speedup": 1.0423, "result.lossless": True,
        "result.chat.tau": 1.21, "result.chat.speedup": 1.05, "result.mtbench.tau": None, "result.mtbench.speedup": 0.9}


def test_test_loop_runs_the_readmes_serve_block_word_for_word_and_reads_its_tau(tmp_path):
    """The readme-serve step (issue 67): README.md's "Serve it" block, taken from the clone's README, becomes one
    bash command word for word (then a wait for the server it stopped); τ = 1 + accepted / drafts from the counters
    it prints, and the greedy answer's tokens."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import test_loop

    (tmp_path / "README.md").write_text("# x\n\n## Serve it\n\ntext\n\n```\necho one &\nkill %1\n```\n\n## Next\n")
    cmd = test_loop.readme_serve_command(tmp_path)
    assert cmd == "timeout 900 bash -c 'echo one &\nkill %1\nwait %1 2>/dev/null || true\n'"
    assert subprocess.run(cmd, shell=True, capture_output=True, text=True).returncode == 0
    block = test_loop.readme_serve_block((REPO / "README.md").read_text())
    assert block.startswith("results/default/serve/serve.sh &") and block.rstrip().endswith("kill %1")
    out = ('{"id":"chatcmpl-1","usage":{"completion_tokens":64}}\n'
           'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 15.0\n'
           'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 50.0\n')
    assert test_loop.serve_result(out) == {"tau": 1.3, "drafts": 50, "accepted_tokens": 15, "completion_tokens": 64}
    assert test_loop.serve_result("no server") == {}
