"""Online training data: the target's states computed for each batch as it is formed, no shards.

A private module of the train subpackage (it imports no stage module). The samples are the
tokens files' (prepare_data), the first ``count`` of each split, as the shards of an offline
run hold them; the packing, sampling, noise and collation are ``train_data.Batches``', so a
step holds the same samples in the same order as offline. Its loader thread asks the online
target (``online_states``) for a step's samples' states, the trainer trains on the step
before, and the bounded queue between them (``capture.online.queue_depth`` steps) is where
either side waits (``train_data.PrefetchWaits``).
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch

from ..config.settings import declared
from ..formats.tokens import read_tokens
from .train_data import Batches, BatchLayout, cast_and_noise
from .trainer import OnlineSettings


def online_dataset_class():
    """speculators' ``BaseDataset`` over a tokens file whose samples' states come from an online target
    (built on first call: speculators is imported lazily). Construct it as
    ``cls(tokens_path, count, max_len, hidden_states_dtype, target, noise_std=..., seed=...)``; a sample is
    what ``train_data.shard_dataset_class``'s would be for a shard of the same samples."""
    from speculators.train.data import BaseDataset

    class OnlineDataset(BaseDataset):
        """Samples ``[0, count)`` of ``tokens_path``; their states are put into ``cache`` (``fill``) by the
        loader just before the step that reads them."""

        def __init__(self, tokens_path: str, count: int, max_len: int, hidden_states_dtype: torch.dtype, target, *,
                     noise_std: float, seed: int):
            self.toks = read_tokens(tokens_path)
            self.n = min(count, len(self.toks))
            self.target = target
            self.noise_std = noise_std
            self.seed = seed
            self.epoch = 0
            self.cache: dict[int, dict] = {}
            self.target_tokens = 0  # tokens the target computed (all epochs)
            super().__init__(max_len=max_len, hidden_states_dtype=hidden_states_dtype)

        def __len__(self) -> int:
            return self.n

        def _compute_approx_lengths(self) -> list[int]:
            return [int(self.toks.offsets[i + 1] - self.toks.offsets[i]) for i in range(self.n)]

        def fill(self, indices) -> None:
            """Compute the states of samples ``indices`` in one call of the target (its own batching)."""
            indices = [int(i) for i in indices if int(i) not in self.cache]
            samples = [self.toks.sample(i) for i in indices]
            states = self.target.states([s[0] for s in samples])
            for i, (ids, mask), (aux, last) in zip(indices, samples, states, strict=True):
                self.cache[i] = {"hidden_states": aux, "verifier_last_hidden_states": last,
                                 "input_ids": torch.from_numpy(ids.astype("int64")),
                                 "loss_mask": torch.from_numpy(mask.astype("bool"))}
                self.target_tokens += len(ids)

        def _get_raw_data(self, index: int):
            return cast_and_noise(self.cache.pop(index), self.hidden_states_dtype, self.noise_std, self.seed,
                                  self.epoch, index)

    return OnlineDataset


class OnlineBatches(Batches):
    """``Batches`` over an online target (``online_states``): ``load`` runs the target on the step's
    samples, then collates as from shards. Split ``split`` (``train`` or ``eval``) of ``online`` (its tokens
    file and sample count; ``queue_depth``: the steps the loader computes ahead), the states computed by
    ``target``, packed as ``layout`` says."""

    def __init__(self, online: OnlineSettings, split: str, target, layout: BatchLayout):
        tokens_path, count = ((online.train_tokens, online.num_train) if split == "train"
                              else (online.eval_tokens, online.num_eval))
        ds = online_dataset_class()(tokens_path, count, layout.total_seq_len, layout.dtype, target,
                                    noise_std=layout.noise_std, seed=layout.seed)
        super().__init__([], replace(layout, dequantize_on_device=False), dataset=ds)
        self.depth = online.queue_depth

    def load(self, indices) -> dict:
        """One collated row of samples ``indices``, their states computed now."""
        self.dataset.fill(indices)
        return super().load(indices)


def longest_sample(online: OnlineSettings) -> int:
    """The longest sample, in tokens, of the samples an online run uses (both splits; at least 1)."""
    longest = 1
    for path, n in ((online.train_tokens, online.num_train), (online.eval_tokens, online.num_eval)):
        if n > 0:
            off = read_tokens(path).offsets
            m = min(n, len(off) - 1)
            if m:
                longest = max(longest, int((off[1:m + 1] - off[:m]).max()))
    return longest


