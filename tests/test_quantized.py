"""Quantized targets (issue 74): made by compressed-tensors (examples/targets/quantize_target.py), named by the compat
report with the routes that load them, refused where no route here serves them, planned with their real bytes, and
built end to end on CPU where vLLM-CPU and transformers both load them (FP8: the states, the head and its benchmark of
the quantized target as served).

What this CPU's vLLM (vllm-cpu 0.32, float32: every CPU engine here) does with each, as the tests find it:
- FP8 (``FP8_DYNAMIC``, compressed-tensors ``float-quantized``): loads and serves; the build runs to the end.
- W4A16 (SmolLM2, group 64) and Kimi-K2.5's INT4 experts (group 32): ``cpu_gemm_wna16`` has no float32 kernel;
  transformers loads both (the hooks route), but the benchmark and serving need vLLM, so the compat report refuses.
"""
from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import torch
from safetensors import safe_open
from smk import REPO, run, write_config

from eagle3build.formats import quantization
from eagle3build.formats.shards import ShardMeta

SCRIPT = REPO / "examples/targets/quantize_target.py"
KIMI_SHAPE = REPO / "examples/targets/kimi-k2.5-shape"


def quantize(src, out, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(src), str(out), *args], capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def quantized(smol_target, tmp_path_factory):
    """SmolLM2 as W4A16 (group 64) and FP8, made by the script: ``{"w4a16": dir, "fp8": dir}``."""
    base = tmp_path_factory.mktemp("quantized")
    out = {}
    for scheme, args in (("w4a16", ("--scheme", "w4a16", "--group-size", "64")), ("fp8", ("--scheme", "fp8"))):
        p = quantize(smol_target, base / scheme, *args)
        assert p.returncode == 0, p.stderr[-2000:]
        assert json.loads(p.stdout.splitlines()[-1])["quantized_modules"] == 30 * 7  # q k v o gate up down, 30 layers
        out[scheme] = base / scheme
    return out


def tensors(folder) -> dict:
    with safe_open(str(next(folder.glob("*.safetensors"))), "pt") as f:
        return {k: f.get_slice(k) for k in f.keys()}


