"""The draft-head training loop: config, one step, one epoch, evaluation, the run's metrics.

A private module of the train subpackage (it imports no stage module); ``train_draft`` sets a run up
(``setup``: model, batches, optimizer) and loops over :func:`train_epoch` and
:func:`evaluate`, as speculators' ``train/trainer.py`` does for its ``Trainer`` (which needs
an accelerator, hence this loop). The model is speculators' ``Eagle3DraftModel``: its
``forward(**row, ttt_steps=..., ttt_step_loss_decay=..., loss_config=...)`` returns
``(logits, loss, metrics)`` and trains ``ttt_steps`` draft tokens per position (EAGLE-3's
training-time test, arXiv:2503.01840 §3.3).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..config.settings import declared, section_fields, settings_class
from ..config.spec import KEYS, Key
from .compiled import CompilePlan
from .train_data import Batches
from .train_metrics import accumulate, draft_flops_per_token, history_entry, summarise, to_floats
from .train_state import TrainState

# TrainConfig fields a saved state may differ in and still be resumed (``_TrainConfigChecks.settings``)
RESUMABLE_ACROSS = ("checkpoint_every", "compile", "compile_breaks")


class _TrainConfigChecks:
    """The views of ``TrainConfig`` (whose fields config.spec's section ``train`` declares)."""

    def settings(self) -> dict:
        """The fields a saved state must match to be resumed: all but ``checkpoint_every``, ``compile`` and
        ``compile_breaks`` (how often it saves, how its steps are computed: config.keys_head says why), and
        ``init_from`` while it is None (a state saved before the key existed keeps its key)."""
        return {k: v for k, v in asdict(self).items()
                if k not in RESUMABLE_ACROSS and not (k == "init_from" and v is None)}


def train_config_class(keys: tuple[Key, ...] = KEYS) -> type:
    """A frozen dataclass with a keyword-only field per key of section ``train`` of ``keys``
    (eagle3build.config.spec; ``config.settings.settings_class``): its Python type, its default (config.yaml's
    value); constructing one with a value outside a key's ``enum`` raises ValueError."""
    return settings_class("TrainConfig", section_fields("train", keys), keys, bases=(_TrainConfigChecks,),
                          module=__name__, doc="The config's ``train:`` section, as ``train()`` receives it.")


# The config's ``train:`` section (``head_variant``: ``eagle3``, ``eagle3.1`` or ``auto``, the compat report's
# choice; ``lr``: peak AdamW learning rate, reached after ``warmup_ratio`` x the run's steps, then ``cosine`` decay
# to 0 or ``constant``; ``ttt_steps``: draft tokens trained per position, EAGLE-3's training-time test,
# arXiv:2503.01840 §3.3, their losses weighted by ``ttt_step_loss_decay`` ** k; ``checkpoint_every`` > 0: save
# the resumable state every that many steps and at each epoch's end, not part of the settings a state must
# match; ``loss_implementation``: speculators' ``eager`` KL or its Triton ``fused`` kernel, CUDA only, or ``auto``
# (``loss_implementation``); ``compile``, ``compile_breaks``: how a step is compiled, compiled.resolve_plan;
# ``select``: the epoch whose weights the checkpoint holds). Raises ValueError for a value outside a key's
# choices (the stage checks ``head_variant`` again once ``auto`` is resolved).
TrainConfig = train_config_class()


def loss_implementation(setting: str, device: str) -> str:
    """speculators' loss implementation of config ``train.loss_implementation`` on ``device``: ``auto`` is ``fused``
    (its Triton kernel) on CUDA and ``eager`` elsewhere; ``eager`` and ``fused`` as they are.

    Raises:
        ValueError: ``fused`` off CUDA (the kernel needs a GPU).
    """
    cuda = device.startswith("cuda")
    if setting == "auto":
        return "fused" if cuda else "eager"
    if setting == "fused" and not cuda:
        raise ValueError("train.loss_implementation 'fused' needs CUDA (a Triton kernel); use 'eager' or 'auto'")
    return setting


@dataclass(frozen=True)
class OnlineSettings:
    """``capture.mode: online``: how the target computes the states beside the trainer. ``train_tokens``,
    ``eval_tokens``: the tokens files (prepare_data's); ``num_train``, ``num_eval``: their first samples used
    (``capture.num_*_samples``); ``storage_dtype``: the rounding of the states, as a shard would store them
    (``capture.storage_dtype``); ``compute_dtype``: the target's (``capture.compute_dtype``); ``tokens_per_batch``:
    tokens per target forward (``capture.tokens_per_batch``); ``gpus``: the job's, the target's (0: CPU);
    ``queue_depth``: steps computed ahead (``capture.online.queue_depth``); ``target_memory_fraction``: the
    target's share of each GPU (``capture.online.target_memory_fraction``; None: the backend's default)."""

    train_tokens: str
    eval_tokens: str
    num_train: int
    num_eval: int
    storage_dtype: str
    compute_dtype: str
    tokens_per_batch: int
    gpus: int = 0
    queue_depth: int = declared("capture.online.queue_depth")
    target_memory_fraction: float | None = None

    def state_settings(self) -> dict:
        """The settings that shape the states, which a saved state must match (``train_state.state_key``)."""
        return {k: getattr(self, k) for k in ("num_train", "num_eval", "storage_dtype", "compute_dtype",
                                              "tokens_per_batch")}


@dataclass(frozen=True)
class TrainInputs:
    """What a run reads and where it writes: the target's HF directory, the train and eval
    shards (capture_hidden_states), the vocab map (build_vocab_map: ``d2t.npy``, ``t2d.npy``,
    ``vocab.json``), the compat report's decisions (target fingerprint, aux layer ids, head
    variant, capture backend) and ``out_dir``, the checkpoint directory to write.

    ``online`` (``capture.mode: online``; no shards then): an ``OnlineSettings``, or a mapping of its
    fields (a run's JSON arguments), which becomes one."""

    target_dir: str
    train_shards: list[str]
    eval_shards: list[str]
    d2t_path: str
    t2d_path: str
    vocab_json: str
    decisions_json: str
    out_dir: str
    online: OnlineSettings | None = None

    def __post_init__(self) -> None:
        if isinstance(self.online, Mapping):
            object.__setattr__(self, "online", OnlineSettings(**self.online))

    @property
    def mode(self) -> str:
        """``capture.mode``: ``online`` (the target runs beside the trainer) or ``offline`` (shards)."""
        return "online" if self.online else "offline"

    @property
    def state_dir(self) -> Path:
        """``<out_dir>.state/``: the resumable state while the run is under way."""
        return Path(f"{os.path.normpath(self.out_dir)}.state")


@dataclass(frozen=True)
class Placement:
    """Where a run computes: ``device`` (``cpu``, ``cuda``, ``cuda:<rank>``), whether under ``torch.distributed``
    (``distributed``), this process's ``rank``, the ``ranks`` whose rows it computes each step (those ``r`` with
    ``r % processes == rank``: its own under torchrun, all ``world`` of them in one process, several each where a
    run saved on more GPUs resumes on fewer), the ``world`` size (ranks: packed rows per step) and the number of
    ``processes`` computing them (torchrun's world size; 1 in one process)."""

    device: str
    distributed: bool
    rank: int
    ranks: list[int]
    world: int
    processes: int = 1


@dataclass
class Trainer:
    """One run, set up (``train_draft.setup``): the resolved config, the devices and ranks, the model
    (``net`` is it under DDP), optimizer, scheduler, batches and what the outputs record.

    ``ranks``: the rank rows this process computes each step (``Placement``). ``key``: the settings hash a saved state
    must match (``train_state.state_key``). ``meta``: ``train_meta.json``. ``target``: online,
    the target computing the states (``online_states.HooksStates`` or ``VllmStates``).
    """

    cfg: TrainConfig
    inputs: TrainInputs
    place: Placement
    model: torch.nn.Module
    net: torch.nn.Module
    params: list[torch.nn.Parameter]
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    call_kwargs: dict
    train_b: Batches
    eval_b: Batches | None
    total_steps: int
    key: str
    meta: dict
    plan: CompilePlan = field(default_factory=CompilePlan)  # how the model's call is compiled (``compiled``)
    target: object = None  # online: the target computing the states (online_states), else None
    key_any_world: str = ""  # ``key`` without the world size: this run's state saved at another world size
    stop: threading.Event | None = None  # set by SIGTERM (``save_on_term``): save the state after this step, stop

    @property
    def device(self) -> str:
        """``place.device``."""
        return self.place.device

    @property
    def rank(self) -> int:
        """``place.rank``."""
        return self.place.rank

    @property
    def ranks(self) -> list[int]:
        """``place.ranks``."""
        return self.place.ranks

    @property
    def world(self) -> int:
        """``place.world``."""
        return self.place.world

    @property
    def cuda(self) -> bool:
        """Whether the run computes on a GPU (bf16 autocast, pinned batches)."""
        return self.device.startswith("cuda")


@dataclass
class Throughput:
    """Training tokens (non-padding positions) this process computed since ``t0`` (``time.perf_counter`` seconds)."""

    tokens: int = 0
    t0: float = field(default_factory=time.perf_counter)

    def seconds(self) -> float:
        """Wall-clock seconds since ``t0``."""
        return time.perf_counter() - self.t0


def train_step(t: Trainer, rows: list[dict], speed: Throughput) -> tuple[dict, torch.Tensor]:
    """One optimizer step over the collated ``rows`` this process computes (``train_data.Batches``),
    so that the gradient is the mean over the step's ``world`` rows: each loss divided by
    ``world / processes`` (DDP then averages over the processes; in one process that is the number of
    rows, and also where processes do not divide the world size, 3 rows on 2 processes, the mean is
    exact); under DDP the gradients of all but the last row accumulate locally (``no_sync``), so each
    process all-reduces once per step, whatever its row count. Gradients clipped to ``grad_clip``,
    AdamW and scheduler stepped.

    Returns the summed speculators metrics (device tensors, ``train_metrics.accumulate``) and
    the pre-clip global gradient norm (0-d fp32 tensor).
    """
    t.opt.zero_grad(set_to_none=True)
    acc: dict = {}
    rows_per_process = t.world / t.place.processes
    for i, row in enumerate(rows):
        last = i == len(rows) - 1
        with contextlib.ExitStack() as ctx:
            if t.place.distributed and not last:
                ctx.enter_context(t.net.no_sync())
            # forward and backward: torch compiles the backward lazily, at the first backward (online_states)
            with target_guard(t.target):
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=t.cuda):
                    _, loss, metrics = forward(t.net, t.train_b.to_device(row, t.device), t.call_kwargs,
                                               t.plan.cudagraphs and t.cuda)
                (loss / rows_per_process).backward()
        accumulate(acc, metrics)
        speed.tokens += int((row["document_ids"] != -1).sum())
    gnorm = torch.nn.utils.clip_grad_norm_(t.params, t.cfg.grad_clip)
    t.opt.step()
    t.sched.step()
    return acc, gnorm


