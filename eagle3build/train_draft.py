"""Stage ``train_draft``: speculators' EAGLE-3 draft model and loss under the project's own loop.

speculators' ``Trainer`` moves the model to an accelerator and fails on CPU
(speculators/train/trainer.py), so the loop is ours; everything else is speculators': the model
(``Eagle3DraftModel.from_training_args``), the draft-layer config
(``create_transformer_layer_config``), the loss (``resolve_loss_config``), sample
packing (``MultipackDistributedBatchSamplerV2``), collation (``CollateFn``) and the
EAGLE-3 input/target shift (``shift_batch``).

On CPU the draft uses ``sdpa`` attention (flex attention has no CPU backward) and the
eager ``kl_div`` loss (the fused one needs Triton); on CUDA the defaults
(``simple_flex_attention``, fused loss) with bf16 autocast.

Simulated chain acceptance length: speculators' ``full_acc_k`` is the fraction of
supervised positions whose draft tokens 0..k are all correct, i.e. the probability that
a chain of k+1 drafts is accepted; so τ_sim = 1 + Σ_k full_acc_k (EAGLE-3 paper,
τ = tokens emitted per target forward).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from .atomic import atomic_path
from .head_format import HEAD_VARIANTS
from .shards import ShardReader, check_meta

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 1

def _shard_dataset_class():
    from speculators.train.data import BaseDataset

    class ShardDataset(BaseDataset):
        """speculators ``BaseDataset`` over our shards.

        ``noise_std`` adds N(0, σ²) to the aux states, drawn from a generator seeded by
        (seed, epoch, sample): the same noise whatever the order of reads, so a resumed run
        sees exactly the noise an uninterrupted one would.
        """

        def __init__(self, paths: list[str], max_len: int, hidden_states_dtype: torch.dtype, noise_std: float = 0.0, seed: int = 0):
            self.readers = [ShardReader(p) for p in paths]
            self.index = [(r, i) for r in self.readers for i in range(len(r))]
            self.noise_std = noise_std
            self.seed = seed
            self.epoch = 0
            super().__init__(max_len=max_len, hidden_states_dtype=hidden_states_dtype)

        def __len__(self) -> int:
            return len(self.index)

        def _compute_approx_lengths(self) -> list[int]:
            return [r.length(i) for r, i in self.index]

        def _get_raw_data(self, index: int):
            r, i = self.index[index]
            d = r[i]
            d["hidden_states"] = d["hidden_states"].to(self.hidden_states_dtype)
            d["verifier_last_hidden_states"] = d["verifier_last_hidden_states"].to(self.hidden_states_dtype)
            if self.noise_std > 0:
                g = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) * 1_000_003 + index)
                noise = torch.randn(d["hidden_states"].shape, generator=g, dtype=torch.float32)
                d["hidden_states"] = d["hidden_states"] + (self.noise_std * noise).to(d["hidden_states"].dtype)
            return d

    return ShardDataset


class Batches:
    """Packed batches over shards for the ranks this process computes.

    One global step consists of one packed ``[1, total_seq_len]`` row per rank (speculators'
    ``MultipackDistributedBatchSamplerV2`` over ``world_size`` replicas). Under DDP a
    process computes its own rank's row; a single process may compute every rank's row
    itself (``ranks = range(world_size)``) and so reproduce a multi-GPU run's global batch.
    """

    def __init__(self, paths: list[str], total_seq_len: int, hidden_size: int, num_aux: int, dtype: torch.dtype,
                 seed: int, noise_std: float = 0.0, world_size: int = 1, ranks: list[int] | None = None):
        from speculators.models.eagle3.data import shift_batch
        from speculators.train.data import CollateFn
        from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

        self.dataset = _shard_dataset_class()(paths, total_seq_len, dtype, noise_std=noise_std, seed=seed)
        self.ranks = list(ranks if ranks is not None else range(world_size))
        self.samplers = [
            MultipackDistributedBatchSamplerV2(batch_max_length=total_seq_len, lengths=self.dataset.approx_lengths,
                                               num_replicas=world_size, rank=r, seed=seed)
            for r in self.ranks
        ]
        self.collate = CollateFn(total_seq_len, hidden_size, num_target_layers=num_aux, dtype=dtype, preprocess=shift_batch)

    def steps_per_epoch(self) -> int:
        return len(self.samplers[0])

    def epoch(self, epoch: int) -> list[list]:
        """``[step][rank-slot]`` -> sample indices, for ``epoch`` (deterministic in seed and epoch)."""
        for s in self.samplers:
            s.set_epoch(epoch)
        self.dataset.epoch = epoch
        per_rank = [list(s) for s in self.samplers]
        return [list(step) for step in zip(*per_rank, strict=True)]

    def load(self, indices) -> dict:
        return self.collate([self.dataset[int(i)] for i in indices])

    def prefetch(self, steps: list[list], pin: bool = False, depth: int = 2):
        """Yield each step's collated rows, loaded by a background thread ``depth`` steps ahead
        (shard reads and collation overlap the accelerator's work)."""
        import queue
        import threading

        q: queue.Queue = queue.Queue(maxsize=depth)
        stop = threading.Event()

        def work():
            try:
                for step in steps:
                    rows = [self.load(ix) for ix in step]
                    if pin:
                        rows = [{k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in r.items()} for r in rows]
                    while not stop.is_set():
                        try:
                            q.put(rows, timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                q.put(e)
            q.put(None)

        t = threading.Thread(target=work, daemon=True, name="batch-prefetch")
        t.start()
        try:
            while (item := q.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()


MODEL_KEYS = ("hidden_states", "input_ids", "document_ids", "loss_mask", "position_ids", "verifier_last_hidden_states")


def build_model(
    target_dir: str,
    aux_layer_ids: list[int],
    d2t: torch.Tensor,
    t2d: torch.Tensor,
    ttt_steps: int,
    head_variant: str,
    device: str,
    trust_remote_code: bool = False,
):
    """speculators' ``Eagle3DraftModel`` for ``target_dir``: 1 llama decoder layer, full attention.

    Embeddings and the verifier's lm_head/norm are loaded from the target (frozen);
    the draft ``lm_head`` starts as the target's rows selected by ``t2d``.
    """
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import create_transformer_layer_config

    tl = create_transformer_layer_config(
        verifier_name_or_path=target_dir,
        num_layers=1,
        draft_arch="llama",
        hidden_act=None,
        sliding_window=1,  # unused: the one layer is full attention
        full_attention_indices=[0],
        mrope_full_head_hack=True,
        trust_remote_code=trust_remote_code,
    )
    # No sliding window anywhere, so no engine can read one from the exported config.
    tl.sliding_window = None
    tl.use_sliding_window = False
    flags = HEAD_VARIANTS[head_variant]
    model = Eagle3DraftModel.from_training_args(
        verifier_config=tl,
        t2d=t2d,
        d2t=d2t,
        verifier_name_or_path=target_dir,
        draft_vocab_size=int(d2t.shape[0]),
        ttt_steps=ttt_steps,
        target_layer_ids=list(aux_layer_ids),
        draft_attn_impl="simple_flex_attention" if device.startswith("cuda") else "sdpa",
        trust_remote_code=trust_remote_code,
        **flags,
    )
    return model.to(device)


def _reduce(acc: dict, metrics: dict[str, torch.Tensor]) -> None:
    """Sum speculators' metrics into ``acc`` on their device: no host sync per batch."""
    for k, v in metrics.items():
        v = v.detach() if isinstance(v, torch.Tensor) else v
        acc[k] = acc[k] + v if k in acc else v


def _to_floats(acc: dict) -> dict[str, float]:
    return {k: float(v) for k, v in acc.items()}


def summarise(acc: dict[str, float], ttt_steps: int) -> dict:
    """Turn summed speculators metrics into loss, per-step accuracy and simulated τ."""
    out: dict = {}
    steps = [k for k in range(ttt_steps) if acc.get(f"full_acc_{k}_total")]
    out["loss"] = acc.get("loss_sum", 0.0) / max(acc.get("loss_total", 0.0), 1e-9)
    out["loss_per_step"] = [acc.get(f"loss_{k}_sum", 0.0) / max(acc.get(f"loss_{k}_total", 0.0), 1e-9) for k in steps]
    out["full_acc_per_step"] = [acc[f"full_acc_{k}_sum"] / acc[f"full_acc_{k}_total"] for k in steps]
    out["cond_acc_per_step"] = [
        acc[f"cond_acc_{k}_sum"] / acc[f"cond_acc_{k}_total"] if acc.get(f"cond_acc_{k}_total") else 0.0 for k in steps
    ]
    out["simulated_acceptance_length"] = 1.0 + sum(out["full_acc_per_step"])
    return out


@torch.no_grad()
def evaluate(model, batches: Batches, device: str, call_kwargs: dict, ttt_steps: int) -> dict:
    """Loss, accuracy per TTT step and simulated τ over the eval shards (every batch, one process)."""
    model.eval()
    acc: dict[str, float] = {}
    for rows in batches.prefetch(batches.epoch(0), pin=device.startswith("cuda")):
        for batch in rows:
            b = {k: batch[k].to(device, non_blocking=True) for k in MODEL_KEYS}
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
                _, _, metrics = model(**b, **call_kwargs)
            _reduce(acc, metrics)
    model.train()
    return summarise(_to_floats(acc), ttt_steps)


def draft_flops_per_token(model, ttt_steps: int) -> float:
    """Matmul FLOPs of one training token of speculators' ``Eagle3DraftModel`` (attention scores excluded).

    Per token: ``fc`` once, forward and backward (6 x params); per TTT step the decoder
    layer(s) (6 x params) and the frozen draft ``lm_head`` (forward + input gradient, 4 x
    params); the frozen verifier ``lm_head`` once, forward only (2 x params). The usual
    6N convention (Kaplan et al. 2020), split by what is trained and what is frozen.
    """
    def n(mod) -> int:
        return sum(p.numel() for p in mod.parameters())

    layers = sum(n(m) - sum(p.numel() for name, p in m.named_parameters() if "norm" in name) for m in model.layers)
    return 6 * n(model.fc) + ttt_steps * (6 * layers + 4 * model.lm_head.weight.numel()) + 2 * model.verifier_lm_head.weight.numel()


# ---------------------------------------------------------------- resume


def _state_key(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_state(state_dir: Path, key: str, model, opt, sched, step: int, epoch: int, pos: int, history: list, epochs_out: list) -> None:
    """Everything a resumed run needs, atomically: weights, optimizer, scheduler, data position, RNG states."""
    state = {
        "key": key, "step": step, "epoch": epoch, "pos": pos,
        "model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "history": json.dumps(history), "epochs": json.dumps(epochs_out),
    }
    state_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(state_dir / "state.pt") as tmp:
        torch.save(state, tmp)


def load_state(state_dir: Path, key: str) -> dict | None:
    """The saved state if it belongs to a run with the same settings and inputs, else None."""
    f = state_dir / "state.pt"
    if not f.exists():
        return None
    state = torch.load(f, map_location="cpu", weights_only=True)
    if state.get("key") != key:
        log.warning("ignoring %s: saved by a run with other settings or inputs", f)
        return None
    return state


# ---------------------------------------------------------------- training


def _dist_info() -> tuple[bool, int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return True, dist.get_rank(), dist.get_world_size()
    return False, 0, 1


def train(
    target_dir: str,
    train_shards: list[str],
    eval_shards: list[str],
    d2t_path: str,
    t2d_path: str,
    vocab_json: str,
    compat_json: str,
    out_dir: str,
    epochs: int = 1,
    lr: float = 1e-4,
    weight_decay: float = 0.0,
    warmup_ratio: float = 0.05,
    schedule: str = "cosine",
    ttt_steps: int = 3,
    ttt_step_loss_decay: float = 1.0,
    total_seq_len: int = 2048,
    grad_clip: float = 1.0,
    noise_std: float = 0.0,
    seed: int = 0,
    head_variant: str = "auto",
    max_steps: int | None = None,
    checkpoint_every: int = 0,
    world_size: int | None = None,
    loss_implementation: str = "eager",
    device: str = "auto",
    trust_remote_code: bool = False,
) -> dict:
    """Train a draft head on the shards and write ``out_dir`` (atomically, as one directory).

    ``out_dir`` receives: ``config.json`` + ``model.safetensors`` (speculators format,
    fp32 master weights), ``train_meta.json`` (target fingerprint, aux ids, vocab
    fingerprint, head flags — what export checks), ``metrics.json`` (per-step train
    loss, per-epoch eval loss / accuracy per TTT step / simulated τ, tokens/s) and
    ``curves.png``.

    ``head_variant``: ``eagle3``, ``eagle3.1`` or ``auto`` (the compat report's choice:
    what the installed vLLM reads correctly). ``checkpoint_every`` > 0 saves the full
    training state every that many steps to ``<out_dir>.state/``; a run started again
    with the same settings and inputs resumes from it and ends bit-identical (CPU) to an
    uninterrupted run. Under ``torch.distributed`` (torchrun) each process trains its
    rank's rows with DDP; ``world_size`` without it computes all ranks' rows in one
    process (the same global batch). ``loss_implementation``: speculators' ``eager``
    KL (any device; on CUDA torch.compile fuses it) or its Triton ``fused`` kernel
    (CUDA only; fails under torch.compile with torch 2.11, seen on an H200).

    Raises:
        ShardMismatch: a shard's target fingerprint or aux ids differ from the compat report.
        ValueError: the vocab map files are inconsistent, or there is nothing to train on.
    """
    from speculators.losses import resolve_loss_config
    from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    from . import vocab_map

    distributed, rank, dist_world = _dist_info()
    world = dist_world if distributed else (world_size or 1)
    my_ranks = [rank] if distributed else list(range(world))
    torch.manual_seed(seed)
    compat = json.loads(Path(compat_json).read_text())
    fp = compat["target"]["fingerprint"]
    aux = compat["capture"]["aux_layer_ids"]
    if head_variant == "auto":
        head_variant = compat.get("head", {}).get("recommended_variant", "eagle3.1")
    for p in list(train_shards) + list(eval_shards):
        check_meta(p, ShardReader(p).meta, fp, aux)
    d2t, t2d, vocab_info = vocab_map.load(d2t_path, t2d_path, vocab_json)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and distributed:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
        torch.cuda.set_device(device)
    # Loader dtype: bf16 on CUDA (computed under bf16 autocast; half the host->device bytes),
    # fp32 on CPU (bf16 matmuls are ~20x slower there).
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = build_model(target_dir, aux, d2t, t2d, ttt_steps, head_variant, device, trust_remote_code)
    hidden = model.config.transformer_layer_config.hidden_size
    train_b = Batches(train_shards, total_seq_len, hidden, len(aux), dtype, seed, noise_std, world, my_ranks)
    eval_b = Batches(eval_shards, total_seq_len, hidden, len(aux), dtype, seed) if eval_shards else None
    steps_per_epoch = train_b.steps_per_epoch()
    if steps_per_epoch == 0:
        raise ValueError(f"no training batch can be formed from {train_shards} for {world} rank(s)")
    total_steps = steps_per_epoch * epochs if max_steps is None else min(max_steps, steps_per_epoch * epochs)
    net = model
    if distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(model, device_ids=[torch.cuda.current_device()] if device.startswith("cuda") else None)

    if loss_implementation == "fused" and not device.startswith("cuda"):
        raise ValueError("train.loss_implementation 'fused' needs CUDA (a Triton kernel); use 'eager'")
    call_kwargs = {
        "ttt_steps": ttt_steps,
        "ttt_step_loss_decay": ttt_step_loss_decay,
        "loss_config": resolve_loss_config("kl_div", implementation=loss_implementation),
    }
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=device.startswith("cuda"))
    warmup = int(math.ceil(warmup_ratio * total_steps))
    sched = (
        get_cosine_schedule_with_warmup(opt, warmup, total_steps)
        if schedule == "cosine"
        else get_constant_schedule_with_warmup(opt, warmup)
    )
    settings = dict(epochs=epochs, lr=lr, weight_decay=weight_decay, warmup_ratio=warmup_ratio, schedule=schedule,
                    ttt_steps=ttt_steps, ttt_step_loss_decay=ttt_step_loss_decay, total_seq_len=total_seq_len,
                    grad_clip=grad_clip, noise_std=noise_std, seed=seed, head_variant=head_variant, max_steps=max_steps,
                    loss_implementation=loss_implementation,
                    world=world, shards=[(p, os.path.getsize(p)) for p in train_shards], vocab=vocab_info["fingerprint"],
                    target=fp, aux=aux)
    key = _state_key(settings)
    state_dir = Path(f"{os.path.normpath(out_dir)}.state")
    history: list[dict] = []
    epochs_out: list[dict] = []
    step, start_epoch, start_pos = 0, 0, 0
    state = load_state(state_dir, key) if checkpoint_every > 0 else None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"]:
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        step, start_epoch, start_pos = state["step"], state["epoch"], state["pos"]
        history, epochs_out = json.loads(state["history"]), json.loads(state["epochs"])
        log.info("resumed from %s at step %d (epoch %d, batch %d)", state_dir, step, start_epoch, start_pos)
    log.info(
        "training %d trainable params on %s: %d train / %d eval samples, %d steps/epoch x %d epochs (%d steps), "
        "world size %d, ttt_steps=%d, %s",
        sum(p.numel() for p in params), device, len(train_b.dataset), len(eval_b.dataset) if eval_b else 0,
        steps_per_epoch, epochs, total_steps, world, ttt_steps, head_variant,
    )
    from tqdm import tqdm

    pending: list[tuple] = []

    def flush() -> None:
        for st, a, lr_, gn in pending:
            sm = summarise(_to_floats(a), ttt_steps)
            history.append({"step": st, "loss": sm["loss"] / len(my_ranks),
                            "full_acc_0": sm["full_acc_per_step"][0] if sm["full_acc_per_step"] else None,
                            "lr": lr_, "grad_norm": float(gn)})
        pending.clear()

    tokens = 0
    t0 = time.perf_counter()
    model.train()
    for epoch in range(start_epoch, epochs):
        if step >= total_steps:
            break
        plan = train_b.epoch(epoch)
        first = start_pos if epoch == start_epoch else 0
        n_run = max(0, min(len(plan) - first, total_steps - step))
        bar = tqdm(total=n_run, desc=f"epoch {epoch}", file=sys.stderr, mininterval=5, disable=rank != 0)
        loaded = train_b.prefetch(plan[first:first + n_run], pin=device.startswith("cuda"))
        for pos, rows in zip(range(first, first + n_run), loaded):
            opt.zero_grad(set_to_none=True)
            acc: dict = {}
            for batch in rows:
                b = {k: batch[k].to(device, non_blocking=True) for k in MODEL_KEYS}
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
                    _, loss, metrics = net(**b, **call_kwargs)
                (loss / len(my_ranks)).backward()
                _reduce(acc, metrics)
                tokens += int((batch["document_ids"] != -1).sum())
            gnorm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
            sched.step()
            step += 1
            # Metrics stay on the device until flushed: the host never waits for the GPU
            # mid-epoch, so it queues the next step while this one runs.
            pending.append((step, acc, sched.get_last_lr()[0], gnorm.detach()))
            bar.update(1)
            saving = checkpoint_every > 0 and step % checkpoint_every == 0 and rank == 0
            if saving or len(pending) >= 20:
                flush()
                bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", tok_s=f"{tokens / (time.perf_counter() - t0):.0f}")
            if saving:
                save_state(state_dir, key, model, opt, sched, step, epoch, pos + 1, history, epochs_out)
        flush()
        bar.close()
        ev = evaluate(model, eval_b, device, call_kwargs, ttt_steps) if eval_b else {}
        ep = {"epoch": epoch, "step": step, "eval": ev, "train_loss_last": history[-1]["loss"] if history else None}
        epochs_out.append(ep)
        if rank == 0:
            log.info("epoch %d: %s", epoch, json.dumps(ep))
            if checkpoint_every > 0:
                save_state(state_dir, key, model, opt, sched, step, epoch + 1, 0, history, epochs_out)
    seconds = time.perf_counter() - t0

    meta = {
        "target_fingerprint": fp,
        "aux_layer_ids": aux,
        "vocab_fingerprint": vocab_info["fingerprint"],
        "draft_vocab_size": int(d2t.shape[0]),
        "head_variant": head_variant,
        "head_flags": HEAD_VARIANTS[head_variant],
        "ttt_steps": ttt_steps,
        "world_size": world,
    }
    metrics_out = {
        "steps": step,
        "epochs": epochs_out,
        "final_eval": epochs_out[-1]["eval"] if epochs_out else {},
        "train_history": history,
        "train_tokens_this_process": tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens * (dist_world if distributed else 1) / max(seconds, 1e-9), 1),
        "device": device,
        "resumed_from_step": state["step"] if state is not None else None,
        "flops_per_token": draft_flops_per_token(model, ttt_steps),
    }
    if rank == 0:
        with atomic_path(out_dir) as tmp:
            model.save_pretrained(tmp)
            (tmp / "train_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
            (tmp / "metrics.json").write_text(json.dumps(metrics_out, indent=2) + "\n")
            plot_curves(history, epochs_out, tmp / "curves.png")
        shutil.rmtree(state_dir, ignore_errors=True)
        log.info("trained %d steps in %.1f s (%.0f tokens/s); final eval %s", step, seconds,
                 metrics_out["tokens_per_s"], metrics_out["final_eval"])
    return metrics_out


def launch(kwargs: dict, nproc: int) -> None:
    """Run ``train(**kwargs)`` on ``nproc`` processes with torchrun (DDP; NCCL on GPUs, gloo on CPU).

    Raises:
        RuntimeError: a rank failed (its traceback is in the log above).
    """
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(kwargs, f)
    try:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "eagle3build.train_draft", f.name]
        log.info("launching %s", " ".join(cmd))
        rc = subprocess.run(cmd).returncode
    finally:
        os.unlink(f.name)
    if rc != 0:
        raise RuntimeError(f"distributed training failed (exit {rc}); see the ranks' output above")


def _main_distributed(kwargs_path: str) -> None:
    import torch.distributed as dist

    kwargs = json.loads(Path(kwargs_path).read_text())
    backend = "nccl" if torch.cuda.is_available() and kwargs.get("device", "auto") != "cpu" else "gloo"
    dist.init_process_group(backend)
    try:
        train(**kwargs)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def plot_curves(history: list[dict], epochs: list[dict], path: os.PathLike) -> None:
    """Train loss per step and eval accuracy per TTT step per epoch, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot([h["step"] for h in history], [h["loss"] for h in history], lw=1)
    a.set_xlabel("step")
    a.set_ylabel("train loss (sum over TTT steps)")
    a.set_title("training loss")
    for e in epochs:
        accs = e["eval"].get("full_acc_per_step", [])
        b.plot(range(len(accs)), accs, marker="o", label=f"epoch {e['epoch']}")
    b.set_xlabel("TTT step")
    b.set_ylabel("eval accuracy (all drafts so far correct)")
    b.set_ylim(0, 1)
    b.set_title("eval accuracy per TTT step")
    if epochs:
        b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: torchrun ... -m eagle3build.train_draft KWARGS.json")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s rank" + os.environ.get("RANK", "?")
                        + " %(name)s: %(message)s")
    _main_distributed(sys.argv[1])
