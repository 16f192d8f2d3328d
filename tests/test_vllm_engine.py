"""The one vLLM-runner module (engine arguments, child environment, run protocol) and vLLM as an
optional dependency: the head builds without it, the stages that serve fail at once naming it."""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import yaml
from conftest import fake_engines
from safetensors.numpy import save_file
from smk import REPO, planned_resources

from eagle3build.compat import compat_report
from eagle3build.data import regenerate_responses
from eagle3build.draft.head_format import Head
from eagle3build.serve import benchmark
from eagle3build.serve import export_head as ex
from eagle3build.serve.benchmark import BenchmarkSettings
from eagle3build.vllm import engine_process, measure
from eagle3build.vllm.engine_args import (
    CPU_ENGINE_ENV,
    KV_CACHE_FLOOR_BYTES,
    KV_CACHE_MARGIN,
    SIDE_BY_SIDE_UTILIZATION,
    cudagraph_capture_size_at_least,
    decode_graph_sizes,
    engine_args,
    engine_core_in_process,
    kv_cache_memory_bytes,
    side_by_side,
)


def _example_workdir(tmp_path):
    (tmp_path / "examples").symlink_to(REPO / "examples")  # the configs name their targets relative to the repo
    return tmp_path


@pytest.mark.parametrize("name, tp, dtype", [("kimi-k2.5-8x-rtx-pro-6000", 8, "bfloat16"),
                                             ("llama-3.1-8b-1gpu", 1, "bfloat16")])
def test_example_engines_are_tensor_parallel_over_the_jobs_gpus(tmp_path, name, tp, dtype):
    """What the serving jobs of the example configs plan (dry-run) and the engine arguments those GPUs give."""
    cfg_path = REPO / f"examples/configs/{name}.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    jobs = planned_resources(["--configfile", str(cfg_path)], _example_workdir(tmp_path))
    for rule in ("export_head", "benchmark"):
        (job,) = jobs[rule]
        eng = engine_args(str(REPO / cfg["target"]["path"]), gpus=int(job["gpu"]),
                          served_name=cfg["target"]["served_name"],
                          max_model_len=cfg["benchmark"]["max_model_len"], seed=cfg["benchmark"]["seed"],
                          dtype=cfg["target"]["serve_dtype"],
                          pipeline_parallel_size=cfg["target"]["pipeline_parallel_size"])
        assert (eng["tensor_parallel_size"], eng["pipeline_parallel_size"], eng["dtype"]) == (tp, 1, dtype), rule
        assert "enforce_eager" not in eng and "distributed_executor_backend" not in eng
        assert int(job["mem_mb"]) == cfg["resources"]["serve"]["mem_mb"]


def test_engine_args_read_the_targets_config_json_once(tmp_path, monkeypatch):
    """An MLA target wrapped multimodally on CPU gets the reference MLA backend and its language model only, from one
    read of its config.json (issue 66: it was read twice a call); a folder without one gets neither."""
    from eagle3build.vllm import engine_args as args_module

    (tmp_path / "config.json").write_text(json.dumps({"vision_config": {"hidden_size": 8},
                                                      "text_config": {"kv_lora_rank": 512}}))
    reads = []
    real = args_module.config_json
    monkeypatch.setattr(args_module, "config_json", lambda folder: reads.append(folder) or real(folder))
    eng = engine_args(str(tmp_path), gpus=0, served_name="m", max_model_len=64, seed=0)
    assert (eng["attention_backend"], eng["language_model_only"]) == ("CPU_MLA", True) and reads == [str(tmp_path)]
    plain = engine_args(str(tmp_path / "none"), gpus=0, served_name="m", max_model_len=64, seed=0)
    assert not {"attention_backend", "language_model_only"} & set(plain)


