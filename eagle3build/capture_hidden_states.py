"""Stage ``capture_hidden_states``: run the target over one shard's samples and store its hidden states.

Backend "hooks": forward pre-hooks on the aux decoder layers record the residual
stream *entering* each (vLLM's and speculators' convention for aux layer id ``k``), and a
forward hook on the last decoder layer records its output *before* the final norm —
the state speculators' ``Eagle3DraftModel`` feeds through its own ``verifier_norm`` and
``verifier_lm_head`` to rebuild the target's logits (REFERENCE.md "Layer ids").
Only the text model that owns the layers is run, so the target's ``lm_head`` costs nothing.
"""

from __future__ import annotations

import logging
import os
import sys
import time

import torch

from .prepare_data import read_tokens
from .shards import STORAGE_DTYPES, ShardMeta, write_shard
from .target import DecoderStack, find_decoder_layers, load_model, resolve_dtype, text_config

log = logging.getLogger(__name__)


class HookCapture:
    """Capture aux-layer inputs and the last layer's output of a transformers model.

    ``capture(input_ids [B, T] int64, attention_mask [B, T])`` returns
    ``(aux [B, T, A*H], last [B, T, H])`` in the model's compute dtype, aux states
    concatenated in ``aux_layer_ids`` order.
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
        aux = torch.cat([self._buf[i] for i in self.aux_layer_ids], dim=-1)
        return aux, self._buf["last"]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def plan_batches(lengths: list[int], tokens_per_batch: int) -> list[list[int]]:
    """Group sample indices into batches whose padded size ``B * max(T)`` stays within ``tokens_per_batch``.

    Samples are sorted by length so padding stays small; a sample longer than the budget
    gets a batch of its own.
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


def capture_shard(
    target_dir: str | os.PathLike,
    tokens_path: str | os.PathLike,
    out_path: str | os.PathLike,
    start: int,
    count: int,
    aux_layer_ids: list[int],
    target_fingerprint: str,
    split: str,
    backend: str = "hooks",
    device: str = "cpu",
    compute_dtype: str = "auto",
    storage_dtype: str = "bfloat16",
    tokens_per_batch: int = 4096,
    trust_remote_code: bool = False,
) -> dict:
    """Capture samples ``[start, start+count)`` of ``tokens_path`` into the shard ``out_path``.

    Returns a summary: samples, tokens, seconds, tokens/s.

    Raises:
        NotImplementedError: ``backend`` is not ``hooks``.
        IndexError: the tokens file holds fewer than ``start + 1`` samples (the message
            gives both numbers; lower ``capture.num_train_samples`` or add data).
    """
    if backend != "hooks":
        raise NotImplementedError(f"capture backend {backend!r}: only 'hooks' is implemented in this version")
    toks = read_tokens(tokens_path)
    if start >= len(toks) and count > 0:
        raise IndexError(f"{tokens_path}: shard wants samples from {start}, but the split has only {len(toks)}")
    idx = list(range(start, min(start + count, len(toks))))
    if len(idx) < count:
        log.warning("%s holds %d samples; shard %s gets %d instead of %d", tokens_path, len(toks), out_path, len(idx), count)
    dtype = resolve_dtype(compute_dtype, device)
    t_load = time.perf_counter()
    model = load_model(target_dir, dtype, device, trust_remote_code)
    hidden = text_config(model.config).hidden_size
    cap = HookCapture(model, aux_layer_ids)
    log.info("target loaded in %.1f s (%s on %s); decoder layers at %s", time.perf_counter() - t_load, dtype, device, cap.stack.path)

    sdt = STORAGE_DTYPES[storage_dtype]
    samples = [toks.sample(i) for i in idx]
    lengths = [len(s[0]) for s in samples]
    aux_out: list[torch.Tensor | None] = [None] * len(idx)
    last_out: list[torch.Tensor | None] = [None] * len(idx)
    from tqdm import tqdm

    t0 = time.perf_counter()
    bar = tqdm(total=sum(lengths), unit="tok", unit_scale=True, file=sys.stderr, mininterval=5, desc=f"capture {split}")
    for batch in plan_batches(lengths, tokens_per_batch):
        T = max(lengths[j] for j in batch)
        ids = torch.zeros(len(batch), T, dtype=torch.long)
        att = torch.zeros(len(batch), T, dtype=torch.long)
        for r, j in enumerate(batch):
            ids[r, : lengths[j]] = torch.from_numpy(samples[j][0].astype("int64"))
            att[r, : lengths[j]] = 1
        aux, last = cap.capture(ids.to(device), att.to(device))
        for r, j in enumerate(batch):
            aux_out[j] = aux[r, : lengths[j]].to("cpu", sdt)
            last_out[j] = last[r, : lengths[j]].to("cpu", sdt)
        bar.update(sum(lengths[j] for j in batch))
    bar.close()
    seconds = time.perf_counter() - t0
    cap.remove()

    meta = ShardMeta(
        target_fingerprint=target_fingerprint,
        aux_layer_ids=list(aux_layer_ids),
        dtype=storage_dtype,
        hidden_size=hidden,
        sample_ids=[toks.sample_ids[i] for i in idx],
        split=split,
    )
    write_shard(
        out_path,
        meta,
        aux_out,  # type: ignore[arg-type]
        last_out,  # type: ignore[arg-type]
        [torch.from_numpy(s[0].astype("int64")) for s in samples],
        [torch.from_numpy(s[1]) for s in samples],
    )
    ntok = sum(lengths)
    summary = {"samples": len(idx), "tokens": ntok, "seconds": round(seconds, 2), "tokens_per_s": round(ntok / max(seconds, 1e-9), 1)}
    log.info("captured %s", summary)
    return summary

