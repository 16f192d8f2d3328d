"""speculators' fused KL loss as one opaque op of a compiled graph.

A private module of the train subpackage (it imports no stage module).

speculators' fused losses (speculators/losses/fused.py) are a Triton kernel pair behind ``_FusedLoss``, an autograd
Function: no ``[tokens, vocab]`` softmax is kept for the backward. Traced by dynamo inside a compiled forward, the
fused KL failed on a lent H200 (torch 2.11.0+cu130, 2026-12-05; benchmarks/peer_route.py, its train_command):
torch/_dynamo/side_effects.py:418 asserts that the autotuner's ``configs`` list, which the forward and backward
kernels share (fused.py ``_autotune_tile``), is "already tracked for mutation". A custom op
(``torch.library.custom_op``) is one node of the graph that dynamo does not trace into, so no graph break and no such
trace: its body calls ``_FusedLoss.forward`` and ``_FusedLoss.backward`` as upstream wrote them, and inductor calls it
as an extern kernel, inside a CUDA graph too (the autotuner runs at the first call, eager, before a graph is
recorded). ``compile_safe`` puts it in a loss config in place of speculators' fused ``kl_div``.
"""

from __future__ import annotations

import types
from collections.abc import Mapping

import torch

N_STATS = 5  # speculators/losses/fused.py ``_N_STATS``: the per-row statistics its backward reads


def _kernels():
    """speculators' fused loss module (imports Triton)."""
    from speculators.losses import fused

    return fused


@torch.library.custom_op("eagle3build::fused_kl_div", mutates_args=())
def fused_kl_div(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """speculators' fused forward KL: ``logits`` and ``targets`` ``[B, T, V]`` (any float dtype; CUDA) ->
    ``(loss [B, T] fp32, stats [N_STATS, B*T] fp32)``, the per-position KL(target || draft) and the row statistics
    its backward reads (speculators/losses/fused.py ``_FusedLoss.forward``)."""
    fused = _kernels()
    ctx = types.SimpleNamespace()
    ctx.save_for_backward = lambda *saved: setattr(ctx, "saved", saved)
    loss = fused._FusedLoss.forward(ctx, logits, targets, fused._OP_KL.value)
    return loss, ctx.saved[2]


@fused_kl_div.register_fake
def _fused_kl_div_fake(logits, targets):
    b, t, _ = logits.shape
    return (logits.new_empty((b, t), dtype=torch.float32), logits.new_empty((N_STATS, b * t), dtype=torch.float32))


@torch.library.custom_op("eagle3build::fused_kl_div_backward", mutates_args=())
def fused_kl_div_backward(logits: torch.Tensor, targets: torch.Tensor, stats: torch.Tensor,
                          grad_loss: torch.Tensor) -> torch.Tensor:
    """The gradient of ``fused_kl_div``'s loss with respect to ``logits`` (``[B, T, V]``, ``logits``' dtype) for
    ``grad_loss`` ``[B, T]`` (speculators/losses/fused.py ``_FusedLoss.backward``; targets get none, as there)."""
    fused = _kernels()
    b, t, v = logits.shape
    ctx = types.SimpleNamespace(saved_tensors=(logits.contiguous().view(b * t, v), targets.contiguous().view(b * t, v),
                                               stats), shape=(b, t, v), op=fused._OP_KL.value)
    return fused._FusedLoss.backward(ctx, grad_loss)[0]


@fused_kl_div_backward.register_fake
def _fused_kl_div_backward_fake(logits, targets, stats, grad_loss):
    return logits.new_empty(logits.shape)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], inputs[1], output[1])


def _backward(ctx, grad_loss, _grad_stats):
    logits, targets, stats = ctx.saved_tensors
    return fused_kl_div_backward(logits, targets, stats, grad_loss), None


fused_kl_div.register_autograd(_backward, setup_context=_setup_context)


def kl_div_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-position forward KL ``[B, T]`` fp32 of draft ``logits`` against target ``targets`` (``[B, T, V]``):
    speculators' fused ``kl_div`` through ``fused_kl_div``."""
    return fused_kl_div(logits, targets)[0]


def compile_safe(loss_config: Mapping) -> dict:
    """``loss_config`` (speculators' ``{name: (loss_fn, weight)}``, ``resolve_loss_config``) with speculators' fused
    ``kl_div`` replaced by ``kl_div_loss``; other entries as they are."""
    from speculators.losses import utils

    return {name: ((kl_div_loss, w) if fn is utils.kl_div_loss else (fn, w)) for name, (fn, w) in loss_config.items()}
