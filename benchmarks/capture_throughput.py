"""Benchmark: hidden-state capture against a plain forward pass of the same model, in one run.

GPU (issue 5): an 8B-shaped randomly initialised Llama (32 layers, hidden 4096) in bf16,
batches of 8 x 2048 tokens, shards written to local disk:

    python benchmarks/capture_throughput.py --device cuda --out /tmp/capture-bench

CPU, the default target:

    .venv/bin/python benchmarks/capture_throughput.py --device cpu \
        --target resources/targets/smollm2-135m-instruct --batch 8 --seq 512 --batches 3

Prints, for each variant, tokens/s and model FLOP utilisation (2 x non-embedding
parameters x tokens / time, against the bf16 matmul rate measured in the same run on
GPU): a plain forward of the text model; a naive capture (``output_hidden_states`` plus
a synchronous copy of the needed states to host memory); our capture (hooks, packed rows
cast on the GPU, side-stream copies to pinned memory, a writer thread streaming into
the shard) in bf16 and in fp8 storage; and bytes on disk per token against 8 x hidden.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from eagle3build.capture.capture_hidden_states import CaptureSettings, capture_shard  # noqa: E402
from eagle3build.data.prepare_data import write_tokens  # noqa: E402
from eagle3build.draft import methods  # noqa: E402
from eagle3build.target import load_model, text_config  # noqa: E402


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_tflops(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(device)
    return 10 * 2 * 8192**3 / (time.perf_counter() - t) / 1e12


def disk_write_rate(out: Path, gb: float = 2.0) -> dict:
    """Sequential write rate of the shard directory's disk in GB/s (10^9 bytes): ``gb`` GiB written in 64 MiB blocks
    (at least one), page cache only, and again with fsync."""
    buf = os.urandom(64 << 20)
    n = max(1, int(gb * (1 << 30)) // len(buf))
    rates = {}
    for fsync in (False, True):
        f = out / "disk-test.bin"
        t = time.perf_counter()
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        for i in range(n):
            os.pwrite(fd, buf, i * len(buf))
        if fsync:
            os.fsync(fd)
        os.close(fd)
        rates["with_fsync" if fsync else "page_cache"] = round(n * len(buf) / (time.perf_counter() - t) / 1e9, 2)
        f.unlink()
    return rates


def build_model(args):
    if args.target:
        return load_model(args.target, torch.bfloat16 if args.device.startswith("cuda") else torch.float32, args.device)
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128256, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=8192)
    torch.manual_seed(0)
    with torch.device(args.device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    return model.eval()


def time_loop(fn, batches, device):
    fn(batches[0])  # warm-up
    sync(device)
    t = time.perf_counter()
    for b in batches:
        fn(b)
    sync(device)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--target", default=None, help="an HF model directory instead of the random 8B-shaped Llama")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=14336)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--out", default="/tmp/capture-bench")
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--variants", action="store_true", help="also 1 writer thread, and fsync before the rename")
    ap.add_argument("--disk-gb", type=float, default=2.0, help="GiB written twice to time the disk (default 2)")
    args = ap.parse_args()
    dev = args.device
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    model = build_model(args)
    tc = text_config(model.config)
    aux = methods.get(methods.DEFAULT_METHOD).default_aux_layer_ids(tc.num_hidden_layers)
    n_params = sum(p.numel() for p in model.parameters())
    emb = tc.vocab_size * tc.hidden_size * (1 if getattr(tc, "tie_word_embeddings", False) else 2)
    non_emb = n_params - emb
    peak = matmul_tflops(dev)
    B, T = args.batch, args.seq
    rng = np.random.default_rng(0)
    batches = [torch.from_numpy(rng.integers(0, tc.vocab_size, (B, T))).to(dev) for _ in range(args.batches)]
    tokens = args.batches * B * T
    base = model.model

    res = {"device": torch.cuda.get_device_name() if dev.startswith("cuda") else f"cpu x{os.cpu_count()}",
           "model": {"layers": tc.num_hidden_layers, "hidden": tc.hidden_size, "parameters": n_params,
                     "non_embedding_parameters": non_emb, "dtype": str(model.dtype)},
           "batch": [B, T], "tokens_timed": tokens, "aux_layer_ids": aux, "matmul_tflops": peak}

    def figures(seconds):
        tps = tokens / seconds
        mfu = 2 * non_emb * tps / (peak * 1e12) if peak else None
        return {"seconds": round(seconds, 3), "tokens_per_s": round(tps, 1), "mfu": None if mfu is None else round(mfu, 4)}

    with torch.inference_mode():
        res["plain_forward"] = figures(time_loop(lambda b: base(input_ids=b, use_cache=False), batches, dev))

        def naive(b):
            hs = base(input_ids=b, use_cache=False, output_hidden_states=True).hidden_states
            keep = [hs[i] for i in aux] + [hs[-1]]
            return [h.cpu() for h in keep]  # synchronous copy to host

        res["naive_capture"] = figures(time_loop(naive, batches, dev))

    # Our capture: a tokens file of the same batches, one shard, written to local disk.
    samples = [(f"s{k}", b[r].cpu().numpy().astype(np.int32), np.ones(T, np.uint8))
               for k, b in enumerate(batches) for r in range(B)]
    write_tokens(out / "tokens.safetensors", samples + samples[:B])  # + one warm-up batch
    variants = [("bfloat16", 4, False), ("float8_e4m3fn", 4, False)] + (
        [("bfloat16", 1, False), ("bfloat16", 4, True)] if args.variants else [])
    for storage, threads, fsync in variants:
        name = f"capture_{storage}" + ("" if (threads, fsync) == (4, False) else f"_threads{threads}{'_fsync' if fsync else ''}")
        shard = CaptureSettings(target_dir=None, tokens_path=out / "tokens.safetensors",
                                out_path=out / "warmup.safetensors", start=len(samples), count=B, aux_layer_ids=aux,
                                target_fingerprint="bench", split="train", device=dev, storage_dtype=storage,
                                tokens_per_batch=B * T)
        capture_shard(shard, model=model)
        sync(dev)
        t = time.perf_counter()
        capture_shard(dataclasses.replace(shard, out_path=out / "shard.safetensors", start=0, count=len(samples),
                                          writer_threads=threads, fsync=fsync), model=model)
        sync(dev)
        seconds = time.perf_counter() - t
        size = (out / "shard.safetensors").stat().st_size
        res[name] = {**figures(seconds), "shard_bytes": size, "bytes_per_token": round(size / tokens, 1),
                     "writer_threads": threads, "fsync": fsync,
                     "ratio_to_plain_forward": round(res["plain_forward"]["seconds"] / seconds, 3)}
        (out / "shard.safetensors").unlink()
    res["naive_capture"]["ratio_to_plain_forward"] = round(res["plain_forward"]["seconds"] / res["naive_capture"]["seconds"], 3)
    res["bytes_per_token_public_tools"] = 8 * tc.hidden_size
    res["disk_write_gb_per_s"] = disk_write_rate(out, args.disk_gb)
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
