"""Shared fixtures: the materialised SmolLM2 target (built once per session), tiny random targets, and the
reduced build (tests/reduced.yaml through snakemake, once per session: test_e2e.py and test_slurm.py).

Markers (pyproject.toml): a test that uses the reduced build (``reduced_workdir``, ``reduced_build``) is
marked ``e2e`` here at collection, and ``vllm`` too where the build it needs serves the head, so that
``make check`` (``-m "not e2e and not vllm and not slurm and not slow"``) never starts a build or an engine.
In such a session ``smol_target`` is materialised in this process by the function the materialize_target
rule runs; where the reduced build runs anyway, it is a copy of that build's target (one dequantisation a
session either way)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
BUNDLED_NAME = "smollm2-135m-instruct"  # tests/reduced.yaml's target
BUNDLED_TARGET = f"resources/targets/{BUNDLED_NAME}"  # where the reduced build's materialize_target job writes it
# Fixtures that run snakemake jobs: a test using one is marked e2e (and vllm: the build serves the head).
BUILD_FIXTURES = {"reduced_workdir": ("e2e",), "reduced_build": ("e2e", "vllm")}


@pytest.fixture(autouse=True)
def _sigterm_disposition_restored():
    """Each test leaves SIGTERM as it found it: job.main, called in this process by some tests, ignores SIGTERM once its
    entry returned (until the job exits), and a child started later inherits an ignored signal across exec (a test
    that stops a subprocess with SIGTERM then waits forever)."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m deselection
def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, marks in BUILD_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                for mark in marks:
                    item.add_marker(mark)


def _runs_the_reduced_build(session) -> bool:
    return any(set(BUILD_FIXTURES) & set(getattr(item, "fixturenames", ())) for item in session.items)


def _fail_with_logs(what: str, p: subprocess.CompletedProcess, wd: Path) -> None:
    logs = "\n".join(f"== {f}\n{f.read_text()[-3000:]}" for f in sorted((wd / "logs").rglob("*.log")))
    pytest.fail(f"{what} failed:\n{p.stderr[-4000:]}\n{logs}")


@pytest.fixture(scope="session")
def reduced_workdir(tmp_path_factory) -> Path:
    """The reduced build's workdir with its first job done: the bundled target materialised by the
    materialize_target rule through snakemake (~1 min). smol_target is a copy of that target, and
    reduced_build builds the rest here: the dequantisation runs once a session."""
    from smk import run

    wd = tmp_path_factory.mktemp("e2e")
    p = run(["--configfile", str(REPO / "tests/reduced.yaml"), "--until", "materialize_target"], wd, timeout=1200)
    if p.returncode != 0:
        _fail_with_logs("materialize_target", p, wd)
    return wd


