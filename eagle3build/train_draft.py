"""Stage ``train_draft``: speculators' EAGLE-3 draft model and loss under the project's own loop.

speculators' ``Trainer`` moves the model to an accelerator and fails on CPU
(REFERENCE.md), so the loop is ours; everything else is speculators': the model
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

import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import torch

from .atomic import atomic_path
from .shards import ShardReader, check_meta

log = logging.getLogger(__name__)

# Head flags of the two EAGLE-3 variants (speculators' Eagle3SpeculatorConfig fields).
HEAD_VARIANTS = {
    # Li et al. 2025: fc over the raw concatenated aux states, residual after the hidden norm.
    "eagle3": {"norm_before_residual": False, "norm_before_fc": False, "norm_output": False, "fc_norm": False},
    # speculators' default since 0.4 ("Eagle 3.1"): norm before fc, post-norm states fed back.
    "eagle3.1": {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True, "fc_norm": False},
}


def _shard_dataset_class():
    from speculators.train.data import BaseDataset

    class ShardDataset(BaseDataset):
        """speculators ``BaseDataset`` over our shards; ``noise_std`` adds N(0, σ²) to the aux states."""

        def __init__(self, paths: list[str], max_len: int, hidden_states_dtype: torch.dtype, noise_std: float = 0.0, seed: int = 0):
            self.readers = [ShardReader(p) for p in paths]
            self.index = [(r, i) for r in self.readers for i in range(len(r))]
            self.noise_std = noise_std
            self.gen = torch.Generator().manual_seed(seed)
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
                d["hidden_states"] = d["hidden_states"] + self.noise_std * torch.randn(
                    d["hidden_states"].shape, generator=self.gen, dtype=d["hidden_states"].dtype
                )
            return d

    return ShardDataset


def make_loader(paths: list[str], total_seq_len: int, hidden_size: int, num_aux: int, dtype: torch.dtype, seed: int, noise_std: float = 0.0):
    """A packed DataLoader over shards: each batch is one ``[1, total_seq_len]`` row of whole samples."""
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import CollateFn
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
    from torch.utils.data import DataLoader

    ds = _shard_dataset_class()(paths, total_seq_len, dtype, noise_std=noise_std, seed=seed)
    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=total_seq_len, lengths=ds.approx_lengths, num_replicas=1, rank=0, seed=seed
    )
    collate = CollateFn(total_seq_len, hidden_size, num_target_layers=num_aux, dtype=dtype, preprocess=shift_batch)
    return DataLoader(ds, batch_sampler=sampler, collate_fn=collate, num_workers=0)


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


def _reduce(acc: dict[str, float], metrics: dict[str, torch.Tensor]) -> None:
    for k, v in metrics.items():
        acc[k] = acc.get(k, 0.0) + float(v)


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
def evaluate(model, loader, device: str, call_kwargs: dict, ttt_steps: int) -> dict:
    model.eval()
    acc: dict[str, float] = {}
    for batch in loader:
        b = {k: batch[k].to(device) for k in MODEL_KEYS}
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
            _, _, metrics = model(**b, **call_kwargs)
        _reduce(acc, metrics)
    model.train()
    return summarise(acc, ttt_steps)


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
    head_variant: str = "eagle3.1",
    max_steps: int | None = None,
    device: str = "auto",
    trust_remote_code: bool = False,
) -> dict:
    """Train a draft head on the shards and write ``out_dir`` (atomically, as one directory).

    ``out_dir`` receives: ``config.json`` + ``model.safetensors`` (speculators format,
    fp32 master weights), ``train_meta.json`` (target fingerprint, aux ids, vocab
    fingerprint, head flags — what export checks), ``metrics.json`` (per-step train
    loss, per-epoch eval loss / accuracy per TTT step / simulated τ, tokens/s) and
    ``curves.png``.

    Raises:
        ShardMismatch: a shard's target fingerprint or aux ids differ from the compat report.
        ValueError: the vocab map files are inconsistent, or there is nothing to train on.
    """
    from speculators.losses import resolve_loss_config
    from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    from . import build_vocab_map

    torch.manual_seed(seed)
    compat = json.loads(Path(compat_json).read_text())
    fp = compat["target"]["fingerprint"]
    aux = compat["capture"]["aux_layer_ids"]
    for p in list(train_shards) + list(eval_shards):
        check_meta(p, ShardReader(p).meta, fp, aux)
    d2t, t2d, vocab_info = build_vocab_map.load(d2t_path, t2d_path, vocab_json)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32  # loader dtype; CUDA computes under bf16 autocast
    model = build_model(target_dir, aux, d2t, t2d, ttt_steps, head_variant, device, trust_remote_code)
    hidden = model.config.transformer_layer_config.hidden_size
    train_loader = make_loader(train_shards, total_seq_len, hidden, len(aux), dtype, seed, noise_std)
    eval_loader = make_loader(eval_shards, total_seq_len, hidden, len(aux), dtype, seed) if eval_shards else None
    steps_per_epoch = len(train_loader)
    if steps_per_epoch == 0:
        raise ValueError(f"no training batch can be formed from {train_shards}")
    total_steps = steps_per_epoch * epochs if max_steps is None else min(max_steps, steps_per_epoch * epochs)

    loss_impl = "fused" if device.startswith("cuda") else "eager"
    call_kwargs = {
        "ttt_steps": ttt_steps,
        "ttt_step_loss_decay": ttt_step_loss_decay,
        "loss_config": resolve_loss_config("kl_div", implementation=loss_impl),
    }
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    warmup = int(math.ceil(warmup_ratio * total_steps))
    sched = (
        get_cosine_schedule_with_warmup(opt, warmup, total_steps)
        if schedule == "cosine"
        else get_constant_schedule_with_warmup(opt, warmup)
    )
    log.info(
        "training %d trainable params on %s: %d train / %d eval samples, %d steps/epoch x %d epochs (%d steps), ttt_steps=%d, %s",
        sum(p.numel() for p in params), device, len(train_loader.dataset), len(eval_loader.dataset) if eval_loader else 0,
        steps_per_epoch, epochs, total_steps, ttt_steps, head_variant,
    )
    from tqdm import tqdm

    history: list[dict] = []
    epochs_out: list[dict] = []
    step = 0
    tokens = 0
    t0 = time.perf_counter()
    model.train()
    for epoch in range(epochs):
        train_loader.batch_sampler.set_epoch(epoch)
        bar = tqdm(train_loader, desc=f"epoch {epoch}", file=sys.stderr, mininterval=5)
        for batch in bar:
            if step >= total_steps:
                break
            b = {k: batch[k].to(device) for k in MODEL_KEYS}
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
                _, loss, metrics = model(**b, **call_kwargs)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
            sched.step()
            ntok = int((batch["document_ids"] != -1).sum())
            tokens += ntok
            step += 1
            s = summarise({k: float(v) for k, v in metrics.items()}, ttt_steps)
            history.append({"step": step, "loss": s["loss"], "full_acc_0": s["full_acc_per_step"][0] if s["full_acc_per_step"] else None,
                            "lr": sched.get_last_lr()[0], "grad_norm": float(gnorm), "tokens": ntok})
            bar.set_postfix(loss=f"{s['loss']:.3f}", tok_s=f"{tokens / (time.perf_counter() - t0):.0f}")
        bar.close()
        ev = evaluate(model, eval_loader, device, call_kwargs, ttt_steps) if eval_loader else {}
        ep = {"epoch": epoch, "step": step, "eval": ev, "train_loss_last": history[-1]["loss"] if history else None}
        epochs_out.append(ep)
        log.info("epoch %d: %s", epoch, json.dumps(ep))
    seconds = time.perf_counter() - t0

    meta = {
        "target_fingerprint": fp,
        "aux_layer_ids": aux,
        "vocab_fingerprint": vocab_info["fingerprint"],
        "draft_vocab_size": int(d2t.shape[0]),
        "head_variant": head_variant,
        "head_flags": HEAD_VARIANTS[head_variant],
        "ttt_steps": ttt_steps,
    }
    metrics_out = {
        "steps": step,
        "epochs": epochs_out,
        "final_eval": epochs_out[-1]["eval"] if epochs_out else {},
        "train_history": history,
        "train_tokens": tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
        "device": device,
    }
    with atomic_path(out_dir) as tmp:
        model.save_pretrained(tmp)
        (tmp / "train_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        (tmp / "metrics.json").write_text(json.dumps(metrics_out, indent=2) + "\n")
        plot_curves(history, epochs_out, tmp / "curves.png")
    log.info("trained %d steps in %.1f s (%.0f tokens/s); final eval %s", step, seconds, metrics_out["tokens_per_s"], metrics_out["final_eval"])
    return metrics_out


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
