"""draft.method peagle and dflash: speculators' P-EAGLE and DFlash models trained a few steps through this
project's trainer on the tiny target's captured shards (tests/conftest.py: tiny_target, tiny_shards)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import fake_engines
from safetensors import safe_open

from eagle3build.draft.choice import DraftError, resolve
from eagle3build.draft.head_format import Head
from eagle3build.serve import export_head as ex
from eagle3build.train import train_draft as td


def _train(tiny_shards, tiny_target, method, out_name, options=None, **kw):
    """``method``'s head trained 3 steps (``options``: its ``draft.<method>`` knobs, as the config's section: train's
    ``draft`` argument is the JSON-able section torchrun's ranks get)."""
    d, _, _ = tiny_shards
    out = d / out_name
    m = td.train(target_dir=str(tiny_target), train_shards=[str(d / "train-shard.safetensors")],
                 eval_shards=[str(d / "eval-shard.safetensors")], d2t_path=str(d / "d2t.npy"),
                 t2d_path=str(d / "t2d.npy"), vocab_json=str(d / "vocab.json"),
                 decisions_json=str(d / "decisions.json"), out_dir=str(out), epochs=1, max_steps=3, lr=3e-3,
                 total_seq_len=128, seed=0, device="cpu", checkpoint_every=0,
                 draft={"method": method, **({method: options} if options else {})}, **kw)
    return out, m


@pytest.fixture(scope="module")
def trained(tiny_shards, tiny_target):
    """Each method's checkpoint, 3 steps on the fixture's shards: ``{method: (dir, metrics)}``."""
    return {m: _train(tiny_shards, tiny_target, m, f"ck-{m}") for m in ("peagle", "dflash")}


@pytest.mark.parametrize("method,depths", [("peagle", 8), ("dflash", 7)])
def test_method_trains_with_speculators_model(trained, method, depths):
    out, m = trained[method]
    cfg = json.loads((out / "config.json").read_text())
    meta = json.loads((out / "train_meta.json").read_text())
    assert cfg["speculators_model_type"] == method and meta["method"] == method
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == depths
    # the tokenizer (SmolLM2's) has no mask token and no spare embedding row: speculators falls back to pad (2)
    assert cfg["mask_token_id"] == 2
    assert m["steps"] == 3 and all(h["loss"] > 0 for h in m["train_history"])
    ev = m["final_eval"]
    # per-position accuracies of the drafted positions: P-EAGLE depths 0..7, DFlash block slots 1..7
    assert len(ev["full_acc_per_step"]) == depths and all(0.0 <= a <= 1.0 for a in ev["full_acc_per_step"])
    assert 1.0 <= ev["simulated_acceptance_length"] <= 1.0 + depths
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert shapes["fc.weight"] == (64, 3 * 64) and shapes["d2t"] == (256,)
    if method == "peagle":
        assert shapes["mask_hidden"] == (1, 1, 192) and shapes["embed_tokens.weight"] == (49152, 64)
        # eagle3.1's flags (the fixture's decisions) less the two vLLM's P-EAGLE parser drops and norm_before_fc
        # (vLLM 0.26's parallel-drafting load runs its CUDA rms_norm on a 1-D tensor: eagle3build/draft/peagle.py)
        assert {k: cfg[k] for k in meta["head_flags"]} == meta["head_flags"] == {
            "norm_before_residual": True, "norm_before_fc": False, "norm_output": False, "fc_norm": False}
        assert "input_norm.weight" not in shapes
        assert shapes["layers.0.self_attn.q_proj.weight"] == (64, 128)  # [embed, hidden]: 2H in
    else:
        assert "embed_tokens.weight" not in shapes and "mask_hidden" not in shapes
        assert sum(k.endswith("self_attn.q_proj.weight") for k in shapes) == 5  # 5 qwen3 layers
        assert cfg["sliding_window_non_causal"] is True and cfg["sample_from_anchor"] is False


