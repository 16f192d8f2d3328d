"""A head the user brings (issue 72), without a build: a folder read and checked without torch
(eagle3build.draft.given_head: speculators' and the EAGLE repo's formats), the planning policy's refusals in one line
(eagle3build.workflow.plan: check_given_head, check_init_from), and what `snakemake -n` plans with `draft.head`: no
capture, vocab map or training. The builds with a given head (τ and outputs as the original run's, the EAGLE route
through speculators' converter, a fine-tune from it): tests/test_given_head_e2e.py."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file
from smk import REPO, planned_jobs, run, write_config

from eagle3build.draft import given_head
from eagle3build.draft.head_format import Head
from eagle3build.workflow import plan

CONFIG = yaml.safe_load((REPO / "config.yaml").read_text())
LAYER = {"hidden_size": 64, "vocab_size": 512, "num_hidden_layers": 1, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "model_type": "llama",
         "rms_norm_eps": 1e-5, "max_position_embeddings": 1024}
TARGET = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "vocab_size": 512,
          "num_hidden_layers": 8}
FLAGS = {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True, "fc_norm": False}


def _arrays(shapes: dict, draft: int = 32, vocab: int = 512) -> dict:
    out = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    out["d2t"] = np.arange(draft, dtype=np.int64)  # draft id i -> target id 2i
    t2d = np.zeros(vocab, bool)
    t2d[np.arange(draft) * 2] = True
    out["t2d"] = t2d
    return out


def speculators_head(folder: Path, drop: tuple[str, ...] = (), **over) -> Path:
    """A speculators-format EAGLE-3 head of LAYER for TARGET (zeros; d2t/t2d consistent), ``over`` set in its
    config.json (``transformer_layer_config`` merged), ``drop``: tensors left out."""
    cfg = {"speculators_model_type": "eagle3", "draft_vocab_size": 32, "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
           **FLAGS, "speculators_config": {"algorithm": "eagle3", "verifier": {
               "architectures": ["LlamaForCausalLM"], "name_or_path": "org/target"}},
           "transformer_layer_config": dict(LAYER)}
    cfg["transformer_layer_config"].update(over.pop("transformer_layer_config", {}))
    cfg.update(over)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    shapes = Head.of(folder, cfg).expected_shapes()
    arrays = _arrays(shapes, vocab=cfg["transformer_layer_config"]["vocab_size"])
    save_file({k: v for k, v in arrays.items() if k not in drop}, str(folder / "model.safetensors"))
    return folder


def eagle_head(folder: Path, **over) -> Path:
    """The EAGLE repo's EAGLE-3 format of the same head: a Llama config, ``midlayer.`` tensors."""
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], **{k: v for k, v in LAYER.items()}, "draft_vocab_size": 32,
           "torch_dtype": "float32", **over}
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    shapes = {k.replace("layers.0.", "midlayer."): s for k, s in Head.of(folder, given_head.shape_config({
        "speculators_model_type": "eagle3", "draft_vocab_size": 32, "transformer_layer_config": {**LAYER, **{
            k: v for k, v in over.items() if k in LAYER}}})).expected_shapes().items() if k != "input_norm.weight"}
    save_file(_arrays(shapes, vocab=cfg["vocab_size"]), str(folder / "model.safetensors"))
    return folder


@pytest.fixture
def target(tmp_path) -> Path:
    t = tmp_path / "target"
    t.mkdir()
    (t / "config.json").write_text(json.dumps(TARGET))
    (t / "model.safetensors").write_bytes(b"")
    return t


def config(target: Path, **sections) -> dict:
    cfg = copy.deepcopy(CONFIG)
    cfg["target"]["path"] = str(target)
    for name, values in sections.items():
        cfg[name].update(values)
    return cfg


def test_both_formats_are_read_without_torch(tmp_path):
    s = given_head.read(speculators_head(tmp_path / "s"))
    assert (s.format, s.method, s.layer, s.hidden_size, s.vocab_size, s.draft_vocab_size) == (
        "speculators", "eagle3", "llama", 64, 512, 32)
    assert s.aux_layer_ids == (2, 4, 5) and s.verifier_architectures == ("LlamaForCausalLM",)
    assert s.files == [str(tmp_path / "s/config.json"), str(tmp_path / "s/model.safetensors")]
    assert s.shapes["fc.weight"] == (64, 192) and "taken as it is" in s.described
    e = given_head.read(eagle_head(tmp_path / "e"), "train.init_from")
    assert (e.format, e.method, e.layer, e.hidden_size, e.vocab_size, e.draft_vocab_size, e.key) == (
        "eagle", "eagle3", "llama", 64, 512, 32, "train.init_from")
    assert e.aux_layer_ids is None and e.aux_ids_for(8) == [2, 4, 5]  # none named: EAGLE-3's default of the target
    assert "speculators' converter" in e.described
    named = given_head.read(eagle_head(tmp_path / "n", eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 6]}))
    assert named.aux_ids_for(8) == [1, 3, 6]  # SpecForge names them in eagle_config


