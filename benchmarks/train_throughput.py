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

The training step's paths (issue 70; ``--step-ab``, ``step_ab``): ``eager``, ``speculators`` (its compile of the
forward: today's CUDA path) and ``whole`` (``train.compile``: forward, loss and backward as few large graphs, CUDA
graphs on CUDA), one after the other in one process on the same batch: ms a step, ops, compiled graphs and graph
breaks a step, recompiles, and on CUDA kernel launches and the GPU's busy share. ``--baseline-compile speculators``
trains once more the old way in the same process: steps/s and simulated τ of both. On this CPU, the record
``train-step-graphs`` (2 threads, the recipe's shape):

    OMP_NUM_THREADS=2 taskset -c 0,1 .venv/bin/python benchmarks/train_throughput.py --device cpu --hidden 576 \
        --vocab 49152 --draft-vocab 32000 --heads 9 --kv-heads 3 --seq 2048 --total-seq-len 8192 --ttt-steps 5 \
        --samples 8 --eval-samples 1 --storage-dtype float8_e4m3fn --skip-ours --step-ab --compile default \
        --step-warmup 2 --steps 2 --profile-steps 1 --record benchmarks/records
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
from eagle3build.train.trainer import loss_implementation  # noqa: E402


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

    # a word-level tokenizer over the vocab: P-EAGLE and DFlash resolve their mask token from the target's tokenizer
    # (speculators' resolve_mask_token_id: none free, so the pad token)
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t2", eos_token="t2", bos_token="t1").save_pretrained(d)
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
    """Steps/s with one batch already on the GPU: the compute ceiling, without data loading, of the step as it was
    before issue 70 (speculators' compile of the forward, ``--baseline-loss``; ``--step-ab`` compares the paths)."""
    from speculators.losses import resolve_loss_config

    d2t, t2d, _ = vocab_map.load(d / "d2t.npy", d / "t2d.npy", d / "vocab.json")
    model = train_draft.build_model(str(d / "target"), [2, 16, 29], d2t, t2d, args.ttt_steps, "eagle3.1", args.device,
                                    trust_remote_code=False)
    b = Batches([shards["train"]], BatchLayout(args.total_seq_len, args.hidden, 3, torch.bfloat16, args.seed,
                                               noise_std=0.0, dequantize_on_device=True))
    batch = b.to_device(b.load(b.epoch(0)[0][0]), args.device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
    call = {"ttt_steps": args.ttt_steps, "ttt_step_loss_decay": 1.0,
            "loss_config": resolve_loss_config("kl_div",
                                               implementation=loss_implementation(args.baseline_loss, args.device))}

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


STEP_PATHS = {
    "eager": "nothing compiled (train.compile off): today's CPU path",
    "speculators": "speculators' own torch.compile of the forward, default mode, its graph breaks (train.compile "
                   "speculators): today's CUDA path; on a CPU emulated, compiled as conditional_torch_compile compiles "
                   "it on CUDA",
    "whole": "the model's call (forward, loss, backward) compiled whole (train.compile and train.compile_breaks as "
             "--compile and --compile-breaks, the loss --loss; whole:MODE:BREAKS:LOSS names them, any left out as "
             "those flags say: whole:reduce-overhead:remove:fused)",
}


def whole_settings(args, path: str) -> tuple[str, str, str]:
    """``(train.compile, train.compile_breaks, train.loss_implementation)`` of a ``whole[:MODE[:BREAKS[:LOSS]]]``
    step path: each part given, else ``--compile``, ``--compile-breaks``, ``--loss``.

    Raises:
        SystemExit: more than four parts.
    """
    parts = path.split(":")[1:]
    if len(parts) > 3:
        raise SystemExit(f"--step-paths: {path!r} is not whole[:MODE[:BREAKS[:LOSS]]]")
    got = [*parts, *[""] * (3 - len(parts))]
    return got[0] or args.compile, got[1] or args.compile_breaks, got[2] or args.loss


def _step_trainer(args, d: Path, shards: dict, path: str):
    """``train_draft.setup``'s Trainer for step path ``path`` (``STEP_PATHS``) and its loaded first batch: the real
    step (``trainer.train_step``: batch to the device, forward, loss, backward, clip, AdamW, scheduler). The baseline
    paths get the optimizer as it was before issue 70 (fused on CUDA, per-parameter on CPU) and ``--baseline-loss``;
    ``whole`` the run's (fused on CUDA, foreach elsewhere) and ``--loss``."""
    from eagle3build.draft.choice import resolve
    from eagle3build.train import compiled
    from eagle3build.train.trainer import TrainConfig, TrainInputs

    cuda = args.device.startswith("cuda")
    if path.startswith("whole"):
        setting, breaks, loss = whole_settings(args, path)
    else:
        setting, breaks, loss = "speculators" if path == "speculators" and cuda else "off", "keep", args.baseline_loss
    cfg = TrainConfig(total_seq_len=args.total_seq_len, ttt_steps=args.ttt_steps, lr=args.lr, seed=args.seed,
                      ttt_step_loss_decay=args.ttt_step_loss_decay, head_variant="eagle3.1", checkpoint_every=0,
                      loss_implementation=loss, compile=setting, compile_breaks=breaks)
    inputs = TrainInputs(target_dir=str(d / "target"), train_shards=[shards["train"]], eval_shards=[],
                         d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"), vocab_json=str(d / "vocab.json"),
                         decisions_json=str(d / "decisions.json"), out_dir=str(d / f"step-{path.replace(':', '-')}"))
    t = train_draft.setup(cfg, inputs, args.device, trust_remote_code=False, draft=resolve({"method": args.method}))
    if path == "speculators" and not cuda:  # as conditional_torch_compile compiles it where CUDA is available
        t.plan = compiled.CompilePlan(speculators=True, emulate=True)
        compiled.compile_model(t.model, t.plan)
    if not path.startswith("whole"):  # the optimizer before issue 70 (fused on CUDA, else per parameter)
        t.opt = torch.optim.AdamW(t.params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=cuda)
        t.sched = torch.optim.lr_scheduler.LambdaLR(t.opt, lambda _: 1.0)
    rows = [t.train_b.load(r) for r in t.train_b.epoch(0)[0]]
    if cuda:
        rows = [{k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in r.items()} for r in rows]
    return t, rows


def step_path(args, d: Path, shards: dict, path: str) -> dict:
    """One ``STEP_PATHS`` path on one batch: ``--step-warmup`` untimed steps (compilation; ``compile_s``), ``--steps``
    timed (``step_ms``, ``steps_per_s``), ``--profile-steps`` profiled (``benchlab.step_profile.profile_steps``:
    ops, graphs and graph breaks a step; on CUDA launches and the GPU's busy share), dynamo's counts over the warm-up
    (``warmup.*``) and the timed steps (``steady.*``: no new break or recompile expected), the first step's loss
    (``first_loss``, the same weights and batch on every path) and the plan (``plan``)."""
    import gc

    from benchlab.step_profile import DynamoCounts, profile_steps

    from eagle3build.train.trainer import Throughput, train_step

    cuda = args.device.startswith("cuda")
    torch._dynamo.reset()
    t, rows = _step_trainer(args, d, shards, path)
    speed = Throughput()

    def step():
        return train_step(t, rows, speed)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    dyn = DynamoCounts().start()
    t0 = time.perf_counter()
    acc, _ = step()
    first_loss = float(acc["loss_sum"])
    for _ in range(args.step_warmup - 1):
        step()
    sync()
    out = {"plan": t.plan.describe(), "loss": t.call_kwargs["loss_config"]["kl_div"][0].__module__,
           "compile_s": round(time.perf_counter() - t0, 1), "first_loss": round(first_loss, 5),
           "warmup": dyn.read()}
    dyn = DynamoCounts().start()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    s = time.perf_counter() - t0
    out.update(step_ms=round(1e3 * s / args.steps, 2), steps_per_s=round(args.steps / s, 3), steady=dyn.read())
    out.update(profile_steps(step, args.profile_steps, cuda))
    t = rows = None  # free this path's model before the next
    gc.collect()
    return out


def step_ab(args, d: Path, shards: dict) -> dict:
    """``--step-ab``: the training step's paths (``--step-paths``: ``STEP_PATHS``, ``whole`` with its settings as
    ``whole_settings`` reads them) one after the other in this process, each on the same batch from the same initial
    weights (``step_path``), and the ratios of each ``whole`` path to each baseline path (``eager``,
    ``speculators``): ``<whole path>_over_<baseline>.{kernel_ops,dispatched_ops,step_ms}``. On CPU inductor's C++
    kernels are named in the profile (``cpp.enable_kernel_profile``), so that they count as ops."""
    import torch._inductor.config as inductor_config

    if not args.device.startswith("cuda"):
        inductor_config.cpp.enable_kernel_profile = True
    paths = args.step_paths.split(",")
    bad = [p for p in paths if p.split(":")[0] not in STEP_PATHS or (":" in p and not p.startswith("whole:"))]
    if bad:
        raise SystemExit(f"--step-paths: {bad} are not among {list(STEP_PATHS)} (or whole:MODE:BREAKS:LOSS)")
    res = {}
    for p in paths:  # each path's figures printed as it finishes: a run cut by its call's end keeps those done
        res[p] = step_path(args, d, shards, p)
        print(f"step path {p}: {json.dumps(res[p])}", flush=True)
    for q in [p for p in paths if p.startswith("whole")]:
        for p in [p for p in paths if not p.startswith("whole")]:
            res[f"{q}_over_{p}"] = {k: round(res[q][k] / res[p][k], 3)
                                    for k in ("kernel_ops", "dispatched_ops", "step_ms") if res[p][k]}
    res["paths"] = {p: STEP_PATHS[p.split(":")[0]] for p in paths}
    return res


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
    lc = resolve_loss_config("kl_div", implementation=loss_implementation(args.loss, args.device))
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
        write_record(args, "train-loader", res)
    return res


def write_record(args, name: str, res: dict, notes: str | None = None) -> Path:
    """``res`` as the record ``name`` in ``--record`` (``benchlab.records``: the command without ``--record``, this
    commit, the versions, the hardware, the results flattened); returns its path."""
    import subprocess
    import sys

    from benchlab import records

    from eagle3build.config.provenance import hardware, software_versions

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    argv, skip = [], False
    for a in sys.argv[1:]:
        if skip or a.startswith("--record") or a.startswith("--out"):
            skip = a in ("--record", "--out")
            continue
        argv.append(a)
    cmd = "python benchmarks/train_throughput.py " + " ".join(argv)
    rec = records.make_record(name, command=cmd, commit=commit, versions=software_versions(), hardware=hardware(),
                              results=records.flatten(res), notes=notes)
    path = records.write_record(args.record, rec)
    print(f"wrote {path}")
    return path


def train_run(args, d: Path, shards: dict, out: str, compile_setting: str, loss: str, **kw) -> dict:
    """``train_draft.train`` over the synthetic shards with ``train.compile`` ``compile_setting`` and
    ``train.compile_breaks`` ``--compile-breaks``, the loss ``loss``, the method ``--method`` (keyword ``kw`` over the
    run's settings): its metrics.json."""
    run = dict(target_dir=str(d / "target"), train_shards=[shards["train"]], eval_shards=[shards["eval"]],
               d2t_path=str(d / "d2t.npy"), t2d_path=str(d / "t2d.npy"), vocab_json=str(d / "vocab.json"),
               decisions_json=str(d / "decisions.json"), out_dir=str(d / out), epochs=args.epochs, lr=args.lr,
               total_seq_len=args.total_seq_len, ttt_steps=args.ttt_steps, seed=args.seed, head_variant="eagle3.1",
               loss_implementation=loss, device=args.device, ttt_step_loss_decay=args.ttt_step_loss_decay,
               checkpoint_every=args.checkpoint_every, compile=compile_setting, compile_breaks=args.compile_breaks,
               draft={"method": args.method})
    return train_draft.train(**{**run, **kw})


def run_summary(m: dict, peak: float | None) -> dict:
    """A training run's figures from its metrics.json ``m``: seconds, steps, tokens/s, steps/s, ms a step, MFU
    (against ``peak`` TFLOP/s), the loader's waits, accuracy per TTT step and the simulated τ."""
    fpt = m["flops_per_token"]
    return {"seconds": m["seconds"], "steps": m["steps"], "tokens_per_s": m["tokens_per_s"],
            "steps_per_s": round(m["steps"] / m["seconds"], 3),
            "mfu": round(fpt * m["tokens_per_s"] / (peak * 1e12), 4) if peak else None,
            "step_ms": round(1e3 * m["seconds"] / max(m["steps"], 1), 2), "prefetch": m["prefetch"],
            "full_acc_per_step": m["final_eval"]["full_acc_per_step"],
            "simulated_acceptance_length": m["final_eval"]["simulated_acceptance_length"]}


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
    ap.add_argument("--loss", default="eager", choices=["eager", "fused", "auto"],
                    help="train.loss_implementation of our runs (auto: fused on CUDA)")
    ap.add_argument("--baseline-loss", default="eager", choices=["eager", "fused", "auto"],
                    help="the loss of --baseline-compile's run and of the step A/B's baseline paths")
    ap.add_argument("--compile", default="auto", help="train.compile of our run and the step A/B's whole path: auto | "
                    "off | speculators | default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs")
    ap.add_argument("--compile-breaks", default="auto",
                    help="train.compile_breaks: auto | keep | remove | first_layer | mask_extension")
    ap.add_argument("--baseline-compile", default=None,
                    help="also train with this train.compile first (e.g. speculators, before issue 70), in this "
                         "process: steps/s and simulated tau of both, and their ratios")
    ap.add_argument("--method", default="eagle3", choices=["eagle3", "peagle", "dflash"], help="draft.method")
    ap.add_argument("--step-ab", action="store_true",
                    help="the training step's paths (--step-paths) on one batch: ms a step, ops, graphs and graph "
                         "breaks a step, recompiles, on CUDA the GPU's busy share (step_ab)")
    ap.add_argument("--step-paths", default="eager,speculators,whole",
                    help=f"comma-separated, of {', '.join(STEP_PATHS)}; whole:MODE:BREAKS:LOSS for a whole path's "
                         "own train.compile, train.compile_breaks and loss (each part left empty: the flag's)")
    ap.add_argument("--step-warmup", type=int, default=3, help="untimed steps a path (compilation, CUDA graphs)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps a path (--step-ab)")
    ap.add_argument("--profile-steps", type=int, default=3, help="profiled steps a path (--step-ab)")
    ap.add_argument("--profile", action="store_true", help="print the top CUDA kernels of the compute-only steps")
    ap.add_argument("--skip-ours", action="store_true", help="no training run (with --step-ab: the step A/B alone)")
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
    ap.add_argument("--record", type=Path, default=None,
                    help="write the record here: train-loader (--loader-only) or train-step-graphs (--step-ab)")
    ap.add_argument("--record-notes", default=None, help="the record's notes (conditions of the measurement)")
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
    cuda = args.device.startswith("cuda")
    peak = peak_tflops(args.device)
    res = {
        "device": torch.cuda.get_device_name() if cuda else f"cpu x{os.cpu_count()}",
        "threads": torch.get_num_threads(), "method": args.method,
        "loss_implementation": args.loss, "compile": args.compile, "compile_breaks": args.compile_breaks,
        "dequantize": "host" if args.host_dequantize else "device",
        "storage_dtype": args.storage_dtype,
        "shape": {"hidden": args.hidden, "vocab": args.vocab, "draft_vocab": args.draft_vocab, "seq": args.seq,
                  "total_seq_len": args.total_seq_len, "ttt_steps": args.ttt_steps, "train_samples": args.samples,
                  "epochs": args.epochs, "heads": args.heads, "kv_heads": args.kv_heads},
        "setup_seconds": round(setup_s, 1),
        "matmul_tflops": peak,
    }
    if not args.skip_ours:
        if cuda:
            # One compiled forward serves every model instance of this process; let dynamo keep a
            # graph per instance and mode instead of falling back to eager after 8.
            torch._dynamo.config.cache_size_limit = 64
            torch._dynamo.config.accumulated_cache_size_limit = 512
        runs = [("baseline", args.baseline_compile, args.baseline_loss)] if args.baseline_compile else []
        runs.append(("ours", args.compile, args.loss))
        for name, setting, loss in runs:
            if cuda:  # warm-up (untimed): compile before the timed run, so that it does not pay for it
                train_run(args, d, shards, f"warmup-{name}", setting, loss, epochs=1, max_steps=4,
                          checkpoint_every=0)
            m = train_run(args, d, shards, name, setting, loss)
            res["flops_per_token"] = m["flops_per_token"]
            res[name] = {"compile": setting, "loss": loss, **run_summary(m, peak)}
        if args.baseline_compile:
            b, o = res["baseline"], res["ours"]
            res["ours_over_baseline"] = {
                "steps_per_s": round(o["steps_per_s"] / b["steps_per_s"], 3),
                "simulated_tau_rel_diff": round(o["simulated_acceptance_length"] / b["simulated_acceptance_length"]
                                                - 1, 4)}
        res["loader_only"] = loader_only(args, shards)
    if cuda and not args.skip_compute_only:
        c = compute_only(args, d, shards)
        if "flops_per_token" in res:
            c["mfu"] = round(res["flops_per_token"] * c["tokens_per_s"] / (peak * 1e12), 4)
        res["compute_only_one_batch_on_gpu"] = c
    if args.speculators_trainer:
        s = run_speculators_trainer(args, d, shards, args.device)
        if "flops_per_token" in res:
            s["mfu"] = round(res["flops_per_token"] * s["tokens_per_s"] / (peak * 1e12), 4) if peak else None
        res["speculators_trainer"] = s
        if "ours" in res:
            res["ours_vs_speculators_tokens_per_s"] = round(res["ours"]["tokens_per_s"] / s["tokens_per_s"], 3)
    if args.step_ab:
        res["step_ab"] = step_ab(args, d, shards)
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    if args.record and args.step_ab:
        write_record(args, "train-step-graphs", {"threads": res["threads"], "shape": res["shape"],
                                                  "storage_dtype": args.storage_dtype, **res["step_ab"]},
                     args.record_notes)
    if not args.out:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
