"""compat_report on config-only targets of several families, inspected on the meta device (no weights)."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import jsonschema
import pytest
import torch

from eagle3build.compat import compat_report as cr
from eagle3build.draft.methods import EAGLE3
from eagle3build.target import find_decoder_layers

REPO = Path(__file__).resolve().parents[1]
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256)


KIMI = REPO / "examples/targets/kimi-k2.5-shape"  # config only: Kimi-K2.5's shape, int4 weights


def config_dir(tmp_path, name, cfg):
    d = tmp_path / name
    cfg.save_pretrained(d)
    return d


def configs():
    from transformers import CLIPVisionConfig, DeepseekV3Config, LlamaConfig, LlavaConfig, Qwen3Config

    return {
        "llama": (LlamaConfig(**SMALL), "model.layers", None),
        "qwen3": (Qwen3Config(**SMALL, head_dim=16), "model.layers", None),
        "deepseek_v3": (DeepseekV3Config(**{**SMALL, "num_key_value_heads": 4}, moe_intermediate_size=32, n_routed_experts=8,
                                         n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=32,
                                         kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                         n_group=2, topk_group=1),
                        "model.layers", {"routed_experts": 8, "shared_experts": 1, "active_experts": 2}),
        "llava": (LlavaConfig(text_config=LlamaConfig(**SMALL).to_dict(),
                              vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                                             num_attention_heads=2, image_size=32, patch_size=8).to_dict()),
                  "model.language_model.layers", None),
    }


@pytest.mark.parametrize("family", ["llama", "qwen3", "deepseek_v3", "llava"])
def test_inspect_families(tmp_path, family):
    cfg, path, moe = configs()[family]
    t = cr.inspect_target(str(config_dir(tmp_path, family, cfg)))
    assert t["decoder_layer_path"] == path
    assert t["num_layers"] == 8 and t["hidden_size"] == 64 and t["vocab_size"] == 1000
    assert t["text_config_unwrapped"] is (family == "llava")
    assert t["moe"] == moe
    assert t["chat_template"] is False and t["parameters"] > 0


def test_kimi_k25_shape(tmp_path):
    t = cr.inspect_target(str(KIMI))
    assert t["architecture"] == "Kimi_K25ForConditionalGeneration" and t["text_config_unwrapped"]
    assert t["decoder_layer_path"] == "model.language_model.layers"  # not the 27-layer vision tower
    assert (t["num_layers"], t["hidden_size"], t["vocab_size"]) == (61, 7168, 163840)
    assert t["moe"] == {"routed_experts": 384, "shared_experts": 1, "active_experts": 8}
    # INT4 routed experts (group 32, a bf16 scale per group), the rest bf16, as its quantization_config says (issue 74):
    # ~595 GB, the size Kimi-K2.5's checkpoint ships at
    assert 1.0e12 < t["parameters"] < 1.1e12 and 0.57 < t["weight_bytes_per_parameter"] < 0.59
    assert EAGLE3.default_aux_layer_ids(61) == [2, 30, 58]
    assert (3 + 1) * 7168 * 2 == 57_344
    g = cr.plan_gpus(t["parameters"], t["weight_bytes_per_parameter"], 96 * 10**9, 8, {"capture": 8, "serve": 8})
    assert g["gpus_needed_per_job"] == 8 and g["status"] == "ok"
    g = cr.plan_gpus(t["parameters"], t["weight_bytes_per_parameter"], 96 * 10**9, 8, {"capture": 4, "serve": 8})
    assert g["status"] == "fail" and g["jobs"]["capture"]["status"] == "fail"
    assert "asks for 4 GPU(s)" in g["jobs"]["capture"]["message"] and "need 8" in g["jobs"]["capture"]["message"]


def kimi_settings(tmp_path, num_train_samples: int) -> cr.CompatSettings:
    """The Kimi-K2.5 shape's report on 8 cards of 96 GB, hooks backend (no vLLM capture probe: no engine), planning
    ``num_train_samples`` tokens (one token a sample, no eval samples)."""
    return cr.CompatSettings(target_dir=str(KIMI), results_dir=str(tmp_path / "results"), backend="hooks",
                             num_train_samples=num_train_samples, num_eval_samples=0, max_seq_len=1, gpu_memory_gb=96,
                             gpus_per_node=8, capture_gpus=8, serve_gpus=8)


def test_kimi_full_report_matches_schema(tmp_path):
    """The whole report of the Kimi-K2.5 shape against its schema. Backend hooks: no vLLM capture probe, whose
    engine start a report with the probe run is validated for in test_vllm_capture.py
    (test_compat_picks_vllm_for_moe_target_where_the_probe_passes) and the kimi-mla record's rehearsal."""
    r = cr.build_report(kimi_settings(tmp_path, num_train_samples=1000))
    jsonschema.validate(r, json.loads((REPO / "eagle3build/schemas/compat.schema.json").read_text()))
    assert r["capture"]["aux_layer_ids"] == [2, 30, 58] and r["capture"]["bytes_per_token"] == 57_344
    assert r["plans"]["disk"]["needed_bytes"] == 57_344 * 1000
    assert r["plans"]["gpus"]["gpus_needed_per_job"] == 8 and r["hard_failures"] == []
    md = cr.render_markdown(r)
    assert "model.language_model.layers" in md and "[2, 30, 58]" in md and "57344" in md
    cr.write(r, str(tmp_path / "compat.json"), str(tmp_path / "compat.md"))
    assert json.loads((tmp_path / "compat.json").read_text())["target"]["num_layers"] == 61