def test_engine_args_on_cpu_and_with_pipeline_stages(tmp_path):
    cpu = engine_args(str(tmp_path), gpus=0, served_name="org/m", max_model_len=512, seed=3)
    assert (cpu["dtype"], cpu["tensor_parallel_size"], cpu["enforce_eager"], cpu["seed"]) == ("float32", 1, True, 3)
    assert cpu["model"] == str(tmp_path.resolve()) and cpu["disable_log_stats"] is False
    # a CPU engine: its worker in a process of its own, its engine core in the engine's child (start_engine)
    assert cpu["distributed_executor_backend"] == "mp" and engine_core_in_process(cpu)
    assert CPU_ENGINE_ENV == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    gpu = engine_args(str(tmp_path), gpus=1, served_name="m", max_model_len=8, seed=0)
    assert not engine_core_in_process(gpu) and "distributed_executor_backend" not in gpu
    with pytest.raises(ValueError, match="bfloat16.*on CPU"):
        engine_args(str(tmp_path), gpus=0, served_name="m", max_model_len=8, seed=0, dtype="bfloat16")
    pp = engine_args(str(tmp_path), gpus=8, served_name="m", max_model_len=8, seed=0,
                     pipeline_parallel_size=2, enable_prefix_caching=False)
    assert (pp["tensor_parallel_size"], pp["pipeline_parallel_size"], pp["distributed_executor_backend"]) == (8, 2, "ray")
    assert pp["dtype"] == "bfloat16" and pp["enable_prefix_caching"] is False
    with pytest.raises(ValueError, match="pipeline_parallel_size must be >= 1"):
        engine_args(str(tmp_path), gpus=1, served_name="m", max_model_len=8, seed=0, pipeline_parallel_size=0)


def test_child_env_keeps_the_jobs_gpus_and_drops_blas_caps():
    env = engine_process.child_env({"CUDA_VISIBLE_DEVICES": "2,3", "MKL_NUM_THREADS": "2", "OMP_NUM_THREADS": "2",
                                    "PYTHONPATH": "/x"})
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and "MKL_NUM_THREADS" not in env and "OMP_NUM_THREADS" not in env
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert env["PYTHONPATH"].split(":") == ["/x", str(REPO)]
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and env["TRITON_F32_DEFAULT"] == "ieee"
    assert engine_process.child_env({"VLLM_USE_FLASHINFER_SAMPLER": "1"})["VLLM_USE_FLASHINFER_SAMPLER"] == "1"


def test_run_child_protocol(tmp_path):
    """A fresh process runs MODULE:FUNCTION on the spec and its JSON result comes back; a failure is an error."""
    r = engine_process.run_child("builtins:dict", {"a": [1, 2], "b": "x"}, tmp_path, "echo")
    assert r["a"] == [1, 2] and r["b"] == "x" and r["process_s"] > 0
    assert json.loads((tmp_path / "echo.spec.json").read_text()) == {"a": [1, 2], "b": "x"}
    with pytest.raises(RuntimeError, match="vLLM run 'bad' .*failed"):
        engine_process.run_child("builtins:ZeroDivisionError", {}, tmp_path, "bad")  # not JSON-able: the child exits 1


@pytest.fixture
def no_vllm(monkeypatch):
    """vLLM made unimportable (as on a GPU training node without it), also where it was imported before."""
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")] + ["vllm"]:
        monkeypatch.setitem(sys.modules, name, None)


def test_compat_report_without_vllm_warns_and_the_head_still_builds(no_vllm, tiny_target, tmp_path):
    r = compat_report.build_report(compat_report.CompatSettings(target_dir=str(tiny_target), results_dir=str(tmp_path),
                                                               aux_layer_ids=[1, 3, 4]))
    assert r["hard_failures"] == []
    assert r["probes"]["vllm"]["status"] == "fail" and r["probes"]["vllm"]["required"] is False
    assert r["probes"]["vllm_eagle3_model"]["status"] == "fail"
    v = r["vllm"]
    assert v["usable"] is False and v["version"] is None and "import of vllm halted" in v["evidence"]["vllm"]
    assert "train_draft" in v["builds_without"] and any("benchmark" in n for n in v["needed_by"])
    assert r["capture"]["backend"] == "hooks" and r["head"]["recommended_variant"] == "eagle3.1"
    assert "no vLLM importable here" in r["head"]["reason"]
    import jsonschema

    jsonschema.validate(json.loads(json.dumps(r, default=str)),
                        json.loads((REPO / "eagle3build/schemas/compat.schema.json").read_text()))
    compat_report.write(r, tmp_path / "compat.json", tmp_path / "compat.md")
    md = (tmp_path / "compat.md").read_text()
    assert "usable here: **no**" in md and "WARNING: vLLM is not usable here" in md


