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

Prompt sets (``benchmark.sets``, see ``prompt_sets``): every engine decodes the sets one
after the other; vLLM's spec-decode counters are global per engine, so each set's
figures are the counter deltas and the wall time around that set's requests. The
overall figures sum the sets (tokens/s = all output tokens / summed wall time of the sets).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from . import prompt_sets, vllm_engine
from .atomic import write_json
from .provenance import BENCHMARK_PACKAGES, hardware, software_versions

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 1

RUN_ENTRY = "eagle3build.vllm_engine:decode_greedy"


SCHEMA = Path(__file__).resolve().parent / "schemas" / "benchmark.schema.json"  # artifacts.schema_path("benchmark")


def validate(result: dict) -> None:
    """Check a benchmark result against ``eagle3build/schemas/benchmark.schema.json``.

    Raises:
        artifacts.ArtifactError: a field is missing or out of range (the message names it).
    """
    from .artifacts import validate as validate_artifact

    validate_artifact(result, "benchmark", "benchmark result")


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
    sets: list[str] | None = None,
    custom_prompts_path: str | None = None,
) -> dict:
    """Baseline run plus one EAGLE-3 run per k over every prompt set; write ``out_json``
    (eagle3build/schemas/benchmark.schema.json).

    ``sets``: names of ``prompt_sets`` (``chat`` = ``prompts_path``, prepare_data's held-out
    eval prompts; ``humaneval``; ``custom`` = ``custom_prompts_path``); default ``["chat"]``.
    ``num_prompts`` applies per set. One engine per configuration (baseline, each k) decodes
    the sets one after the other (``vllm_engine.decode_greedy`` with ``sets``), so a set's
    figures are its own counter deltas and wall time in that engine.

    Per run, overall and per set (``"sets": {name: ...}``): output tokens/s, wall seconds,
    latencies; per EAGLE-3 run also drafts, draft tokens, accepted tokens, τ, acceptance rate
    per position, speed-up against the baseline (the same set's tokens/s) and the lossless
    check (prompts whose greedy token ids differ from the baseline's; must be 0). Engine start
    seconds per run. ``gpus``: GPUs the job holds (the engines' tensor parallel size; 0 = CPU);
    ``dtype`` ``auto`` = bf16 on GPUs, float32 on CPU.

    Raises:
        vllm_engine.VLLMUnavailable: vLLM cannot be imported (checked first, before any work).
        prompt_sets.PromptSetError: an unknown set, or a set without prompts (before any engine starts).
        RuntimeError: an engine run failed.
    """
    import tempfile

    vllm_engine.require_vllm(needed_by=os.fspath(out_json))
    by_set = prompt_sets.load_sets(sets or ["chat"], num_prompts, chat_path=prompts_path, custom_path=custom_prompts_path)
    eng = vllm_engine.engine_args(target_dir, gpus=gpus, served_name=served_name, max_model_len=max_model_len,
                                  seed=seed, dtype=dtype, pipeline_parallel_size=pipeline_parallel_size)
    dtype = eng["dtype"]
    with tempfile.TemporaryDirectory(prefix="eagle3-bench-") as tmpdir:
        return _benchmark(Path(tmpdir), eng, by_set, head_dir, out_json, ks, max_tokens, dtype, served_name, max_model_len,
                          concurrency, num_prompts)


def _benchmark(tmp: Path, eng: dict, by_set: dict[str, list[dict]], head_dir: str, out_json: str, ks: list[int],
               max_tokens: int, dtype: str, served_name: str, max_model_len: int, concurrency: int, num_prompts: int) -> dict:
    prompts = [p for ps in by_set.values() for p in ps]
    groups = [{"name": name, "count": len(ps)} for name, ps in by_set.items()]
    common = {"engine": eng, "prompts": prompts, "max_tokens": max_tokens, "concurrency": concurrency, "sets": groups}
    base = vllm_engine.run_child(RUN_ENTRY, common, tmp, "baseline")
    log.info("baseline: %.2f output tokens/s", base["output_tokens_per_s"])
    runs = []
    for k in ks:
        spec = {"method": "eagle3", "model": os.path.abspath(head_dir), "num_speculative_tokens": k}
        r = vllm_engine.run_child(RUN_ENTRY, {**common, "speculative_config": spec}, tmp, f"eagle3_k{k}")
        r.update(num_speculative_tokens=k, **compare(base, r, prompts))
        for name, ps in by_set.items():
            r["sets"][name].update(compare(base["sets"][name], r["sets"][name], ps))
            log.info("k=%d %s: tau=%s, %.2f tokens/s (x%.2f), %d prompts differ", k, name,
                     r["sets"][name]["mean_acceptance_length"], r["sets"][name]["output_tokens_per_s"],
                     r["sets"][name]["speedup"], r["sets"][name]["prompts_differing_from_baseline"])
        log.info("k=%d overall: tau=%s, %.2f tokens/s (x%.2f), %d prompts differ", k, r["mean_acceptance_length"],
                 r["output_tokens_per_s"], r["speedup"], r["prompts_differing_from_baseline"])
        runs.append(r)
    for r in [base, *runs]:
        r.pop("token_ids")
        for v in r["sets"].values():
            v.pop("token_ids")
    result = {
        "versions": software_versions(BENCHMARK_PACKAGES, keep_missing=False),
        "hardware": hardware(),
        "settings": {"num_prompts": num_prompts, "max_tokens": max_tokens, "dtype": dtype, "temperature": 0.0,
                     "ks": ks, "concurrency": concurrency, "served_name": served_name, "max_model_len": max_model_len,
                     "tensor_parallel_size": eng["tensor_parallel_size"],
                     "pipeline_parallel_size": eng["pipeline_parallel_size"],
                     "sets": {name: {"num_prompts": len(ps), "prompt_ids": [p["id"] for p in ps]}
                              for name, ps in by_set.items()}},
        "baseline": base,
        "eagle3": runs,
    }
    validate(result)
    write_json(out_json, result)
    return result


def compare(base: dict, run: dict, prompts: list[dict]) -> dict:
    """Speed-up (``run`` tokens/s over ``base`` tokens/s, same prompts) and the lossless check: the ids of
    ``prompts`` whose greedy token ids differ between the two runs (``token_ids`` in prompt order)."""
    differing = [p["id"] for p, a, b in zip(prompts, base["token_ids"], run["token_ids"], strict=True) if a != b]
    return {"speedup": run["output_tokens_per_s"] / base["output_tokens_per_s"],
            "prompts_differing_from_baseline": len(differing), "differing_prompt_ids": differing,
            "outputs_identical": not differing}
