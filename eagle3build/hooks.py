"""Forward hooks that capture a transformers target's hidden states (shared layer).

Forward pre-hooks on the aux decoder layers record the residual stream *entering* each
(vLLM's and speculators' convention for aux layer id ``k``: vllm/model_executor/models/llama_eagle3.py,
``eagle_aux_hidden_state_layer_ids``), and a forward hook on the last decoder layer records its
output *before* the final norm, the state speculators' ``Eagle3DraftModel`` feeds through its
own ``verifier_norm`` (speculators/models/eagle3.py). Used by the ``hooks`` capture backend
(``capture_hidden_states``), by online training's target (``train.online_states``) and by the compat
report's capture probes. ``plan_batches`` and ``padded_batch`` are the batching both capture
paths share, so that a sample's states are computed the same way offline and online.
"""

from __future__ import annotations

import numpy as np
import torch

from .target import DecoderStack, find_decoder_layers, text_config


class HookCapture:
    """Capture aux-layer inputs and the last layer's output of a transformers model.

    ``capture(input_ids [B, T] int64, attention_mask [B, T] or None)`` returns
    ``(aux [B, T, A*H], last [B, T, H])`` in the model's compute dtype on the device of
    the first layer, aux states concatenated in ``aux_layer_ids`` order.
    """

    def __init__(self, model: torch.nn.Module, aux_layer_ids: list[int], stack: DecoderStack | None = None):
        self.stack = stack or find_decoder_layers(model, text_config(model.config).num_hidden_layers)
        n = len(self.stack.layers)
        for i in aux_layer_ids:
            if not 0 <= i < n:
                raise ValueError(f"aux layer id {i} out of range for {n} decoder layers")
        self.aux_layer_ids = list(aux_layer_ids)
        self._buf: dict[object, torch.Tensor] = {}
        self._handles = [
            self.stack.layers[i].register_forward_pre_hook(self._pre_hook(i), with_kwargs=True) for i in self.aux_layer_ids
        ]
        self._handles.append(self.stack.layers[n - 1].register_forward_hook(self._last_hook))

    def _pre_hook(self, i: int):
        def hook(module, args, kwargs):
            self._buf[i] = args[0] if args else kwargs["hidden_states"]

        return hook

    def _last_hook(self, module, args, output):
        self._buf["last"] = output[0] if isinstance(output, tuple) else output

    @torch.inference_mode()
    def capture(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._buf.clear()
        self.stack.owner(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        dev = input_ids.device
        # With the layers spread over several GPUs the states live on different devices.
        aux = torch.cat([self._buf[i].to(dev) for i in self.aux_layer_ids], dim=-1)
        return aux, self._buf["last"].to(dev)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def plan_batches(lengths: list[int], tokens_per_batch: int) -> list[list[int]]:
    """Group sample indices into batches whose padded size ``B * max(T)`` stays within ``tokens_per_batch``.

    Samples are sorted by length (stable: equal lengths keep their order) so padding stays
    small; a sample longer than the budget gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * lengths[i] > tokens_per_batch:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def padded_batch(ids: list[np.ndarray], device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Right-padded ``input_ids`` ``[B, max T]`` int64 on ``device`` from per-sample token ids, and the
    attention mask ``[B, max T]`` int64 (1 on tokens), or None where no sample is padded (attention can
    then take its fused causal kernel)."""
    lengths = [len(x) for x in ids]
    T = max(lengths)
    out = torch.zeros(len(ids), T, dtype=torch.long)
    att = torch.zeros(len(ids), T, dtype=torch.long)
    for r, x in enumerate(ids):
        out[r, : lengths[r]] = torch.from_numpy(np.asarray(x).astype("int64"))
        att[r, : lengths[r]] = 1
    padded = any(n != T for n in lengths)
    return out.to(device, non_blocking=True), att.to(device, non_blocking=True) if padded else None


def unpad(aux: torch.Tensor, last: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``HookCapture.capture``'s ``[B, T, .]`` states as rows ``[N, .]`` of the batch's tokens, sample after
    sample (N = the batch's real tokens; ``attention_mask`` as ``padded_batch`` gives it)."""
    if attention_mask is not None:
        valid = attention_mask.bool()  # rows of sample r are contiguous and in batch order
        return aux[valid], last[valid]
    return aux.reshape(-1, aux.shape[-1]), last.reshape(-1, last.shape[-1])
