"""Benchmark: draft-head training throughput and FLOP utilisation; our loop beside speculators' Trainer.

GPU (issue 6): synthetic shards at hidden 4096, target vocab 128,256, draft vocab 32,000
(Llama-3.1-8B's shape), 2048-token samples:

    python benchmarks/train_throughput.py --device cuda --speculators-trainer --json out.json

CPU, a small shape:

    .venv/bin/python benchmarks/train_throughput.py --device cpu --hidden 576 --vocab 49152 \
        --draft-vocab 8192 --samples 16 --seq 512 --total-seq-len 1024 --epochs 1

The synthetic data is learnable, so the simulated acceptance length means something: the
target's last hidden state at position t is a fixed random vector of token t (a table over
``--distinct`` tokens), so the target's next-token distribution is a function of the token
the draft reads. Prints tokens/s, model FLOP utilisation (``draft_flops_per_token`` x
tokens/s against the bf16 matmul rate measured in the same run) and the simulated τ, for
our loop and, with ``--speculators-trainer``, for speculators' own Trainer on the same
model, shards, batches and settings.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]

from eagle3build.data.prepare_data import write_tokens  # noqa: E402
from eagle3build.draft import vocab_map  # noqa: E402
from eagle3build.formats.artifacts import minimal_decisions  # noqa: E402
from eagle3build.formats.shards import ShardMeta, write_shard  # noqa: E402
from eagle3build.train import build_vocab_map, train_draft  # noqa: E402
from eagle3build.train.train_data import Batches, BatchLayout, shard_dataset_class  # noqa: E402


def peak_tflops(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    return 10 * 2 * 8192**3 / (time.perf_counter() - t) / 1e12


def fake_target(d: Path, hidden: int, vocab: int, heads: int | None = None, kv_heads: int | None = None) -> None:
    """Config of Llama-3.1-8B's shape (hidden/vocab overridable; ``heads``, ``kv_heads``: attention heads, by default
    one per 128 and 512 of ``hidden``) plus only the tensors the draft takes from its verifier: embeddings, lm_head,
    final norm. SmolLM2-135M's shape: hidden 576, vocab 49,152, 9 heads, 3 KV heads (its config.json)."""
    cfg = json.loads((REPO / "examples/targets/llama-3.1-8b-instruct-shape/config.json").read_text())
    cfg.update(bos_token_id=1, eos_token_id=2, hidden_size=hidden, vocab_size=vocab,
               num_attention_heads=heads or max(1, hidden // 128), num_key_value_heads=kv_heads or max(1, hidden // 512),
               intermediate_size=int(hidden * 3.5))
    cfg["head_dim"] = hidden // cfg["num_attention_heads"]
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    from safetensors.torch import save_file

    save_file({
        "model.embed_tokens.weight": (torch.randn(vocab, hidden, generator=g) * 0.02).bfloat16(),
        # logits of std ~5 over the normalised last state: a peaked next-token distribution
        "lm_head.weight": (torch.randn(vocab, hidden, generator=g) * 5 / hidden**0.5).bfloat16(),
        "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
    }, str(d / "model.safetensors"))


def synthetic_shards(d: Path, n_train: int, n_eval: int, seq: int, hidden: int, vocab: int, distinct: int,
                     storage_dtype: str = "bfloat16", min_seq: int | None = None) -> dict:
    """Train and eval shards of ``n_train`` / ``n_eval`` samples in ``storage_dtype`` (``bfloat16`` or
    ``float8_e4m3fn``, as capture.storage_dtype), each ``seq`` tokens, or a length drawn uniformly from
    ``[min_seq, seq]`` where ``min_seq`` is given (chat data packs several uneven samples per row)."""
    from safetensors import safe_open

    g = torch.Generator().manual_seed(1)
    tokens = torch.randperm(vocab, generator=g)[:distinct]
    with safe_open(str(d / "target" / "model.safetensors"), "pt") as f:
        # token -> the target's last hidden state: the token's own embedding, which the draft reads
        table = f.get_tensor("model.embed_tokens.weight")[tokens].float()
    out = {}
    for split, n in (("train", n_train), ("eval", n_eval)):
        ids, hs, last, masks = [], [], [], []
        for _ in range(n):
            length = seq if min_seq is None else int(torch.randint(min_seq, seq + 1, (1,), generator=g))
            k = torch.randint(0, distinct, (length,), generator=g)
            ids.append(tokens[k])
            hs.append(torch.randn(length, 3 * hidden, generator=g).bfloat16())
            last.append(table[k].bfloat16())
            masks.append(torch.ones(length, dtype=torch.uint8))
        meta = ShardMeta("bench", [2, 16, 29], storage_dtype, hidden, [f"{split}{i}" for i in range(n)], split)
        write_shard(d / f"{split}.safetensors", meta, hs, last, ids, masks)
        write_tokens(d / f"{split}-tokens.safetensors", [(f"{split}{i}", ids[i].numpy().astype(np.int32),
                                                          masks[i].numpy()) for i in range(n)])
        out[split] = str(d / f"{split}.safetensors")
    (d / "decisions.json").write_text(json.dumps(minimal_decisions("bench", [2, 16, 29], vocab)))
    return out


def compute_only(args, d: Path, shards: dict, steps: int = 20) -> dict:
    """Steps/s with one batch already on the GPU: the compute ceiling, without data loading."""
    from speculators.losses import resolve_loss_config

    d2t, t2d, _ = vocab_map.load(d / "d2t.npy", d / "t2d.npy", d / "vocab.json")
    model = train_draft.build_model(str(d / "target"), [2, 16, 29], d2t, t2d, args.ttt_steps, "eagle3.1", args.device,
                                    trust_remote_code=False)
    b = Batches([shards["train"]], BatchLayout(args.total_seq_len, args.hidden, 3, torch.bfloat16, args.seed,
                                               noise_std=0.0, dequantize_on_device=True))
    batch = b.to_device(b.load(b.epoch(0)[0][0]), args.device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
    call = {"ttt_steps": args.ttt_steps, "ttt_step_loss_decay": 1.0,
            "loss_config": resolve_loss_config("kl_div", implementation=args.loss)}

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss, _ = model(**batch, **call)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    s = time.perf_counter() - t
    tokens = int((batch["document_ids"] != -1).sum()) * steps
    out = {"steps_per_s": round(steps / s, 2), "tokens_per_s": round(tokens / s, 1), "step_ms": round(1e3 * s / steps, 2)}
    if args.profile:
        try:
            out.update(_profile(step))
        except Exception as e:  # noqa: BLE001 - a profiler that fails leaves the timed figures standing
            out["profile_error"] = f"{type(e).__name__}: {e}"
    return out


def _profile(step, n: int = 5) -> dict:
    """``n`` steps under torch's profiler: the top kernels (printed), each step's wall and kernel milliseconds and
    the GPU's busy share (kernel time over wall time)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    ev = prof.key_averages()
    print(ev.table(sort_by="device_time_total", row_limit=30, max_name_column_width=70))
    # the kernels' own time per step against the step's wall time (profiled): 1.0 = the GPU never waits for the
    # host (work-bound); well below = the host's dispatch and syncs bound the step
    kernel_us = sum(e.self_device_time_total for e in ev if e.device_type == torch.autograd.DeviceType.CUDA)
    return dict(profiled_step_ms=round(1e3 * wall / n, 2), kernel_ms_per_step=round(kernel_us / 1e3 / n, 2),
                gpu_busy_share=round(kernel_us / 1e6 / wall, 3),
                top_kernels_ms_per_step={e.key[:80]: round(e.self_device_time_total / 1e3 / n, 3)
                                         for e in sorted(ev, key=lambda e: -e.self_device_time_total)[:15]})


def loader_only(args, shards: dict, steps: int = 40) -> dict:
    """Milliseconds per step to read, cast and collate one packed row from the shards (``train_data.Batches.load``,
    and pinning on CUDA) on this thread alone: the loader's cost, which overlaps the trainer's only where the
    background thread gets the interpreter."""
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    b = Batches([shards["train"]], BatchLayout(args.total_seq_len, args.hidden, 3, dtype, args.seed, noise_std=0.0,
                                               dequantize_on_device=args.device.startswith("cuda")
                                               and not args.host_dequantize))
    plan = b.epoch(0)[:steps]
    pin = torch.cuda.is_available() and args.device.startswith("cuda")
    t = time.perf_counter()
    for step in plan:
        row = b.load(step[0])
        if pin:
            {k: v.pin_memory() for k, v in row.items() if isinstance(v, torch.Tensor)}
    s = time.perf_counter() - t
    return {"steps": len(plan), "step_ms": round(1e3 * s / max(len(plan), 1), 2)}


def run_speculators_trainer(args, d: Path, shards: dict, device: str) -> dict:
    """speculators' Trainer on the same model, shards, packing, collation and settings."""
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import CollateFn
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
    from speculators.train.trainer import Trainer, TrainerConfig
    from torch.utils.data import DataLoader

    d2t, t2d, _ = vocab_map.load(d / "d2t.npy", d / "t2d.npy", d / "vocab.json")
    torch.manual_seed(args.seed)
    model = train_draft.build_model(str(d / "target"), [2, 16, 29], d2t, t2d, args.ttt_steps, "eagle3.1", "cpu",
                                    trust_remote_code=False)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32

    def loader(path):
        ds = shard_dataset_class()([path], args.total_seq_len, dtype, noise_std=0.0, seed=args.seed)
        sampler = MultipackDistributedBatchSamplerV2(batch_max_length=args.total_seq_len, lengths=ds.approx_lengths,
                                                     num_replicas=1, rank=0, seed=args.seed)
        return DataLoader(ds, batch_sampler=sampler, num_workers=2, pin_memory=device.startswith("cuda"),
                          collate_fn=CollateFn(args.total_seq_len, args.hidden, 3, dtype=dtype, preprocess=shift_batch))

    train_loader, val_loader = loader(shards["train"]), loader(shards["eval"])
    lc = resolve_loss_config("kl_div", implementation=args.loss)
    call = {"ttt_steps": args.ttt_steps, "ttt_step_loss_decay": 1.0, "loss_config": lc}
    cfg = TrainerConfig(lr=args.lr, num_epochs=args.epochs, save_path=str(d / "spec-ckpt"), train_call_kwargs=call,
                        val_call_kwargs=call, weight_decay=0.0, scheduler_type="cosine", scheduler_warmup_ratio=0.05,
                        hidden_states_dtype=torch.bfloat16 if device.startswith("cuda") else torch.float32,
                        log_freq=10**9)
    trainer = Trainer(model, cfg, train_loader, val_loader)
    tokens = 0
    for batch in train_loader:
        tokens += int((batch["document_ids"] != -1).sum())
    tokens *= args.epochs
    t = time.perf_counter()
    val = {}
    for epoch in range(args.epochs):
        trainer.train_epoch(epoch)
        val = trainer.val_epoch(epoch) or {}
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    acc = [val[f"full_acc_{k}_epoch"] for k in range(args.ttt_steps) if f"full_acc_{k}_epoch" in val]
    return {"seconds": round(seconds, 2), "tokens": tokens, "tokens_per_s": round(tokens / seconds, 1),
            "full_acc_per_step": acc, "simulated_acceptance_length": 1 + sum(acc)}


def loader_ab(args, shards: dict) -> dict:
    """``--loader-only``: the loader's ms a step with fp8 dequantised on its thread (``host``) and kept packed for the
    device (``packed``), one after the other on this thread (``loader_only``), and their ratio; printed, written to
    ``--json`` and, with ``--record``, as the record ``train-loader``."""
    res = {}
    for name, host in (("host", True), ("packed", False)):
        args.host_dequantize = host
        dev = args.device
        args.device = "cuda"  # the path a GPU run takes (packed only there); nothing is moved to a device here
        try:
            res[name] = loader_only(args, shards, steps=args.samples)
        finally:
            args.device = dev
    res["host_over_packed"] = round(res["host"]["step_ms"] / res["packed"]["step_ms"], 2)
    res["shape"] = {"hidden": args.hidden, "total_seq_len": args.total_seq_len, "seq": [args.min_seq, args.seq],
                    "storage_dtype": args.storage_dtype}
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    if args.record:
        import subprocess
        import sys

        sys.path.insert(0, str(REPO / "benchmarks"))
        from benchlab import records

        from eagle3build.config.provenance import hardware, software_versions

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip()
        cmd = "python benchmarks/train_throughput.py " + " ".join(
            a for a in sys.argv[1:] if not a.startswith("--record") and a != str(args.record))
        rec = records.make_record("train-loader", command=cmd, commit=commit, versions=software_versions(),
                                  hardware=hardware(), results=records.flatten(res))
        print(f"wrote {records.write_record(args.record, rec)}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--distinct", type=int, default=2000, help="distinct tokens in the synthetic data")
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--eval-samples", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--total-seq-len", type=int, default=2048)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--speculators-trainer", action="store_true")
    ap.add_argument("--loss", default="eager", choices=["eager", "fused"], help="speculators' loss implementation")
    ap.add_argument("--profile", action="store_true", help="print the top CUDA kernels of the compute-only steps")
    ap.add_argument("--skip-ours", action="store_true")
    ap.add_argument("--heads", type=int, default=None, help="attention heads (default hidden / 128; SmolLM2: 9)")
    ap.add_argument("--kv-heads", type=int, default=None, help="KV heads (default hidden / 512; SmolLM2: 3)")
    ap.add_argument("--storage-dtype", default="bfloat16", choices=["bfloat16", "float8_e4m3fn"],
                    help="the shards' states, as capture.storage_dtype (the GPU recipe: float8_e4m3fn)")
    ap.add_argument("--min-seq", type=int, default=None,
                    help="sample lengths uniform in [min-seq, seq] (default: all seq tokens)")
    ap.add_argument("--ttt-step-loss-decay", type=float, default=1.0)
    ap.add_argument("--checkpoint-every", type=int, default=0, help="train.checkpoint_every (the recipe: 500)")
    ap.add_argument("--host-dequantize", action="store_true",
                    help="fp8 shards dequantised on the loader's thread, as before issue 65 (the A/B's other side)")
    ap.add_argument("--skip-compute-only", action="store_true", help="leave out the one-batch compute ceiling")
    ap.add_argument("--loader-only", action="store_true",
                    help="time the loader alone (ms a step), fp8 dequantised on its thread and kept packed for the "
                         "device (train_data.BatchLayout.dequantize_on_device), nothing trained: the CPU record")
    ap.add_argument("--record", type=Path, default=None, help="with --loader-only: write the record train-loader here")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    d = Path(args.out or tempfile.mkdtemp(prefix="train-bench-"))
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    t = time.perf_counter()
    fake_target(d / "target", args.hidden, args.vocab, args.heads, args.kv_heads)
    shards = synthetic_shards(d, args.samples, args.eval_samples, args.seq, args.hidden, args.vocab, args.distinct,
                              args.storage_dtype, args.min_seq)
    build_vocab_map.build(d / "train-tokens.safetensors", args.vocab, args.draft_vocab, d / "d2t.npy", d / "t2d.npy",
                          d / "vocab.json")
    setup_s = time.perf_counter() - t
    if args.loader_only:
        loader_ab(args, shards)
        return
    if args.host_dequantize:  # the trainer's layouts without BatchLayout.dequantize_on_device
        train_draft.BatchLayout = lambda *a, **k: BatchLayout(*a, **{**k, "dequantize_on_device": False})
    peak = peak_tflops(args.device)
    if args.device.startswith("cuda"):
        # One compiled forward serves every model instance of this process; let dynamo keep a
        # graph per instance and mode instead of falling back to eager after 8.
        torch._dynamo.config.cache_size_limit = 64
        torch._dynamo.config.accumulated_cache_size_limit = 512
        # Warm-up (untimed): compile before either timed run, so neither pays for it.
        train_draft.train(target_dir=str(d / "target"), train_shards=[shards["train"]], eval_shards=[shards["eval"]],
                          d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"), vocab_json=str(d / "vocab.json"),
                          decisions_json=str(d / "decisions.json"), out_dir=str(d / "warmup"), epochs=1, max_steps=4,
                          total_seq_len=args.total_seq_len, ttt_steps=args.ttt_steps, head_variant="eagle3.1",
                          loss_implementation=args.loss, device=args.device)
    m = train_draft.train(target_dir=str(d / "target"), train_shards=[shards["train"]], eval_shards=[shards["eval"]],
                          d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"), vocab_json=str(d / "vocab.json"),
                          decisions_json=str(d / "decisions.json"), out_dir=str(d / "ours"), epochs=args.epochs,
                          lr=args.lr, total_seq_len=args.total_seq_len, ttt_steps=args.ttt_steps, seed=args.seed,
                          head_variant="eagle3.1", loss_implementation=args.loss, device=args.device,
                          ttt_step_loss_decay=args.ttt_step_loss_decay, checkpoint_every=args.checkpoint_every)
    fpt = m["flops_per_token"]
    res = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu x{os.cpu_count()}",
        "loss_implementation": args.loss,
        "dequantize": "host" if args.host_dequantize else "device",
        "storage_dtype": args.storage_dtype,
        "shape": {"hidden": args.hidden, "vocab": args.vocab, "draft_vocab": args.draft_vocab, "seq": args.seq,
                  "total_seq_len": args.total_seq_len, "ttt_steps": args.ttt_steps, "train_samples": args.samples,
                  "epochs": args.epochs},
        "setup_seconds": round(setup_s, 1),
        "matmul_tflops": peak,
        "flops_per_token": fpt,
        "ours": {"seconds": m["seconds"], "steps": m["steps"], "tokens_per_s": m["tokens_per_s"],
                 "steps_per_s": round(m["steps"] / m["seconds"], 3),
                 "mfu": round(fpt * m["tokens_per_s"] / (peak * 1e12), 4) if peak else None,
                 "step_ms": round(1e3 * m["seconds"] / max(m["steps"], 1), 2),
                 "prefetch": m["prefetch"],
                 "full_acc_per_step": m["final_eval"]["full_acc_per_step"],
                 "simulated_acceptance_length": m["final_eval"]["simulated_acceptance_length"]},
        "loader_only": loader_only(args, shards),
    }
    if args.device.startswith("cuda") and not args.skip_compute_only:
        c = compute_only(args, d, shards)
        c["mfu"] = round(fpt * c["tokens_per_s"] / (peak * 1e12), 4)
        res["compute_only_one_batch_on_gpu"] = c
    if args.speculators_trainer:
        s = run_speculators_trainer(args, d, shards, args.device)
        s["mfu"] = round(fpt * s["tokens_per_s"] / (peak * 1e12), 4) if peak else None
        res["speculators_trainer"] = s
        res["ours_vs_speculators_tokens_per_s"] = round(res["ours"]["tokens_per_s"] / s["tokens_per_s"], 3)
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    if not args.out:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