def test_a_folder_that_is_no_head_is_named_with_what_it_lacks(tmp_path):
    def why(folder) -> str:
        with pytest.raises(given_head.GivenHeadError) as e:
            given_head.read(folder)
        return str(e.value)

    assert why(tmp_path / "nowhere") == f"draft.head {tmp_path}/nowhere: no such folder"
    (tmp_path / "empty").mkdir()
    assert why(tmp_path / "empty") == f"draft.head {tmp_path}/empty is no head: it has no config.json"
    (tmp_path / "empty/config.json").write_text(json.dumps(TARGET))
    assert "has no model.safetensors or pytorch_model.bin" in why(tmp_path / "empty")
    (tmp_path / "empty/model.safetensors").write_bytes(b"")
    assert "names neither speculators_model_type (speculators' format) nor an EAGLE-3 architecture" in why(
        tmp_path / "empty")
    assert why(speculators_head(tmp_path / "s", drop=("d2t", "fc.weight"))) == (
        f"draft.head {tmp_path}/s is no head: model.safetensors lacks fc.weight, d2t")
    speculators_head(tmp_path / "noembed", drop=("embed_tokens.weight",))  # optional: vLLM shares the target's
    assert given_head.read(tmp_path / "noembed").shapes.get("embed_tokens.weight") is None
    bad = speculators_head(tmp_path / "shape", transformer_layer_config={"intermediate_size": 96})
    (bad / "config.json").write_text(json.dumps({**json.loads((bad / "config.json").read_text()),
                                                 "transformer_layer_config": LAYER}))
    assert "layers.0.mlp.gate_proj.weight (96, 64) (expected (128, 64))" in why(bad)


def test_a_head_for_another_target_names_both_values_and_their_files(tmp_path, target):
    name = f"target.path {target}"
    head = given_head.read(speculators_head(tmp_path / "h"))
    assert given_head.target_problem(head, TARGET, name) is None
    assert given_head.target_problem(head, {**TARGET, "hidden_size": 2048}, name) == (
        f"draft.head {tmp_path}/h is a head for another target: its hidden size 64 ({tmp_path}/h/config.json "
        f"transformer_layer_config.hidden_size) is not the target's 2048 ({name}: config.json hidden_size)")
    assert "its vocabulary 512 (" in given_head.target_problem(head, {**TARGET, "vocab_size": 151936}, name)
    assert given_head.target_problem(head, {**TARGET, "architectures": ["Qwen3ForCausalLM"]}, name) == (
        f"draft.head {tmp_path}/h is a head for another target: its verifier is a LlamaForCausalLM ({tmp_path}/h/"
        f"config.json speculators_config.verifier.architectures), the target a Qwen3ForCausalLM ({name}: config.json "
        "architectures)")
    assert "[5] out of range [0, 4] for a 5-layer target" in given_head.target_problem(
        head, {**TARGET, "num_hidden_layers": 5}, name)
    eagle = given_head.read(eagle_head(tmp_path / "e", vocab_size=1024))
    assert f"its vocabulary 1024 ({tmp_path}/e/config.json vocab_size)" in given_head.target_problem(eagle, TARGET, name)
    assert given_head.draft_problem(head, "peagle", "llama") == (
        f"draft.head {tmp_path}/h is a eagle3 head ({tmp_path}/h/config.json) but draft.method is peagle: set "
        "draft.method: eagle3")


def test_draft_head_is_refused_beside_what_it_makes_meaningless(tmp_path, target):
    h = str(speculators_head(tmp_path / "h"))
    ok = plan.check_given_head(config(target, draft={"head": h}), "results/default", TARGET)
    assert ok.path == Path(h) and ok.format == "speculators"
    assert plan.check_given_head(config(target), "results/default", TARGET) is None
    with pytest.raises(plan.PlanError) as e:
        plan.check_given_head(config(target, draft={"head": h, "compare_methods": ["peagle"]},
                                     train={"epochs": 3, "lr": 0.01}), "results/default", TARGET)
    assert str(e.value) == (f"config: draft.head {h} is benchmarked and served as it is, no head is trained: "
                            "draft.compare_methods=['peagle'], train.epochs=3, train.lr=0.01 would not apply; leave "
                            "them out")
    with pytest.raises(plan.PlanError, match="is the run's own head folder"):
        plan.check_given_head(config(target, draft={"head": "results/default/head/"}), "results/default", TARGET)
    with pytest.raises(plan.PlanError, match="is a head for another target: its hidden size 64"):
        plan.check_given_head(config(target, draft={"head": h}), "results/default", {**TARGET, "hidden_size": 4096})
    with pytest.raises(plan.PlanError, match="is a eagle3 head .* but draft.method is dflash"):
        plan.check_given_head(config(target, draft={"head": h, "method": "dflash"}), "results/default", TARGET)