def test_serving_stages_fail_at_once_naming_vllm_and_the_target(no_vllm, tmp_path):
    """Before any work (the prompts file and the head do not even exist), naming the package and the artifact."""
    out = tmp_path / "results/r/benchmark.json"
    with pytest.raises(engine_process.VLLMUnavailable, match=rf"{out} needs the Python package 'vllm'"):
        benchmark.benchmark(BenchmarkSettings(target_dir=str(tmp_path), head_dir=str(tmp_path / "nohead"),
                                              prompts_path=str(tmp_path / "missing.jsonl"), out_json=str(out), ks=[3],
                                              num_prompts=8, max_tokens=16, served_name="org/m"))
    regen = tmp_path / "results/r/data/regenerated.jsonl"
    with pytest.raises(engine_process.VLLMUnavailable,
                       match=rf"{regen} \(data.regenerate.backend: vllm\) needs the Python package 'vllm'"):
        regenerate_responses.regenerate(regenerate_responses.RegenerateSettings(
            sources=[{"path": str(tmp_path / "missing.json"), "max_samples": None}], target_dir=str(tmp_path),
            out_jsonl=regen, out_report=tmp_path / "report.json", max_seq_len=128, max_tokens=16, served_name="org/m",
            backend="vllm"))
    # auto: regeneration has a transformers backend for nodes without vLLM (issue 15), and says why
    choice = regenerate_responses.choose_backend("auto", needed_by=str(regen))
    assert choice["used"] == "transformers" and "import of vllm halted" in choice["reason"]
    with pytest.raises(engine_process.VLLMUnavailable, match=r"head \(export.vllm_load_check: always\) needs.*'vllm'"):
        ex.export(ex.ExportSettings(checkpoint_dir=tmp_path / "nock", d2t_path="d2t", t2d_path="t2d",
                                    vocab_json="vocab", out_dir=tmp_path / "head", served_name="org/m",
                                    target_dir=str(tmp_path), vllm_load_check="always"))
    assert not out.exists() and not regen.exists() and not (tmp_path / "head").exists()


def test_export_without_vllm_skips_the_load_check_and_records_why(no_vllm, tiny_shards, tiny_target, tmp_path):
    from eagle3build.train import train_draft as td

    d, _, _ = tiny_shards
    ck = tmp_path / "checkpoint"
    td.train(target_dir=str(tiny_target), train_shards=[str(d / "train-shard.safetensors")], eval_shards=[],
             d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"), vocab_json=str(d / "vocab.json"),
             decisions_json=str(d / "decisions.json"), out_dir=str(ck), epochs=1, total_seq_len=256, device="cpu")
    meta = ex.export(ex.ExportSettings(checkpoint_dir=ck, d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"),
                                       vocab_json=str(d / "vocab.json"), out_dir=tmp_path / "head",
                                       served_name="org/tiny", target_dir=str(tiny_target), vllm_load_check="auto"))
    assert "needs the Python package 'vllm'" in meta["vllm_load_check"]["skipped"]
    on_disk = json.loads((tmp_path / "head/head_meta.json").read_text())
    assert on_disk["vllm_load_check"] == meta["vllm_load_check"] and (tmp_path / "head/model.safetensors").is_file()


def test_kv_cache_bytes_per_token_for_known_shapes():
    """Llama-3.1-8B in bf16: 32 layers x 2 x 8 KV heads x 128 = 128 KiB a token (vLLM's figure for it);
    over 8 ranks one KV head each; Kimi-K2.5 (MLA): 61 latents of 512 + 64, on every rank."""
    from eagle3build.target import kv_cache_bytes_per_token, load_config, text_config

    llama = text_config(load_config(REPO / "examples/targets/llama-3.1-8b-instruct-shape"))
    assert kv_cache_bytes_per_token(llama, 2) == 131072
    assert kv_cache_bytes_per_token(llama, 2, tensor_parallel_size=8) == 131072 // 8
    assert kv_cache_bytes_per_token(llama, 2, tensor_parallel_size=8, extra_layers=1) == 33 * 2 * 1 * 128 * 2
    assert kv_cache_bytes_per_token(llama, 4) == 2 * 131072
    kimi = json.loads((REPO / "examples/targets/kimi-k2.5-shape/config.json").read_text())["text_config"]
    from types import SimpleNamespace

    assert kv_cache_bytes_per_token(SimpleNamespace(**kimi), 2, tensor_parallel_size=8) == 61 * (512 + 64) * 2
    hybrid = SimpleNamespace(num_hidden_layers=4, layer_types=["full_attention", "mamba"] * 2, hidden_size=8,
                             num_attention_heads=2)
    assert kv_cache_bytes_per_token(hybrid, 2) is None  # not attention only: left to vLLM