@pytest.mark.slow  # the bundled target materialized and quantized twice (~60 s): make test, not make check
def test_the_script_makes_int4_and_fp8_checkpoints_as_vllm_loads_them(smol_target, quantized, tmp_path):
    """W4A16: each Linear's weight packed 8 INT4 to an int32 with one scale per 64 inputs, lm_head (tied) and
    embeddings left as they were; FP8: E4M3 weights with a scale per output channel; config.json names the scheme as
    compressed-tensors writes it. Group 128, the field's usual, is refused for SmolLM2's 576-wide inputs, the layer
    named."""
    p = quantize(smol_target, tmp_path / "g128", "--scheme", "w4a16")
    assert p.returncode != 0 and not (tmp_path / "g128").exists()
    assert "model.layers.0.mlp.gate_proj: input width 576 is not a multiple of the group size 128" in p.stderr

    w4 = tensors(quantized["w4a16"])
    q = "model.layers.3.self_attn.q_proj"
    assert w4[f"{q}.weight_packed"].get_dtype() == "I32" and w4[f"{q}.weight_packed"].get_shape() == [576, 576 // 8]
    assert w4[f"{q}.weight_scale"].get_shape() == [576, 576 // 64]
    assert w4["model.layers.3.mlp.down_proj.weight_packed"].get_shape() == [576, 1536 // 8]
    assert w4["model.embed_tokens.weight"].get_dtype() == "BF16" and f"{q}.weight" not in w4
    cfg = json.loads((quantized["w4a16"] / "config.json").read_text())["quantization_config"]
    assert (cfg["quant_method"], cfg["format"]) == ("compressed-tensors", "pack-quantized")
    w = cfg["config_groups"]["group_0"]["weights"]
    assert {k: w[k] for k in ("num_bits", "group_size", "strategy", "symmetric", "type")} == {
        "num_bits": 4, "group_size": 64, "strategy": "group", "symmetric": True, "type": "int"}

    fp8 = tensors(quantized["fp8"])
    assert fp8[f"{q}.weight"].get_dtype() == "F8_E4M3" and fp8[f"{q}.weight_scale"].get_shape() == [576, 1]
    dense = (smol_target / "model.safetensors").stat().st_size
    assert 0.40 < (quantized["w4a16"] / "model.safetensors").stat().st_size / dense < 0.45  # embeddings stay 16-bit
    assert 0.58 < (quantized["fp8"] / "model.safetensors").stat().st_size / dense < 0.63


@pytest.fixture(scope="module")
def kimi_int4(tmp_path_factory):
    """The tiny Kimi-shaped target (examples/targets/kimi_k25_shaped.py) quantized with Kimi-K2.5's scheme."""
    base = tmp_path_factory.mktemp("kimi")
    p = subprocess.run([sys.executable, str(REPO / "examples/targets/kimi_k25_shaped.py"), str(base / "dense"),
                        "--preset", "tiny", "--device", "cpu"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    p = quantize(base / "dense", base / "int4", "--scheme", "kimi-int4")
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.splitlines()[-1])["quantized_modules"] == 6 * 16 * 3  # 6 MoE layers x 16 experts
    return base / "int4"


@pytest.mark.slow  # the tiny Kimi-shaped target written and quantized (~40 s): make test, not make check
def test_the_kimi_scheme_quantizes_the_routed_experts_alone(kimi_int4):
    """Kimi-K2.5's scheme on the tiny Kimi-shaped target: every routed expert's three projections in INT4 (group 32),
    attention, the shared expert, the dense first layer and lm_head left in bf16; the ignore patterns written as Kimi's
    config.json has them (transformers matches them against its own module names)."""
    t = tensors(kimi_int4)
    layer = "language_model.model.layers.2."
    assert t[layer + "mlp.experts.5.gate_proj.weight_packed"].get_shape() == [64, 256 // 8]
    assert t[layer + "mlp.experts.5.down_proj.weight_scale"].get_shape() == [256, 64 // 32]
    for dense_name in ("self_attn.q_a_proj.weight", "mlp.shared_experts.up_proj.weight", "mlp.gate.weight"):
        assert t[layer + dense_name].get_dtype() == "BF16", dense_name
    assert t["language_model.model.layers.0.mlp.gate_proj.weight"].get_dtype() == "BF16"
    cfg = json.loads((kimi_int4 / "config.json").read_text())["quantization_config"]
    assert cfg["ignore"][:4] == quantization.KIMI_IGNORE


def test_describe_bytes_and_the_planning_refusal():
    """The scheme's short name from a config; Kimi-K2.5's plan counted from its quantization_config (INT4 routed
    experts, the rest bf16: about 595 GB, the size its checkpoint ships at, not 2 TB of bf16 nor 0.5 TB of INT4
    everywhere); a method no route here reads refused in one line naming it."""
    from eagle3build.compat.probes import inspect_target

    fp8 = {"quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {
        "group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                    "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}}, "ignore": ["lm_head"]}}
    assert quantization.describe(fp8)["scheme"] == ("compressed-tensors float-quantized W8A8 fp8 per-channel dynamic "
                                                   "activations")
    assert quantization.describe({"architectures": ["LlamaForCausalLM"]}) is None
    assert quantization.refusal(fp8, "target.path /m") is None
    why = quantization.refusal({"quantization_config": {"quant_method": "awq", "bits": 4}}, "target.path /m")
    assert why.startswith("target.path /m: config.json's quantization_config is 'awq 4-bit'; this build reads "
                          "compressed-tensors, fp8 checkpoints")

    t = inspect_target(str(KIMI_SHAPE))
    q = t["quantization"]
    assert q["scheme"] == "compressed-tensors pack-quantized W4A16 int4 g32" and q["weight_bytes_source"] == "config"
    assert 590e9 < q["weight_bytes"] < 600e9
    assert t["weight_bytes_per_parameter"] == pytest.approx(q["weight_bytes"] / t["parameters"])


def test_planning_refuses_a_scheme_no_route_reads(tmp_path):
    from test_plan import RES, config

    from eagle3build.workflow import plan

    cfg = json.loads((KIMI_SHAPE / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(plan.PlanError, match=r"config.json's quantization_config is 'gptq 4-bit'; this build reads"):
        plan.Plan.of(config(target={"path": str(tmp_path)}), RES)


def test_shards_and_given_heads_name_the_form_of_the_target():
    """A quantized target's shard says its scheme, a dense one's keeps its bytes (no key); a head trained on the dense
    form given to a quantized target warns, naming both forms; a head that says nothing of its form does not."""
    meta = ShardMeta("fp", [1, 2, 3], "bfloat16", 8, ["a"], "train", target_quantization="compressed-tensors x")
    assert ShardMeta.from_strings("s", meta.to_strings()).target_quantization == "compressed-tensors x"
    dense = ShardMeta("fp", [1, 2, 3], "bfloat16", 8, ["a"], "train")
    assert "target_quantization" not in dense.to_strings()
    assert ShardMeta.from_strings("s", dense.to_strings()).target_quantization is None


def test_served_form_warning(tmp_path):
    from eagle3build.compat.probes import ServedFormWarning, served_forms

    int4 = {"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {
        "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                                        "group_size": 64}}}}}
    (tmp_path / "head_meta.json").write_text(json.dumps({"target_fingerprint": "x"}))
    with pytest.warns(ServedFormWarning, match="trained on the target's dense form and is served on its "
                                               "compressed-tensors pack-quantized W4A16 int4 g64 form"):
        assert served_forms(str(tmp_path), int4) == {"trained_on": "dense",
                                                     "served_on": "compressed-tensors pack-quantized W4A16 int4 g64"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert served_forms(str(tmp_path), {})["served_on"] == "dense"
        assert served_forms(str(tmp_path / "elsewhere"), int4)["trained_on"] is None


@pytest.mark.vllm
@pytest.mark.parametrize("which", ["w4a16", "kimi-int4"])
def test_int4_targets_are_refused_here_with_the_evidence(which, request, tmp_path):
    """W4A16 SmolLM2 and Kimi-K2.5's INT4 experts: transformers loads each (probe hooks_quantized_load), this CPU's vLLM
    cannot (its probe on a model quantized the same way: no float32 WNA16 kernel); the report refuses, naming the
    scheme and vLLM's error."""
    from eagle3build.compat import compat_report as cr
    from eagle3build.compat.compat_render import render_markdown

    target = request.getfixturevalue("quantized")["w4a16"] if which == "w4a16" else request.getfixturevalue("kimi_int4")
    scheme = {"w4a16": "compressed-tensors pack-quantized W4A16 int4 g64",
              "kimi-int4": "compressed-tensors pack-quantized W4A16 int4 g32"}[which]
    r = cr.build_report(cr.CompatSettings(target_dir=str(target), results_dir=str(tmp_path / "r")))
    assert r["capture"]["quantized_routes"]["hooks"]["status"] == "ok"
    assert r["capture"]["quantized_routes"]["vllm"]["status"] == "fail"
    assert r["hard_failures"] == ["quantized_serving"]
    with pytest.raises(cr.CompatError) as e:
        cr.write(r, str(tmp_path / "compat.json"))
    line = str(e.value)
    assert line.startswith(f"quantized_serving: ValueError: target quantized as '{scheme}': this vLLM cannot serve it")
    assert "cpu_gemm_wna16" in line and "\n" not in line and not (tmp_path / "compat.json").exists()
    md = render_markdown(r)
    assert f"- scheme: **{scheme}**" in md and "- hooks route: **loads it**" in md and "- vllm route: **fail**" in md


@pytest.mark.e2e
def test_an_fp8_target_builds_end_to_end(smol_target, quantized, tmp_path):
    """The reduced build over SmolLM2 in FP8: the compat report names the scheme and the route it picked, the shards,
    the checkpoint and the head say which form of the target they came from, the benchmark is lossless against that same
    FP8 target, and the serving files start it as it is (its folder, quantized)."""
    wd = tmp_path / "wd"
    wd.mkdir()
    cfg = write_config(tmp_path / "fp8.yaml", run="fp8", target={"path": str(quantized["fp8"]), "serve_dtype": "float32"},
                       data={"sources": [{"path": "bundled:sharegpt", "max_samples": 24}], "max_seq_len": 96,
                             "min_supervised_tokens": 8, "eval_fraction": 0.25},
                       capture={"num_train_samples": 8, "num_eval_samples": 2, "samples_per_shard": 8,
                                "tokens_per_batch": 1024, "compute_dtype": "auto"},
                       vocab={"draft_vocab_size": 1024},
                       train={"epochs": 1, "total_seq_len": 256, "ttt_steps": 2},
                       export={"vllm_load_check": "never"},
                       benchmark={"ks": [2], "sets": ["chat"], "num_prompts": 2, "max_tokens": 16,
                                  "max_model_len": 256, "concurrency": 1})
    p = run(["--configfile", str(cfg)], wd, timeout=2400)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    res = wd / "results/fp8"
    scheme = "compressed-tensors float-quantized W8A8 fp8 per-channel dynamic activations"
    compat = json.loads((res / "compat.json").read_text())
    assert compat["target"]["quantization"]["scheme"] == scheme
    assert compat["capture"]["quantized_routes"]["hooks"]["status"] == "ok"
    assert compat["capture"]["quantized_routes"]["vllm"]["status"] in ("ok", "warn")
    md = (res / "compat.md").read_text()
    assert f"- scheme: **{scheme}**" in md and "- backend: **hooks**" in md and "- hooks route: **loads it**" in md
    shard = next((res / "hidden_states/train").glob("*.safetensors"))
    with safe_open(str(shard), "pt") as f:
        assert f.metadata()["target_quantization"] == scheme
    assert json.loads((res / "checkpoint/train_meta.json").read_text())["target_quantization"] == scheme
    assert json.loads((res / "head/head_meta.json").read_text())["target_quantization"] == scheme
    bench = json.loads((res / "benchmark.json").read_text())
    assert bench["runs"] and all(r["lossless"] for r in bench["runs"])
    serving = json.loads((res / "serve/serving.json").read_text())
    assert serving["target"] == str(quantized["fp8"]) and serving["target_quantization"] == scheme
    assert torch.tensor(bench["runs"][0]["mean_acceptance_length"]) >= 1.0


def test_quantized_serving_decides_from_the_smoke_on_this_platform():
    """vLLM must serve a compressed-tensors scheme where the serving platform is this host: a failed smoke on a model
    quantized the same way refuses it in one line; a scheme compressed-tensors cannot make (``fp8``) and a platform
    elsewhere (a CPU planning an 8-card run) pass with the reason, as a host without vLLM does."""
    from eagle3build.compat import compat_report as cr
    from eagle3build.compat.probes import Probe

    ct = {"method": "compressed-tensors", "scheme": "compressed-tensors pack-quantized W4A16 int4 g64"}
    failed = {"vllm": Probe(name="vllm"), "vllm_capture_smoke": Probe(name="vllm_capture_smoke", status="fail",
                                                                     error="RuntimeError: no kernel\nits trace")}
    with pytest.raises(ValueError, match=r"^target quantized as 'compressed-tensors pack-quantized W4A16 int4 g64': "
                                         r"this vLLM cannot serve it \(RuntimeError: no kernel\); the benchmark"):
        cr.check_quantized_serving(ct, failed)
    assert cr.check_quantized_serving(ct, failed, "serving on 8 GPU(s); this host has none")["vllm"].startswith(
        "not probed: serving on 8 GPU(s)")
    assert "stays dense for method fp8" in cr.check_quantized_serving({"method": "fp8", "scheme": "fp8"}, failed)["vllm"]
    no_vllm = {"vllm": Probe(name="vllm", status="fail", error="ImportError")}
    assert cr.check_quantized_serving(ct, no_vllm)["vllm"].startswith("not importable here")


def test_the_hooks_route_is_not_loaded_where_its_dense_form_cannot_fit(tmp_path):
    """The hooks route's probe loads the target itself, and transformers decompresses it. It is not run for a
    config-only folder, a large target, or a target whose dense form would take more than half this host's memory
    (a 50B-parameter W4A16 checkpoint: 25 GB on disk, 100 GB in bf16, capture.compute_dtype's default, on this 24 GiB
    machine). Each gets a reason."""
    from eagle3build.compat import compat_report as cr

    s = cr.CompatSettings(target_dir=str(tmp_path), results_dir=str(tmp_path / "r"))
    q = {"weight_bytes_source": "files"}
    probes, why = cr.quantized_load_probes(s, {"parameters": 50e9, "weight_bytes_per_parameter": 0.5,
                                               "quantization": q}, None)
    assert probes == {} and why.startswith("its dense form (100.0 GB) would take more than half of this host's free")
    assert cr.quantized_load_probes(s, {"parameters": 1e12, "weight_bytes_per_parameter": 0.58, "quantization": q},
                                    None)[1] == "a large target (580 GB): vLLM captures it"
    assert cr.quantized_load_probes(s, {"parameters": 1e9, "weight_bytes_per_parameter": 0.5,
                                        "quantization": {"weight_bytes_source": "config"}}, None)[1] == (
        "no weight files (a config-only folder)")
    assert cr.quantized_routes({}, why)["hooks"] == {"status": "not run", "error": why}
