"""Training metrics of the draft head: speculators' per-batch metrics summed and summarised,
FLOPs per token, and the curves plot.

A private module of the train subpackage (it imports no stage module).

Simulated chain acceptance length: speculators' ``full_acc_k`` (speculators/models/eagle3/metrics.py,
the metrics of ``Eagle3DraftModel.forward``) is the fraction of supervised positions whose draft
tokens 0..k are all correct, i.e. the probability that a chain of k+1 drafts is accepted; so
τ_sim = 1 + Σ_k full_acc_k (EAGLE-3 paper, arXiv:2503.01840: τ = tokens emitted per target forward).
"""

from __future__ import annotations

import os

import torch


def accumulate(acc: dict, metrics: dict[str, torch.Tensor]) -> None:
    """Sum speculators' metrics (0-d tensors: ``*_sum`` and ``*_total`` per TTT step) into ``acc``
    on their device, detached: no host sync per batch."""
    for k, v in metrics.items():
        v = v.detach() if isinstance(v, torch.Tensor) else v
        acc[k] = acc[k] + v if k in acc else v


def to_floats(acc: dict) -> dict[str, float]:
    """``acc`` with every value a Python float (a host sync when they are device tensors)."""
    return {k: float(v) for k, v in acc.items()}


def summarise(acc: dict[str, float], ttt_steps: int) -> dict:
    """Turn summed speculators metrics into loss, per-step accuracy and simulated τ.

    Returns ``loss`` (summed KL over TTT steps, per supervised position), ``loss_per_step``,
    ``full_acc_per_step`` and ``cond_acc_per_step`` (fractions in [0, 1], one per TTT step that
    had supervised positions) and ``simulated_acceptance_length`` (tokens per target forward).
    """
    out: dict = {}
    steps = [k for k in range(ttt_steps) if acc.get(f"full_acc_{k}_total")]
    out["loss"] = acc.get("loss_sum", 0.0) / max(acc.get("loss_total", 0.0), 1e-9)
    out["loss_per_step"] = [acc.get(f"loss_{k}_sum", 0.0) / max(acc.get(f"loss_{k}_total", 0.0), 1e-9) for k in steps]
    out["full_acc_per_step"] = [acc[f"full_acc_{k}_sum"] / acc[f"full_acc_{k}_total"] for k in steps]
    out["cond_acc_per_step"] = [
        acc[f"cond_acc_{k}_sum"] / acc[f"cond_acc_{k}_total"] if acc.get(f"cond_acc_{k}_total") else 0.0 for k in steps
    ]
    out["simulated_acceptance_length"] = 1.0 + sum(out["full_acc_per_step"])
    positions = sorted(int(k.split("_")[1]) for k in acc if k.startswith("position_") and k.endswith("_acc_total")
                       and acc[k])
    if not steps and positions:
        # P-EAGLE and DFlash (one forward drafts every position): speculators' per-position accuracies
        # (``position_{p}_acc``, marginal: each position's own hits, peagle/metrics.py, dflash/metrics.py) stand in
        # for the per-step ones. τ_sim: DFlash's ``eal`` (each block's leading run of hits + the bonus token,
        # speculators/models/metrics.py); P-EAGLE has none, so 1 + Σ_k Π_{j<=k} acc_j of the marginals
        # (approximate: it drops the correlation between positions).
        out["full_acc_per_step"] = [acc[f"position_{p}_acc_sum"] / acc[f"position_{p}_acc_total"] for p in positions]
        out["cond_acc_per_step"] = []
        if acc.get("eal_total"):
            out["simulated_acceptance_length"] = acc["eal_sum"] / acc["eal_total"]
        else:
            chain, tau = 1.0, 1.0
            for a in out["full_acc_per_step"]:
                chain *= a
                tau += chain
            out["simulated_acceptance_length"] = tau
    return out


def history_entry(step: int, acc: dict, lr: float, grad_norm: torch.Tensor, ttt_steps: int, n_rows: int) -> dict:
    """One ``train_history`` record of ``metrics.json``: the step's loss (mean over the ``n_rows``
    packed rows this process computed), draft-token-0 accuracy, learning rate and the
    pre-clip gradient norm (a host sync)."""
    sm = summarise(to_floats(acc), ttt_steps)
    return {"step": step, "loss": sm["loss"] / n_rows,
            "full_acc_0": sm["full_acc_per_step"][0] if sm["full_acc_per_step"] else None,
            "lr": lr, "grad_norm": float(grad_norm)}


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
    per_step = 6 * layers + 4 * model.lm_head.weight.numel()
    return 6 * n(model.fc) + ttt_steps * per_step + 2 * model.verifier_lm_head.weight.numel()


def plot_curves(history: list[dict], epochs: list[dict], path: os.PathLike) -> None:
    """Train loss per step and eval accuracy per TTT step per epoch, as one PNG (80 dpi) at ``path``."""
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