def test_init_from_is_checked_against_what_training_makes(tmp_path, target):
    h = str(speculators_head(tmp_path / "h"))
    vocab = {"draft_vocab_size": 32}
    cfg = config(target, train={"init_from": h}, vocab=vocab)
    assert plan.check_init_from(cfg, TARGET).format == "speculators"
    for sections, why in (
        ({"capture": {"aux_layer_ids": [1, 4, 6]}}, f"train.init_from {h} reads aux layers [2, 4, 5] ({h}/config.json) "
         "but capture.aux_layer_ids [1, 4, 6] captures [1, 4, 6]: set capture.aux_layer_ids: [2, 4, 5]"),
        ({"vocab": {"draft_vocab_size": 2048}}, f"train.init_from {h} has a draft vocabulary of 32 tokens ({h}/"
         "config.json draft_vocab_size) but vocab.draft_vocab_size is 2048: set it to 32"),
        ({"train": {"head_variant": "eagle3"}}, "but train.head_variant eagle3 sets"),
        ({"draft": {"compare_methods": ["dflash"]}}, "beside draft.compare_methods ['dflash']"),
    ):
        bad = copy.deepcopy(cfg)
        for k, v in sections.items():
            bad[k].update(v)
        with pytest.raises(plan.PlanError) as e:
            plan.check_init_from(bad, TARGET)
        assert why in str(e.value)
    with pytest.raises(plan.PlanError, match=r"^config: train.init_from results/default/head is inside the run's results "
                                             r"folder results/default, which this training makes"):
        plan.check_init_from(config(target, train={"init_from": "results/default/head"}, vocab=vocab), TARGET,
                             res="results/default")
    other = str(eagle_head(tmp_path / "e", hidden_size=128))
    with pytest.raises(plan.PlanError, match=r"train.init_from .* is no head|is a head for another target"):
        plan.check_init_from(config(target, train={"init_from": other}, vocab=vocab), TARGET)


def test_a_run_with_draft_head_plans_no_capture_vocab_map_or_training(tmp_path):
    """`snakemake -n` with draft.head: the compat report (the head's config.json its input), the data (the benchmark's
    prompts), export (the head's files its inputs), the benchmark and what follows; no capture, vocab map or training.
    A head for another target, or beside train keys, stops the plan in one line."""
    h = speculators_head(tmp_path / "h", transformer_layer_config={"hidden_size": 576, "vocab_size": 49152})
    cfg = write_config(tmp_path / "c.yaml", draft={"head": str(h)})
    assert planned_jobs(["--configfile", str(cfg)], tmp_path) == {
        "materialize_target": 1, "compat_report": 1, "compat_markdown": 1, "prepare_data": 1, "export_head": 1,
        "benchmark": 1, "plot_benchmark": 1, "serve_config": 1, "all": 1}
    p = run(["-n", "--configfile", str(cfg)], tmp_path)
    export = p.stdout.split("rule export_head:", 1)[1].split("\n\n", 1)[0]
    assert f"{h}/config.json, {h}/model.safetensors" in export and "checkpoint" not in export
    bad = write_config(tmp_path / "bad.yaml", draft={"head": str(h)}, train={"epochs": 4})
    p = run(["-n", "--configfile", str(bad)], tmp_path)
    assert p.returncode != 0 and f"config: draft.head {h} is benchmarked and served as it is, no head is trained: " \
                                 "train.epochs=4 would not apply; leave them out" in p.stdout + p.stderr
    init = write_config(tmp_path / "init.yaml", train={"init_from": str(h)}, vocab={"draft_vocab_size": 32})
    jobs = planned_jobs(["--configfile", str(init)], tmp_path)
    assert jobs["train_draft"] == 1 and jobs["build_vocab_map"] == 1 and jobs["capture_hidden_states"] == 3
    p = run(["-n", "results/default/checkpoint/config.json", "--configfile", str(init)], tmp_path)
    assert f"{h}/config.json, {h}/model.safetensors" in p.stdout.split("rule train_draft:", 1)[1].split("\n\n")[0]


@pytest.mark.parametrize("route", ["speculators", "eagle"])
def test_a_head_for_another_target_stops_the_plan_in_one_line(tmp_path, target, route):
    """A head of hidden size 64 beside a target of 96 (``target.path``): `snakemake -n` stops before any job, naming
    both hidden sizes and the file each came from."""
    (target / "config.json").write_text(json.dumps({**TARGET, "hidden_size": 96}))
    h = speculators_head(tmp_path / "h") if route == "speculators" else eagle_head(tmp_path / "h")
    cfg = write_config(tmp_path / "c.yaml", target={"path": str(target)}, draft={"head": str(h)})
    p = run(["-n", "--configfile", str(cfg)], tmp_path)
    field = "transformer_layer_config.hidden_size" if route == "speculators" else "hidden_size"
    assert p.returncode != 0 and (f"draft.head {h} is a head for another target: its hidden size 64 ({h}/config.json "
                                  f"{field}) is not the target's 96 (target.path {target}: config.json hidden_size)"
                                  ) in p.stdout + p.stderr