def test_method_options_reach_speculators_model(tiny_shards, tiny_target):
    """draft.peagle.num_depths and draft.dflash.block_size / num_layers replace speculators' defaults in the
    model, its trainer kwargs and the saved config; an option of another method is refused by name."""
    out, m = _train(tiny_shards, tiny_target, "dflash", "ck-dflash-4", options={"block_size": 4, "num_layers": 2})
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["block_size"] == 4 and cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert sum(k.endswith("self_attn.q_proj.weight") for k in f.keys()) == 2
    assert len(m["final_eval"]["full_acc_per_step"]) == 3  # block slots 1..3
    assert Head.read(out).trained_positions == 3  # what the benchmark warns about at a larger k
    assert dict(resolve({"method": "peagle", "peagle": {"num_depths": 4}}).options) == {"num_depths": 4}
    assert dict(resolve({"method": "dflash"}).options) == {"block_size": 8, "num_layers": 5}
    assert resolve({"method": "peagle", "peagle": {"num_depths": 4}}).spec()["args"]["num_depths"] == 4
    assert resolve().trainer_kwargs(3, 1.0, "eager")["ttt_steps"] == 3
    with pytest.raises(DraftError, match=r"config: draft.peagle: \['block_size'\] are not options of peagle"):
        resolve({"method": "peagle", "peagle": {"block_size": 4}})


def test_summarise_per_position_methods():
    """P-EAGLE's marginal per-position accuracies 0.8, 0.5 give tau 1 + 0.8 + 0.8*0.5 = 2.2 (approximate);
    DFlash's expected accepted length is its own ratio eal_sum / eal_total."""
    from eagle3build.train.train_metrics import summarise

    acc = {"loss_sum": 6.0, "loss_total": 2.0, "position_0_acc_sum": 8.0, "position_0_acc_total": 10.0,
           "position_1_acc_sum": 4.0, "position_1_acc_total": 8.0}
    s = summarise(acc, 1)
    assert s["loss"] == 3.0 and s["full_acc_per_step"] == [0.8, 0.5]
    assert s["simulated_acceptance_length"] == pytest.approx(2.2)
    acc = {"loss_sum": 1.0, "loss_total": 1.0, "position_1_acc_sum": 3.0, "position_1_acc_total": 4.0,
           "eal_sum": 7.0, "eal_total": 4.0}
    assert summarise(acc, 1)["simulated_acceptance_length"] == 1.75


def test_compare_methods_heads_and_their_rules_entries():
    """draft.compare_methods: the benchmark's compared heads under results/<run>/methods/, in the listed order; the
    rules derived from train_draft and export_head run those stages' entries."""
    from eagle3build.formats.benchmark_runs import method_heads
    from eagle3build.workflow import contract

    assert method_heads("results/r", "eagle3", ["dflash", "peagle"], [{"name": "other", "path": "x"}]) == [
        {"name": "dflash", "path": "results/r/methods/dflash/head"},
        {"name": "peagle", "path": "results/r/methods/peagle/head"}]
    assert method_heads("results/r", "eagle3", [], []) == []
    with pytest.raises(ValueError, match=r"not draft.method \('peagle'\)"):
        method_heads("results/r", "peagle", ["peagle"], [])
    with pytest.raises(ValueError, match="each once"):
        method_heads("results/r", "eagle3", ["dflash", "dflash"], [])
    with pytest.raises(ValueError, match=r"both name \['peagle'\]"):
        method_heads("results/r", "eagle3", ["peagle"], [{"name": "peagle", "path": "x"}])
    with pytest.raises(ValueError, match=r"lists \['results/r/methods/dflash/head'\], a head of draft.compare_methods"):
        method_heads("results/r", "eagle3", ["dflash"], [{"name": "d", "path": "results/r/methods/dflash/head/"}])
    assert contract.stage_of("train_draft_method") == "train_draft" and contract.stage_of("benchmark") == "benchmark"
    assert contract.entry("train_draft_method") == contract.CONTRACTS["train_draft"].entry
    assert contract.entry("export_head_method") == contract.CONTRACTS["export_head"].entry
    with pytest.raises(KeyError, match="has no entry"):
        contract.entry("benchmark_method")