def test_gpu_engines_are_sized_to_their_job():
    """The load check, a capture and a benchmark engine on a GPU: KV cache from the tokens they hold, not 92 % of
    the card; eager where a few requests run; CUDA graphs up to one decode step otherwise. CPU engines keep their
    settings (VLLM_CPU_KVCACHE_SPACE, eager)."""
    from eagle3build.vllm import capture

    target = str(REPO / "examples/targets/llama-3.1-8b-instruct-shape")
    per_token = 33 * 2 * 8 * 128 * 2  # target + one draft layer, bf16, one GPU
    check = engine_args(target, gpus=1, served_name="m", max_model_len=256, seed=0, max_num_seqs=1,
                        kv_cache_tokens=257, draft_layers=1, eager=True)
    assert check["kv_cache_memory_bytes"] == max(KV_CACHE_FLOOR_BYTES, int(per_token * 257 * 1.25))
    assert (check["enforce_eager"], check["enable_flashinfer_autotune"], check["max_num_seqs"]) == (True, False, 1)
    bench = engine_args(target, gpus=1, served_name="m", max_model_len=2048, seed=0, max_num_seqs=16,
                        kv_cache_tokens=16 * 2051, draft_layers=1, graph_batch_tokens=16 * 4)
    assert bench["kv_cache_memory_bytes"] == int(per_token * 16 * 2051 * 1.25)  # 5.5 GB, not 92 % of a card
    assert bench["max_cudagraph_capture_size"] == 64 and "enforce_eager" not in bench
    # vLLM truncates the capture size down to its list (1, 2, 4, 8, 16, ..., 248, 256, 272, ...): round up
    k2 = engine_args(target, gpus=1, served_name="m", max_model_len=2048, seed=0, graph_batch_tokens=1 * 3)
    assert k2["max_cudagraph_capture_size"] == 4
    sizes = [cudagraph_capture_size_at_least(n) for n in (1, 2, 3, 4, 5, 6, 8, 9, 96, 255, 256, 257)]
    assert sizes == [1, 2, 4, 4, 8, 8, 8, 16, 96, 256, 256, 272]
    with pytest.raises(ValueError, match="at least 1 token"):
        cudagraph_capture_size_at_least(0)
    cap = capture.capture_engine_args(target, gpus=1, max_model_len=2049, tokens_per_step=16384, dtype="auto")
    assert cap["kv_cache_memory_bytes"] == int(32 * 2 * 8 * 128 * 2 * 2 * (16384 + 2049) * 1.25)
    assert cap["enforce_eager"] is True and "max_num_seqs" not in cap
    cpu = engine_args(target, gpus=0, served_name="m", max_model_len=256, seed=0, max_num_seqs=1,
                      kv_cache_tokens=257, eager=True, graph_batch_tokens=4)
    assert not {"kv_cache_memory_bytes", "max_cudagraph_capture_size", "enable_flashinfer_autotune"} & set(cpu)
    assert "trust_remote_code" not in cpu
    assert engine_args(target, gpus=1, served_name="m", max_model_len=8, seed=0, trust_remote_code=True)[
        "trust_remote_code"] is True