def forward(net, batch: dict, call_kwargs: dict, cudagraphs: bool = False) -> tuple:
    """``net(**batch, **call_kwargs)``: speculators' ``(draft tokens, loss, metrics)``. With ``cudagraphs`` (the
    model's call compiled in a CUDA-graph mode, ``compiled``) a new step is marked first
    (``torch.compiler.cudagraph_mark_step_begin``) and the metrics are copied out of the graph's memory, which its next
    replay writes over (they are kept until the next flush): one multi-tensor op, ``_foreach_mul`` by 1."""
    if cudagraphs:
        torch.compiler.cudagraph_mark_step_begin()
    tokens, loss, metrics = net(**batch, **call_kwargs)
    if cudagraphs and metrics:
        metrics = dict(zip(metrics, torch._foreach_mul(list(metrics.values()), 1)))
    return tokens, loss, metrics


def _flush(t: Trainer, pending: list[tuple], history: list[dict]) -> None:
    """Append the pending steps' records to ``history`` (the host waits for the device here)."""
    history.extend(history_entry(st, acc, lr, gn, t.cfg.ttt_steps, len(t.ranks)) for st, acc, lr, gn in pending)
    pending.clear()


class TrainingStopped(RuntimeError):
    """SIGTERM reached a run that saves its state (``save_on_term``): the state was saved after the step in flight,
    and the same job run again resumes from it (the message names the step and the state's folder)."""