def test_unknown_method_is_refused(tmp_path):
    with pytest.raises(DraftError, match="config: draft.method 'dflash2' is not one of"):
        resolve({"method": "dflash2"})
    (tmp_path / "config.json").write_text('{"speculators_model_type": "dflash2"}')
    with pytest.raises(ValueError, match=r"config.json: draft.method 'dflash2' is not one of"):
        Head.read(tmp_path)


@pytest.mark.parametrize("method", ["peagle", "dflash"])
def test_export_writes_and_reloads_each_method(tiny_shards, tiny_target, trained, method, tmp_path):
    """Export checks the method's tensor set (head_format.expected_shapes), reloads the head with the method's
    speculators class (tensor for tensor) and would load-check it in vLLM with the method's speculative_config."""
    d, _, _ = tiny_shards
    ck, _ = trained[method]
    head = tmp_path / "head"
    meta = ex.export(ex.ExportSettings(checkpoint_dir=ck, d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"),
                                       vocab_json=str(d / "vocab.json"), out_dir=head, served_name="org/tiny-llama",
                                       target_dir=str(tiny_target), vllm_load_check="never"))
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["speculators_model_type"] == method and meta["method"] == method
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "org/tiny-llama"
    with safe_open(str(head / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
    if method == "peagle":
        # no input_norm.weight: P-EAGLE heads are built without norm_before_fc (its flags: eagle3build/draft/peagle.py)
        assert "mask_hidden" in names and "embed_tokens.weight" in names and "input_norm.weight" not in names
        assert len(names) == 17
        assert cfg["transformer_layer_config"]["num_aux_hidden_states"] == 3
        h = Head.read(head)
        assert h.speculative_config(3) == {"method": "eagle3", "parallel_drafting": True, "model": str(head),
                                           "num_speculative_tokens": 3}
        assert h.trained_positions == 8  # num_depths
        assert h.kv_layers == 1
        assert h.draft_layer == "llama"  # what benchmark.json names the head's layer
        assert h.aux_layer_ids == (1, 3, 4) and h.method.name == "peagle"
    else:
        assert "embed_tokens.weight" not in names and len(names) == 6 + 5 * 11
        assert cfg["aux_hidden_state_layer_ids"] == [1, 3, 4]
        h = Head.read(head)
        assert h.speculative_config(3) == {"method": "dflash", "model": str(head), "num_speculative_tokens": 3}
        assert h.kv_layers == 5
        assert h.draft_layer == "qwen3"  # speculators' DFlash layers (its arch: eagle3build/draft/dflash.py)
        assert h.aux_layer_ids == (1, 3, 4) and h.trained_positions == 7


def test_export_refuses_a_dflash_head_vllm_would_serve_causal(tiny_shards, tiny_target, trained, tmp_path):
    d, _, _ = tiny_shards
    ck = tmp_path / "ck"
    shutil.copytree(trained["dflash"][0], ck)
    cfg = json.loads((ck / "config.json").read_text())
    cfg["sliding_window_non_causal"] = False
    (ck / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ex.ExportError, match="ck/config.json: a DFlash head must have sliding_window_non_causal true"):
        ex.export(ex.ExportSettings(checkpoint_dir=ck, d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"),
                                    vocab_json=str(d / "vocab.json"), out_dir=tmp_path / "head", served_name="org/t",
                                    target_dir=str(tiny_target), vllm_load_check="never"))
    assert not (tmp_path / "head").exists()


def test_export_refuses_a_method_other_than_trained(tiny_shards, tiny_target, trained, tmp_path):
    d, _, _ = tiny_shards
    ck = tmp_path / "ck"
    shutil.copytree(trained["peagle"][0], ck)
    meta = json.loads((ck / "train_meta.json").read_text())
    del meta["method"]
    (ck / "train_meta.json").write_text(json.dumps(meta))
    with pytest.raises(ex.ExportError, match="config.json is a peagle head but train_meta.json says eagle3"):
        ex.export(ex.ExportSettings(checkpoint_dir=ck, d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"),
                                    vocab_json=str(d / "vocab.json"), out_dir=tmp_path / "head", served_name="org/t",
                                    target_dir=str(tiny_target), vllm_load_check="never"))


def test_method_replans_training_and_what_follows_never_capture():
    """draft.method is part of train_draft's ``train`` param only where it is not the default (config.key.Key
    ``quiet_default``: builds made before the key keep their params); no capture or earlier stage reads it."""
    import copy

    import yaml
    from smk import REPO

    from eagle3build.workflow.contract import CONTRACTS, PlanContext, param_value

    base = yaml.safe_load((REPO / "config.yaml").read_text())
    other = copy.deepcopy(base)
    other["draft"]["method"] = "dflash"

    def params(cfg, stage):
        return {p.name: param_value(p, cfg, PlanContext(stage)) for p in CONTRACTS[stage].params if p.name != "version"}

    train_default, train_dflash = params(base, "train_draft")["train"], params(other, "train_draft")["train"]
    assert "method" not in train_default and train_dflash == {**train_default, "method": "dflash"}
    # a method's knobs join the param only once set away from speculators' defaults
    assert not {"peagle_num_depths", "dflash_block_size", "dflash_num_layers"} & set(train_default)
    other["draft"]["dflash"]["block_size"] = 4
    assert params(other, "train_draft")["train"] == {**train_default, "method": "dflash", "dflash_block_size": 4}
    for stage in CONTRACTS:
        if stage != "train_draft":
            assert "draft.method" not in CONTRACTS[stage].triggers, stage
            assert params(base, stage) == params(other, stage), stage


def test_method_options_join_the_state_key_only_away_from_defaults(tiny_shards, tiny_target, tmp_path):
    """A saved training state keys on the method's knobs only where they differ from speculators' defaults: a
    state saved before the knobs were config keys resumes; one saved with other knobs does not."""
    d, _, _ = tiny_shards
    inputs = td.TrainInputs(str(tiny_target), [str(d / "train-shard.safetensors")], [str(d / "eval-shard.safetensors")],
                            str(d / "d2t.npy"), str(d / "t2d.npy"), str(d / "vocab.json"), str(d / "decisions.json"),
                            str(tmp_path / "ck"), None)
    cfg = td.TrainConfig(epochs=1, max_steps=1, total_seq_len=128, seed=0, checkpoint_every=0)

    def key(options):
        return td.setup(cfg, inputs, "cpu", None, False, resolve({"method": "dflash", "dflash": options})).key

    assert key(None) == key({"block_size": 8, "num_layers": 5}) != key({"block_size": 4, "num_layers": 5})


@pytest.mark.parametrize("method,norm_before_fc,hinted", [("peagle", True, True), ("peagle", False, False),
                                                          ("eagle3", True, False)])
def test_load_check_failure_names_a_stale_peagle_head(tmp_path, monkeypatch, method, norm_before_fc, hinted):
    """A P-EAGLE head trained with norm_before_fc (before its flags turned it off) that vLLM fails to serve gets the
    cause and the retrain command in the export's error (``DraftMethod.load_hint``); other heads get vLLM's error
    alone."""
    from eagle3build.serve import export_head as ex

    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"speculators_model_type": method, "norm_before_fc": norm_before_fc,
                                                  "transformer_layer_config": {"num_hidden_layers": 1},
                                                  "speculators_config": {"proposal_methods": [
                                                      {"speculative_tokens": 8}]}}))

    def fail(*a, **kw):
        raise RuntimeError("Engine core initialization failed")

    fake_engines(monkeypatch, fail)
    with pytest.raises(ex.ExportError, match="Engine core initialization failed") as e:
        ex.check_loads_with_vllm(Head.read(head), str(tmp_path / "target"), "t", gpus=0)
    assert ("snakemake --forcerun train_draft" in str(e.value)) is hinted
    assert ("norm_before_fc" in str(e.value)) is hinted