def test_startup_breakdown_reads_vllms_lines():
    lines = [
        "(EngineCore pid=1) INFO 12-01 [cuda.py:483] Using FLASH_ATTN attention backend out of potential backends: x.",
        "(EngineCore pid=1) INFO 12-01 [default_loader.py:431] Loading weights took 0.41 seconds",
        "(EngineCore pid=1) INFO 12-01 [gpu_model_runner.py:5348] Model loading took 0.26 GiB memory and 1.052 seconds",
        "(EngineCore pid=1) INFO 12-01 [monitor.py:20] torch.compile took 29.10 s in total",
        "(EngineCore pid=1) INFO 12-01 [gpu_worker.py:561] Available KV cache memory: 127.4 GiB",
        "(EngineCore pid=1) INFO 12-01 [kv_cache_utils.py:2177] GPU KV cache size: 5,563,136 tokens",
        "(EngineCore pid=1) INFO 12-01 [gpu_model_runner.py:6845] Graph capturing finished in 41 secs, took 0.5 GiB",
        "(EngineCore pid=1) INFO 12-01 [core.py:341] init engine (profile, create kv cache, warmup model) took "
        "97.30 s (compilation: 29.10 s)",
    ]
    st = engine_process.startup_breakdown(lines, 132.0)
    assert st == {"attention_backend": "FLASH_ATTN", "weights_s": 0.41, "model_load_s": 1.052, "torch_compile_s": 29.1,
                  "kv_cache_gib": 127.4, "kv_cache_tokens": 5563136, "cuda_graphs_s": 41.0, "init_engine_s": 97.3,
                  "engine_start_s": 132.0, "other_s": 33.65}
    assert all(engine_process._STARTUP_HINT.search(x) for x in lines)
    reserved = engine_process.startup_breakdown(["reserved 0.56 GiB memory for KV Cache as specified"])
    assert reserved["kv_cache_gib"] == 0.56
    assert "engine start 132.0 s (attention_backend FLASH_ATTN" in engine_process.format_startup(st, 140.0)
    # the model runner, where vLLM names it (vLLM 0.26 on an H200: the dense target; P-EAGLE's fallback)
    v2 = "(EngineCore pid=5605) INFO 12-04 20:22:59 [gpu_worker.py:378] Using V2 Model Runner"
    v1 = ("(EngineCore pid=7) WARNING 12-04 [vllm.py:725] Model Runner V2 does not yet support parallel drafting for "
          "EAGLE speculative decoding; using the V1 model runner instead.")
    assert engine_process._STARTUP_HINT.search(v2) and engine_process._STARTUP_HINT.search(v1)
    assert engine_process.startup_breakdown(lines + [v2])["model_runner"] == "v2"
    assert engine_process.startup_breakdown([v1, v1])["model_runner"] == "v1"
    assert "model_runner" not in st


def test_run_child_copies_the_childs_output_and_times_it(tmp_path, capfd, monkeypatch):
    """A real child (no vLLM needed): its lines reach this process's stderr, its result and timings come back."""
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))
    r = engine_process.run_child("tests_child_entry:entry", {"x": 3}, tmp_path, "echo")
    assert r["y"] == 6 and r["process_s"] > 0 and r["startup"] == {"model_load_s": 2.5, "engine_start_s": 4.0,
                                                                   "other_s": 1.5}
    assert "Model loading took 0.1 GiB and 2.5 seconds" in capfd.readouterr().err
    # the job's environment reaches the child, and run_child's env overrides it there
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert engine_process.run_child("tests_child_entry:entry", {"x": 1}, tmp_path, "echo")["runner_env"] == "1"
    assert engine_process.run_child("tests_child_entry:entry", {"x": 1}, tmp_path, "echo",
                                    env={"VLLM_USE_V2_MODEL_RUNNER": "0"})["runner_env"] == "0"


TINY_REMOTE_CONFIG = '''from transformers import PretrainedConfig


class TinyConfig(PretrainedConfig):
    model_type = "eagle3build_tiny_remote"

    def __init__(self, num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                 vocab_size=128, **kwargs):
        self.num_hidden_layers = num_hidden_layers
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.vocab_size = vocab_size
        super().__init__(**kwargs)
'''