def test_disk_upper_bound_warns_and_the_capture_refuses_on_real_token_counts(tmp_path):
    """The report plans before tokenization (samples x max_seq_len): above the free space it warns;
    a capture job refuses, before loading the target, when its split's missing shards really do not fit."""
    import numpy as np

    from eagle3build.capture.capture_hidden_states import check_disk_for_split

    r = cr.build_report(kimi_settings(tmp_path, num_train_samples=10**12))  # no vLLM capture probe: no engine
    disk = r["plans"]["disk"]
    assert disk["status"] == "warn" and disk["upper_bound"] and "plan_disk" not in r["hard_failures"]
    assert disk["message"].startswith("hidden states need at most 57344000.00 GB") and "upper bound" in disk["message"]

    out = tmp_path / "hidden_states/train/shard-00001.safetensors"
    offsets = np.array([0, 100, 250, 300, 420, 500], dtype=np.int64)  # 5 samples: 100, 150, 50, 120, 80 tokens
    (tmp_path / "hidden_states/train").mkdir(parents=True)
    (tmp_path / "hidden_states/train/shard-00000.safetensors").write_bytes(b"")  # samples 0-1 already captured
    ok = check_disk_for_split(out, offsets, split_samples=5, samples_per_shard=2, bytes_per_token=1000)
    assert ok["shards_missing"] == 2 and ok["tokens"] == 50 + 120 + 80 and ok["needed_bytes"] == 250_000
    free = ok["free_bytes"]
    per_token = free // 250 + 1  # the 250 missing tokens need just over the free space
    with pytest.raises(OSError, match=r"not enough disk for the 2 shard\(s\) of this split still to capture: .*"
                                      r"\(250 tokens of the tokenized data x \d+ B\)"):
        check_disk_for_split(out, offsets, 5, 2, per_token)
    # fewer configured samples than the file holds: only those count (shard 1 = sample 2, 50 tokens)
    assert check_disk_for_split(out, offsets, 3, 2, per_token)["tokens"] == 50


def test_disk_plan_warns_above_80_percent():
    assert cr.plan_disk(100, 9, 1000)["status"] == "warn"
    assert cr.plan_disk(100, 7, 1000)["status"] == "ok"
    assert cr.plan_disk(100, 11, 1000)["status"] == "fail"
    assert cr.plan_disk(100, 11, 1000, upper_bound=True)["status"] == "warn"


def test_remote_code_wrapper_path(tmp_path):
    """A trust_remote_code wrapper that nests a causal LM as ``language_model`` (Kimi-K2.5 on the hub)."""
    d = tmp_path / "wrapped"
    d.mkdir()
    (d / "configuration_wrapped.py").write_text(
        "from transformers import PretrainedConfig, LlamaConfig\n"
        "class WrappedConfig(PretrainedConfig):\n"
        "    model_type = 'wrapped_lm'\n"
        "    def __init__(self, text_config=None, **kw):\n"
        "        self.text_config = LlamaConfig(**(text_config or {}))\n"
        "        super().__init__(**kw)\n"
    )
    (d / "modeling_wrapped.py").write_text(
        "import torch\n"
        "from transformers import PreTrainedModel, LlamaForCausalLM\n"
        "from .configuration_wrapped import WrappedConfig\n"
        "class WrappedForCausalLM(PreTrainedModel):\n"
        "    config_class = WrappedConfig\n"
        "    def __init__(self, config):\n"
        "        super().__init__(config)\n"
        "        self.vision_tower = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])\n"
        "        self.language_model = LlamaForCausalLM(config.text_config)\n"
    )
    (d / "config.json").write_text(json.dumps({
        "model_type": "wrapped_lm", "architectures": ["WrappedForCausalLM"], "text_config": SMALL,
        "auto_map": {"AutoConfig": "configuration_wrapped.WrappedConfig",
                     "AutoModelForCausalLM": "modeling_wrapped.WrappedForCausalLM"}}))
    t = cr.inspect_target(str(d), trust_remote_code=True)
    assert t["decoder_layer_path"] == "language_model.model.layers" and t["num_layers"] == 8
    with pytest.raises(Exception, match="trust_remote_code"):
        cr.inspect_target(str(d), trust_remote_code=False)


def test_find_layers_ignores_vision_tower():
    from transformers import LlamaConfig, LlamaForCausalLM

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.vision = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(12)])
            self.language_model = LlamaForCausalLM(LlamaConfig(**SMALL))

    with torch.device("meta"):
        w = Wrapper()
    assert find_decoder_layers(w, 8).path == "language_model.model.layers"
    assert find_decoder_layers(w).path == "vision"  # without the layer count a longer list would win
    with pytest.raises(LookupError, match="of 5 layers"):
        find_decoder_layers(w, 5)


def test_untested_version_pair_is_a_named_warning():
    known = {"combinations": [{"speculators": "0.9.0", "vllm": "0.32.0", "transformers": "5.19.0", "torch": "2.13.0"}],
             "pairs": {"speculators-vllm": "heads load wrong", "vllm-torch": "kernels"}}
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = cr.check_known_good({"speculators": "0.9.0", "vllm": "0.33.1", "transformers": "5.19.0", "torch": "2.13.0"}, known)
    assert [u["pair"] for u in r["untested_pairs"]] == ["speculators-vllm", "vllm-torch"]
    assert "untested pair speculators 0.9.0 + vllm 0.33.1: heads load wrong" in str(w[0].message)
    assert cr.check_known_good({"speculators": "0.9.0", "vllm": "0.32.0", "transformers": "5.19.0", "torch": "2.13.0"},
                               known)["untested_pairs"] == []


def test_forced_backend_contradiction_is_reported():
    probes = {"vllm_extract_hidden_states": cr.Probe("x", value={"runnable_here": False, "reason": "needs CUDA; none here"})}
    d = cr.decide_backend("hooks", probes)
    assert d["backend"] == "hooks" and d["contradiction"] is None