def check_memory_split(inputs, backend: str, num_aux: int, cfg, draft_vocab: int,
                       trust_remote_code: bool = declared("target.trust_remote_code"),
                       gpu_memory_bytes: int | None = None) -> dict:
    """Before the target is loaded: the compat report's plan of the GPU split (``budgets.plan_online_for_target``)
    made again from this run's own inputs — the target's weight files' bytes, the longest sample, the draft
    vocab — so a run switched to online after its report was written is checked too. ``gpu_memory_bytes``:
    one card's (None: the first visible GPU's). Returns the plan; skipped (``ok``) on a CPU job.

    Raises:
        MemoryError: the plan fails; its message names both sides' bytes.
    """
    from ..formats.target_files import content_files
    from ..target import load_config, text_config
    from ..workflow.budgets import plan_online_for_target

    on = inputs.online
    if on.gpus == 0:
        return {"status": "ok", "message": "CPU job"}
    if gpu_memory_bytes is None:
        gpu_memory_bytes = torch.cuda.get_device_properties(0).total_memory
    weights = sum(os.path.getsize(f) for f in content_files(inputs.target_dir)
                  if str(f).endswith((".safetensors", ".bin", ".pt", ".pth")))
    plan = plan_online_for_target(
        text_config(load_config(inputs.target_dir, trust_remote_code)), weights, backend, num_aux,
        {"gpus": on.gpus, "target_memory_fraction": on.target_memory_fraction or 0.5,
         "total_seq_len": cfg.total_seq_len, "ttt_steps": cfg.ttt_steps, "draft_vocab_size": draft_vocab,
         "tokens_per_batch": on.tokens_per_batch, "max_seq_len": longest_sample(on)}, gpu_memory_bytes)
    if plan["status"] == "fail":
        raise MemoryError(f"capture.mode online: {plan['message']}")
    return plan


def open_target(inputs, backend: str, aux_layer_ids: list[int], trust_remote_code: bool):
    """The online target for a run's ``inputs`` (``trainer.TrainInputs`` with ``online``): the compat report's
    ``backend`` (``online_states.open_states``) on the job's GPUs (none: the CPU); a vLLM engine's longest
    prompt is the longest sample of either split."""
    from .online_states import open_states

    on = inputs.online
    longest = longest_sample(on)
    return open_states(backend, inputs.target_dir, aux_layer_ids, on, max_model_len=longest + 1,
                       trust_remote_code=trust_remote_code)


def check_trainer_memory(device: str, text_cfg, cfg, num_aux: int, draft_vocab: int) -> dict | None:
    """On CUDA, with the online target already on the cards and before the draft is built: refuse to train
    when the trainer's estimated need (``budgets.draft_training_bytes`` the target's shapes, which the
    draft layer takes) exceeds the memory left free on the trainer's GPU. Returns the figures (None on CPU).

    Raises:
        MemoryError: the need and the free bytes, both named.
    """
    if not device.startswith("cuda"):
        return None
    from ..workflow.budgets import draft_training_bytes

    need = draft_training_bytes(text_cfg, draft_vocab, num_aux, cfg.total_seq_len, cfg.ttt_steps)
    free, total = torch.cuda.mem_get_info(torch.device(device))
    if need["total_bytes"] > free:
        raise MemoryError(f"capture.mode online: the trainer needs about {need['total_bytes'] / 1e9:.1f} GB "
                          f"(budgets.draft_training_bytes) but {free / 1e9:.1f} GB of {total / 1e9:.0f} GB are free on "
                          f"{device} beside the target; lower capture.online.target_memory_fraction or "
                          "train.total_seq_len")
    return {**need, "free_bytes": free, "total_bytes_gpu": total}


def online_summary(t, seconds: float) -> dict:
    """``metrics.json``'s ``online``: the backend, the target's start seconds, tokens the target computed
    (train and eval, all epochs) and its tokens/s over the run's wall ``seconds``."""
    tokens = t.train_b.dataset.target_tokens + (t.eval_b.dataset.target_tokens if t.eval_b else 0)
    return {"backend": t.target.backend, "target_start_s": round(t.target.load_s, 2), "target_tokens": tokens,
            "target_tokens_per_s": round(tokens / max(seconds, 1e-9), 1), "queue_depth": t.train_b.depth}