@pytest.fixture(scope="session")
def smol_target(request, tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct dequantised from the bundled GGUF into an HF directory (the tests' own copy):
    what the reduced build's materialize_target job wrote where this session runs that build, else made
    here by the function that job runs (eagle3build.compat.materialize_target.materialize, ~30 s)."""
    out = tmp_path_factory.mktemp("targets") / "smollm2"
    if _runs_the_reduced_build(request.session):
        shutil.copytree(request.getfixturevalue("reduced_workdir") / BUNDLED_TARGET, out)
    else:
        from eagle3build.compat.materialize_target import materialize

        materialize(BUNDLED_NAME, out)
    return out


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory, smol_target) -> Path:
    """A 6-layer, hidden-64 random Llama with SmolLM2's tokenizer and chat template (vocab 49152)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )
    out = tmp_path_factory.mktemp("targets") / "tiny-llama"
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    for f in TOKENIZER_FILES:
        if (smol_target / f).exists():
            shutil.copy(smol_target / f, out / f)
    return out


@pytest.fixture(scope="session")
def sharegpt_sample(tmp_path_factory) -> Path:
    """The first 60 records of the bundled ShareGPT file, as a small JSON array."""
    import json

    from eagle3build.formats.conversation_files import SourceStats, bundled_sharegpt_path, read_records

    recs = []
    for _, r in read_records(bundled_sharegpt_path(), SourceStats(path="bundled")):
        recs.append(r)
        if len(recs) == 60:
            break
    out = tmp_path_factory.mktemp("data") / "sharegpt60.json"
    out.write_text(json.dumps(recs))
    return out


TINY_AUX = [1, 3, 4]


def prepare_settings(sources, target, out, **settings):
    """prepare_data's ``PrepareSettings`` of ``sources`` (``[{"path", "max_samples"}]``) and the target folder
    ``target``, written to ``out`` (the train, eval, prompts and report files: a sequence in that order, or a mapping
    of those names); ``settings``: its other fields (config fields at their declared defaults otherwise)."""
    from eagle3build.data.prepare_data import PrepareSettings

    files = [out[k] for k in ("train", "eval", "prompts", "report")] if isinstance(out, dict) else list(out)
    return PrepareSettings(sources=sources, target_dir=target, out_train=files[0], out_eval=files[1],
                           out_prompts=files[2], out_report=files[3], **settings)


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory, tiny_target):
    """Tokens skewed toward a few ids (like real text), one train and one eval shard captured from the
    tiny target, a vocab map (draft 256) and a decisions.json stub: ``(dir, samples, vocab_info)``."""
    import json

    import numpy as np

    from eagle3build.capture import capture_hidden_states as cap
    from eagle3build.data import prepare_data as pd
    from eagle3build.formats.artifacts import minimal_decisions
    from eagle3build.train import build_vocab_map as bv

    d = tmp_path_factory.mktemp("pipeline")
    rng = np.random.default_rng(0)
    common = rng.integers(100, 400, 64)  # a 64-token "language"
    samples = []
    for i in range(10):
        n = int(rng.integers(40, 90))
        ids = rng.choice(common, n).astype(np.int32)
        mask = np.zeros(n, np.uint8)
        mask[n // 3:] = 1
        samples.append((f"s{i}", ids, mask))
    pd.write_tokens(d / "train.safetensors", samples[:8])
    pd.write_tokens(d / "eval.safetensors", samples[8:])
    for split, n in (("train", 8), ("eval", 2)):
        cap.capture_shard(cap.CaptureSettings(target_dir=tiny_target, tokens_path=d / f"{split}.safetensors",
                                              out_path=d / f"{split}-shard.safetensors", start=0, count=n,
                                              aux_layer_ids=TINY_AUX, target_fingerprint="fp-tiny", split=split,
                                              compute_dtype="auto"))
    (d / "decisions.json").write_text(json.dumps(minimal_decisions("fp-tiny", TINY_AUX, 49152)))
    info = bv.build(d / "train.safetensors", 49152, 256, d / "d2t.npy", d / "t2d.npy", d / "vocab.json")
    return d, samples, info


@pytest.fixture(scope="session")
def reduced_build(reduced_workdir):
    """tests/reduced.yaml built by snakemake in a workdir of its own (~6 min on 2 cores after the target),
    once per session: ``(workdir, workdir / "results/reduced")``. test_e2e.py checks it and replans or
    rebuilds parts of it in place (each such test leaves it up to date); test_slurm.py runs a change of it
    through SLURM on a copy."""
    from smk import run

    wd = reduced_workdir
    p = run(["--configfile", str(REPO / "tests/reduced.yaml")], wd, timeout=2400)
    if p.returncode != 0:
        _fail_with_logs("workflow", p, wd)
    return wd, wd / "results/reduced"


SLURM_PARTITION = "e3test"
_CLUSTER_START: dict = {}  # the background start_cluster.sh of this session: its Popen and output files


def _start_cluster_in_background(tmp_dir: Path) -> None:
    out, err = (open(tmp_dir / f"start_cluster.{s}", "w+") for s in ("out", "err"))
    proc = subprocess.Popen(["bash", str(REPO / "tests/slurm/start_cluster.sh")], stdout=out, stderr=err, text=True,
                            env={**os.environ, "SLURM_TEST_PARTITION": SLURM_PARTITION})
    _CLUSTER_START.update(proc=proc, out=out, err=err)


def pytest_collection_finish(session):
    """A session that runs the cluster test starts tests/slurm/start_cluster.sh now, beside the other tests: its
    install of SLURM (apt-get, minutes on a fresh machine) and daemon start overlap them instead of adding to
    the session, and where an earlier session's cluster is configured but down, it is up again before most of
    the ~100 snakemake starts (each waits ~9 s for a configured, absent controller: the SLURM executor plugin
    runs `scontrol show config` on import, whatever the executor)."""
    if session.config.option.collectonly or not any(
            "slurm_cluster_start" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    _start_cluster_in_background(Path(tempfile.mkdtemp(prefix="slurm-start-")))


@pytest.fixture(scope="session")
def slurm_cluster_start(tmp_path_factory) -> subprocess.CompletedProcess:
    """tests/slurm/start_cluster.sh run once a session (started at collection, pytest_collection_finish; it
    installs SLURM where root and apt-get can, starts the one-node cluster or finds it up): its exit status names
    the step that failed; the last word it prints on success is the partition. test_slurm.py skips on a failure."""
    if not _CLUSTER_START:
        _start_cluster_in_background(tmp_path_factory.mktemp("slurm-start"))
    proc, out, err = _CLUSTER_START["proc"], _CLUSTER_START["out"], _CLUSTER_START["err"]
    try:
        proc.wait(timeout=1200)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    out.seek(0)
    err.seek(0)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


def fake_engines(monkeypatch, fake_run_child):
    """Stand ``fake_run_child`` (``engine_process.run_child``'s arguments, a result like the entry's) in for every
    engine child: ``run_child``, and ``run_side_by_side`` as those calls one after the other, each result naming the
    others of its group (``started_beside``) as the real one does."""
    from eagle3build.vllm import engine_process

    def side_by_side(runs, workdir, env=None):
        out = [fake_run_child(entry, spec, workdir, name) for entry, spec, name in runs]
        for r, (_, _, name) in zip(out, runs, strict=True):
            r["started_beside"] = [n for _, _, n in runs if n != name]
        return out

    monkeypatch.setattr(engine_process, "run_child", fake_run_child)
    monkeypatch.setattr(engine_process, "run_side_by_side", side_by_side)


@pytest.fixture
def edited_stages(tmp_path):
    """A function ``(stage, old, new)`` -> every stage's declaration (``workflow.stages.declared``) with ``stage``'s
    module edited (``old`` replaced by ``new`` in a copy under ``tmp_path``): the contracts of that one edit
    (``contract.build_contracts(edited_stages(...))``)."""
    from eagle3build.workflow import stages

    def edited(stage: str, old: str, new: str):
        (path,) = REPO.glob(f"eagle3build/*/{stage}.py")
        text = path.read_text()
        assert old in text, f"{old!r} not in {path}"
        copy = tmp_path / "edited" / path.parent.name / path.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(text.replace(old, new, 1))
        return tuple(stages.read(copy) if d.stage == stage else d for d in stages.declared())

    return edited