@pytest.fixture
def remote_code_target(tmp_path):
    """A target directory whose config only loads with trust_remote_code (a model_type transformers does not know,
    its class in the directory's own configuration_tiny.py); no weights or tokenizer, engines are faked."""
    d = tmp_path / "remote-target"
    d.mkdir()
    (d / "configuration_tiny.py").write_text(TINY_REMOTE_CONFIG)
    (d / "config.json").write_text(json.dumps({
        "model_type": "eagle3build_tiny_remote", "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig"},
        "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 128}))
    return d


def _recording_engines(specs):
    """run_child stand-in: records each spec; answers like decode_greedy (2 tokens a prompt, one draft accepted;
    per set with ``sets``) or like regenerate_responses.run_child."""
    stats = {"p50": 0.1, "p95": 0.1, "mean": 0.1}

    def figures(n, speculative):
        out = {"wall_s": 1.0, "output_tokens": 2 * n, "output_tokens_per_s": 2.0 * n, "request_latency_s": stats,
               "time_to_first_token_s": stats, "time_per_output_token_s": stats, "texts": ["ab"] * n,
               "token_ids": [[1, 2]] * n, "prompt_token_ids": [[7]] * n}
        if speculative:
            out.update(measure.spec_figures({"vllm:spec_decode_num_drafts": n, "vllm:spec_decode_num_draft_tokens": n,
                                                 "vllm:spec_decode_num_accepted_tokens": n,
                                                 "vllm:spec_decode_num_accepted_tokens_per_pos": [n]}))
        return out

    def fake_run_child(entry, spec, workdir, name):
        specs.append(spec)
        if entry == "eagle3build.data.regenerate_responses:run_child":
            convs = [[*c[:1], {"role": "assistant", "content": "ok"}] for c in spec["conversations"]]
            return {"conversations": convs, "last_turn_unfinished": [False] * len(convs), "turns_regenerated": len(convs),
                    "conversations_cut_at_max_seq_len": 0, "answers_at_max_tokens": 0, "answers_at_max_tokens_looping": 0,
                    "generated_tokens": len(convs),
                    "generate_seconds": 0.5}
        speculative = bool(spec.get("speculative_config"))
        res = {**figures(len(spec["prompts"]), speculative), "engine_start_s": 1.0, "process_s": 2.0}
        if spec.get("sets"):
            res["sets"] = {g["name"]: figures(g["count"], speculative) for g in spec["sets"]}
        return res

    return fake_run_child


@pytest.mark.parametrize("trust", [True, False])
def test_remote_code_reaches_every_engine(remote_code_target, tmp_path, monkeypatch, trust):
    """target.trust_remote_code reaches the engine of export's load check, of every benchmark run and of
    vLLM regeneration (each spec carries the flag; without it the key is absent), and the KV cache sizing
    reads the remote-code config only with it (without, the config does not load: vLLM's default sizing)."""
    target = str(remote_code_target)
    specs = []
    fake_engines(monkeypatch, _recording_engines(specs))
    monkeypatch.setattr(engine_process, "require_vllm", lambda needed_by: "test")
    monkeypatch.setattr(benchmark, "chat_token_counter", lambda target_dir, trust_remote_code: lambda msgs: 10)

    (tmp_path / "head").mkdir()  # the benchmark reads the head's draft vocab (d2t) before any engine starts
    save_file({"d2t": np.zeros(1, dtype=np.int64)}, str(tmp_path / "head/model.safetensors"))
    # the load check and the benchmark read the head's method and layer count (head_format.Head)
    (tmp_path / "head/config.json").write_text('{"speculators_model_type": "eagle3", '
                                               '"transformer_layer_config": {"num_hidden_layers": 1}}')
    ex.check_loads_with_vllm(Head.read(tmp_path / "head"), target, "org/tiny", gpus=1, trust_remote_code=trust)
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"prompt": "hi"}\n{"prompt": "there"}\n')
    r = benchmark.benchmark(BenchmarkSettings(
        target_dir=target, head_dir=str(tmp_path / "head"), prompts_path=str(tmp_path / "unused.jsonl"),
        out_json=str(tmp_path / "b.json"), ks=[2], num_prompts=2, max_tokens=8, dtype="auto", served_name="org/tiny",
        max_model_len=64, gpus=1, sets=["custom"], custom_prompts_path=str(prompts), trust_remote_code=trust))
    assert r["settings"]["sets"]["custom"]["skipped_too_long"] == 0
    src = tmp_path / "convs.jsonl"
    src.write_text(json.dumps({"id": "c0", "messages": [{"role": "user", "content": "hi"},
                                                        {"role": "assistant", "content": "old"}]}) + "\n")
    regenerate_responses.regenerate(regenerate_responses.RegenerateSettings(
        sources=[{"path": str(src), "max_samples": None}], target_dir=target, out_jsonl=tmp_path / "regen.jsonl",
        out_report=tmp_path / "regen_report.json", max_seq_len=64, max_tokens=8, served_name="org/tiny", gpus=1,
        backend="vllm", trust_remote_code=trust))

    engines = [s["engine"] for s in specs]
    assert len(engines) == 4  # load check, benchmark baseline and k=2, regeneration
    assert all(("trust_remote_code" in e) is trust for e in engines)
    assert all(e["trust_remote_code"] is True for e in engines if trust)
    # engines sized to their job read the config: the load check and the benchmark's (regeneration keeps vLLM's own)
    assert [("kv_cache_memory_bytes" in e) for e in engines] == [trust, trust, trust, False]


def test_kv_cache_sizing_loads_a_remote_code_config(remote_code_target):
    per_token = 2 * 2 * 2 * 16 * 2  # layers x (K, V) x KV heads x head_dim x bf16 bytes
    eng = engine_args(str(remote_code_target), gpus=1, served_name="m", max_model_len=64, seed=0,
                      kv_cache_tokens=100, trust_remote_code=True)
    assert eng["kv_cache_memory_bytes"] == KV_CACHE_FLOOR_BYTES and eng["trust_remote_code"] is True
    assert kv_cache_memory_bytes(str(remote_code_target), "bfloat16", 1, 1_000_000, trust_remote_code=True) \
        == int(per_token * 1_000_000 * KV_CACHE_MARGIN)
    assert kv_cache_memory_bytes(str(remote_code_target), "bfloat16", 1, 1_000_000) is None  # not trusted


def _alive(pid: int) -> bool:
    """The process exists and is no zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_no_engine_outlives_its_job(tmp_path, sig):
    """Issue 38.6: a job killed (SIGKILL: no cleanup can run in it) while its engine child runs takes the child and
    the engine processes the child started with it, within seconds, instead of leaving them to init."""
    import signal
    import subprocess
    import time

    pids = tmp_path / "pids.json"
    job = subprocess.Popen([sys.executable, "-c", (
        "import sys; from eagle3build.vllm import engine_process; "
        f"engine_process.run_child('tests_child_entry:engine_like', {{'pids': {str(pids)!r}}}, {str(tmp_path)!r}, "
        "'e')")],
        env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}, start_new_session=True)
    deadline = time.monotonic() + 60
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    started = json.loads(pids.read_text())
    assert all(_alive(p) for p in started.values())
    job.send_signal(getattr(signal, sig))
    job.wait(timeout=60)
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in started.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {k: p for k, p in started.items() if _alive(p)}
    for p in left.values():
        os.kill(p, signal.SIGKILL)
    assert not left, f"outlived the job: {left}"


@pytest.mark.vllm
def test_no_real_engine_outlives_its_job(tmp_path, tiny_target):
    """Issue 38.6 with vLLM itself: an export or benchmark job SIGKILLed while its engine is up leaves no engine
    process behind (the child and vLLM's engine core are gone within seconds), so a retry starts on a free device."""
    import signal
    import subprocess
    import time

    pytest.importorskip("vllm")
    pids = tmp_path / "pids.json"
    eng = engine_args(str(tiny_target), gpus=0, served_name="m", max_model_len=256, seed=0, max_num_seqs=1)
    job = subprocess.Popen([sys.executable, "-c", (
        "import json, sys; from eagle3build.vllm import engine_process; "
        "engine_process.run_child('tests_child_entry:real_engine', json.loads(sys.argv[1]), sys.argv[2], 'e')"),
        json.dumps({"engine": eng, "pids": str(pids)}), str(tmp_path)],
        env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 400
    while not pids.exists() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.5)
    assert pids.exists(), "the engine did not start"
    got = json.loads(pids.read_text())
    started = [got["child"], *got["engine"]]
    assert len(started) >= 2 and all(_alive(p) for p in started)  # the child (the engine core on CPU) and its worker
    job.send_signal(signal.SIGKILL)
    job.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in started if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"outlived the job: {left}"


def test_benchmark_engines_capture_a_graph_per_decode_step():
    """The benchmark's engines capture CUDA graphs for exactly the decode steps they run (n x (1 + k) tokens for the
    target's verification and n for the drafter, n of 1..the requests in flight), the widest included (vllm #54933),
    else vLLM's grid up to the widest step; as vLLM's cudagraph_capture_sizes, without max_cudagraph_capture_size."""
    assert decode_graph_sizes(1) == [1] and decode_graph_sizes(1, 3) == [1, 4]
    assert decode_graph_sizes(4, 3) == [1, 2, 3, 4, 8, 12, 16]
    assert decode_graph_sizes(2, 2) == [1, 2, 3, 6]
    grid = decode_graph_sizes(64, 3)  # 112 exact sizes: the grid instead
    assert grid[:4] == [1, 2, 4, 8] and grid[-2:] == [248, 256] and len(grid) == 35
    assert decode_graph_sizes(48, 2)[-2:] == [136, 144]  # 144 = 48 x 3, off the grid's stride, captured too
    with pytest.raises(ValueError, match="at least one sequence"):
        decode_graph_sizes(0)
    target = str(REPO / "examples/targets/llama-3.1-8b-instruct-shape")
    e = engine_args(target, gpus=1, served_name="m", max_model_len=2048, seed=0, max_num_seqs=1, kv_cache_tokens=2051,
                    draft_layers=1, graph_sizes=decode_graph_sizes(1, 3))
    assert e["cudagraph_capture_sizes"] == [1, 4] and "max_cudagraph_capture_size" not in e
    eager = engine_args(target, gpus=1, served_name="m", max_model_len=2048, seed=0, eager=True, graph_sizes=[1, 4])
    assert "cudagraph_capture_sizes" not in eager and eager["enforce_eager"] is True
    cpu = engine_args(target, gpus=0, served_name="m", max_model_len=2048, seed=0, graph_sizes=[1, 4])
    assert "cudagraph_capture_sizes" not in cpu and cpu["enforce_eager"] is True


def test_engines_start_side_by_side_where_a_card_has_room(tmp_path):
    """Two engines start side by side on CPU (as given) and on a card for a small target whose KV caches are sized in
    bytes (each then needing 40 % of the card free at its start); not with pipeline stages, an unsized KV cache or
    weights above 8 GiB per GPU."""
    small = str(REPO / "examples/targets/llama-3.1-8b-instruct-shape")  # config only: no weight files
    gpu = [engine_args(small, gpus=1, served_name="m", max_model_len=64, seed=0, max_num_seqs=1, kv_cache_tokens=65,
                       draft_layers=k, graph_sizes=decode_graph_sizes(1, k)) for k in (0, 3)]
    beside = side_by_side(gpu, small)
    assert [e["gpu_memory_utilization"] for e in beside] == [SIDE_BY_SIDE_UTILIZATION] * 2
    assert [{k: v for k, v in e.items() if k != "gpu_memory_utilization"} for e in beside] == gpu
    cpu = [engine_args(small, gpus=0, served_name="m", max_model_len=64, seed=0) for _ in range(2)]
    assert side_by_side(cpu, small) == cpu
    assert side_by_side([gpu[0], {k: v for k, v in gpu[1].items() if k != "kv_cache_memory_bytes"}], small) is None
    assert side_by_side([{**e, "pipeline_parallel_size": 2} for e in gpu], small) is None
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "model.safetensors", "wb") as f:  # a sparse file: 9 GiB of weights on one GPU
        f.truncate(9 << 30)
    assert side_by_side(gpu, big) is None
    assert side_by_side([{**e, "tensor_parallel_size": 2} for e in gpu], big) is not None  # 4.5 GiB per GPU


def test_side_by_side_starts_together_and_works_one_at_a_time(tmp_path, monkeypatch):
    """run_side_by_side: both children start at once; each works only once both have started, and the second only
    after the first is done; each result names the other and its held seconds. A child that fails to start beside the
    other makes both run again one at a time. Inside compile_cache every child gets its VLLM_CACHE_ROOT, unless the
    job's environment sets one."""
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))
    monkeypatch.delenv(engine_process.CACHE_VAR, raising=False)
    entry = "tests_child_entry:held"
    with engine_process.compile_cache(tmp_path / "cache") as cache:
        a, b = engine_process.run_side_by_side([(entry, {"start_s": 1.0, "work_s": 0.5}, "a"),
                                                (entry, {"start_s": 0.2, "work_s": 0.2}, "b")], tmp_path)
    assert cache == str(tmp_path / "cache") and (tmp_path / "cache").is_dir()
    assert a["cache"] == b["cache"] == cache
    assert abs(a["t0"] - b["t0"]) < 0.9  # started together: b's start of 0.2 s does not wait for a's 1 s
    assert a["work"] >= b["started"] and b["work"] >= a["done"]  # no work beside a start or another's work
    assert a["started_beside"] == ["b"] and b["started_beside"] == ["a"] and b["held_s"] >= a["held_s"]
    assert engine_process.CACHE_VAR not in engine_process.child_env({})  # outside compile_cache: vLLM's default
    monkeypatch.setenv(engine_process.CACHE_VAR, str(tmp_path / "mine"))
    with engine_process.compile_cache(tmp_path / "cache") as cache:
        assert cache == str(tmp_path / "mine") and engine_process.child_env()[engine_process.CACHE_VAR] == cache
        a, b = engine_process.run_side_by_side([(entry, {"start_s": 0.2}, "a"),
                                                (entry, {"start_s": 0.2, "fail": True}, "b")], tmp_path)
    assert a["cache"] == str(tmp_path / "mine")
    assert "started_beside" not in a and a["held_s"] == 0 and b["work"] >= a["done"]  # one at a time, unheld
    assert (tmp_path / "a_alone.out.json").exists() and (tmp_path / "b_alone.out.json").exists()