@contextlib.contextmanager
def save_on_term(t: Trainer, enabled: bool):
    """While the block runs, SIGTERM sets ``t.stop`` instead of ending the process, so that ``train_epoch`` saves the
    resumable state after the step in flight and raises ``TrainingStopped``: a run cut by its caller's deadline (a
    device call's end, a cluster's time limit; both send TERM first) loses no step. Only where ``enabled``
    (``checkpoint_every`` > 0: a state is resumable) and on the main thread; the previous handler is put back."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    t.stop = threading.Event()
    before = signal.signal(signal.SIGTERM, lambda *_: t.stop.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def train_epoch(t: Trainer, state: TrainState, epoch: int, speed: Throughput) -> None:
    """Run epoch ``epoch`` from batch ``state.pos`` until its end or ``t.total_steps``.

    Steps, history and (rank 0, every ``checkpoint_every`` steps) the saved state go into
    ``state``. Metrics stay on the device until flushed (every 20 steps and before a save):
    the host never waits for the GPU mid-epoch, so it queues the next step while this one runs.

    Raises:
        TrainingStopped: ``t.stop`` was set (SIGTERM, ``save_on_term``); the state after the last step is saved.
    """
    from tqdm import tqdm

    plan = t.train_b.epoch(epoch)
    first = state.pos
    n_run = max(0, min(len(plan) - first, t.total_steps - state.step))
    bar = tqdm(total=n_run, desc=f"epoch {epoch}", file=sys.stderr, mininterval=5, disable=t.rank != 0)
    pending: list[tuple] = []
    loaded = t.train_b.prefetch(plan[first:first + n_run], pin=t.cuda)
    for pos, rows in zip(range(first, first + n_run), loaded):
        acc, gnorm = train_step(t, rows, speed)
        state.step += 1
        pending.append((state.step, acc, t.sched.get_last_lr()[0], gnorm.detach()))
        bar.update(1)
        every = t.cfg.checkpoint_every
        stopping = t.stop is not None and t.stop.is_set()
        saving = (stopping or (every > 0 and state.step % every == 0)) and t.rank == 0
        if saving or len(pending) >= 20:
            _flush(t, pending, state.history)
            bar.set_postfix(loss=f"{state.history[-1]['loss']:.3f}", tok_s=f"{speed.tokens / speed.seconds():.0f}")
        if saving:
            state.epoch, state.pos = epoch, pos + 1
            state.save(t.inputs.state_dir, t.key)
        if stopping:
            bar.close()
            raise TrainingStopped(f"SIGTERM: the training state after step {state.step} of {t.total_steps} is saved in "
                                  f"{t.inputs.state_dir}; the same job run again resumes from it")
    _flush(t, pending, state.history)
    bar.close()


def target_guard(target):
    """The online target's ``guard`` (``online_states``: its forwards on the prefetch thread and the draft's
    compiled forward and backward here never run at once), or a no-op offline (``target`` None)."""
    return target.guard if target is not None else contextlib.nullcontext()


@torch.no_grad()
def evaluate(model, batches: Batches, device: str, call_kwargs: dict, ttt_steps: int, target=None,
             cudagraphs: bool = False) -> dict:
    """Loss, accuracy per TTT step and simulated τ over the eval shards (every batch of
    ``batches``' epoch 0, this one process; ``train_metrics.summarise`` gives the fields).
    ``model`` is speculators' ``Eagle3DraftModel`` (not its DDP wrapper); it is left in train mode.
    ``target``: online, the target computing the states (its ``guard`` is held for each draft forward);
    ``cudagraphs``: the model's call is compiled in a CUDA-graph mode (``forward``)."""
    model.eval()
    acc: dict[str, float] = {}
    for rows in batches.prefetch(batches.epoch(0), pin=device.startswith("cuda")):
        for batch in rows:
            b = batches.to_device(batch, device)
            with target_guard(target), torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
                _, _, metrics = forward(model, b, call_kwargs, cudagraphs and device.startswith("cuda"))
            accumulate(acc, metrics)
    model.train()
    return summarise(to_floats(acc), ttt_steps)


def run_metrics(t: Trainer, state: TrainState, speed: Throughput) -> dict:
    """``metrics.json``: steps, per-epoch and per-step records, tokens/s over every rank, FLOPs per token."""
    seconds = speed.seconds()
    return {
        "steps": state.step,
        "epochs": state.epochs,
        "final_eval": state.epochs[-1]["eval"] if state.epochs else {},
        "train_history": state.history,
        "train_tokens_this_process": speed.tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(speed.tokens * t.place.processes / max(seconds, 1e-9), 1),
        "device": t.device,
        "resumed_from_step": state.resumed_from,
        "flops_per_token": draft_flops_per_token(t.model, t.cfg.ttt_steps),
    }
