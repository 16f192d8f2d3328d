"""The resumable state of a training run, saved and restored in one place.

A private module of the train subpackage (it imports no stage module). The counterpart of speculators'
``train/checkpointer.py``, which saves model, optimizer and scheduler per epoch for its
``Trainer``; ours also keeps the data position within the epoch, the RNG states and the
metrics so far, so that a resumed run ends bit-identical (on CPU) to an uninterrupted one.

On disk: ``<state_dir>/state.pt``, one ``torch.save`` dict (read back with
``torch.load(weights_only=True)``: tensors, numbers, strings, lists and dicts only) of

====================  ============================================================
``key``               str, the run's settings hash (:func:`state_key`)
``step``              int, optimizer steps done
``epoch``, ``pos``    int, the next batch to run: its epoch and index in that epoch
``model``             the model's ``state_dict`` (fp32 master weights)
``optimizer``         the optimizer's ``state_dict``
``scheduler``         the LR scheduler's ``state_dict``
``torch_rng``         ``torch.get_rng_state()`` (uint8 tensor)
``cuda_rng``          ``torch.cuda.get_rng_state_all()``, ``[]`` without CUDA
``history``           str, JSON of the per-step train records so far
``epochs``            str, JSON of the per-epoch records so far
``best``              the best epoch so far (``train.select: best_simulated_tau``):
                      ``{"epoch", "tau", "top", "params"}`` (its τ, the highest τ seen,
                      its trainable parameters), or ``{}``
``world``             int, the world size (ranks) of the run that saved it
``key_any_world``     str, the settings hash without the world size
====================  ============================================================

The world size (ranks: packed rows per optimizer step) is the run's, not the machine's: nothing in
a state is per rank (the data position is a global step, the optimizer's moments and the scheduler
are the replicated model's), so a run saved on 8 GPUs resumes on 4, or on 1, with the saved world
size (:func:`resume_world`): each process then computes several ranks' rows per step, and the run
goes on with the global batches, step count and learning-rate schedule it started with. On more
processes than the saved world size a process would compute no row: that is refused and the state
kept (:class:`ResumeAcrossWorldSizes`, naming both sizes).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..atomic import atomic_path

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
TAU_TIE = 1e-4  # simulated τ values closer than this are equal (note_epoch)


def state_key(settings: dict) -> str:
    """16 hex digits of the sha256 of ``settings`` as key-sorted JSON (non-JSON values via ``str``):
    a state is resumed only by a run whose key is the same."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


class ResumeAcrossWorldSizes(RuntimeError):
    """A saved state of this run that this run's processes cannot resume (more processes than its world
    size): refused, the state kept (the message names the file, both sizes and what to do)."""


# World sizes tried against a state's key where the state does not record its world size (saved before it did).
LEGACY_MAX_WORLD = 1024


def resume_world(state_dir: Path, settings: dict, world: int, processes: int) -> int:
    """The world size (ranks: packed rows per optimizer step) a run with ``settings`` (its settings without the
    world size, as :func:`state_key` hashes them with ``"world"`` added) takes: that of its own saved state in
    ``state_dir`` where there is one, else ``world`` (the ranks asked for).

    ``processes``: the processes computing the run (torchrun's world size; 1 in one process), each computing
    the rows of the ranks ``r`` with ``r % processes`` = its rank. A state of this run is recognised by its
    ``key_any_world``, or, where it records none (saved before it did), by its key for a world size up to
    ``LEGACY_MAX_WORLD``. A state of other settings is not this run's: ``world`` is returned and
    :meth:`TrainState.load` ignores it. The state is read memory-mapped (its tensors are not loaded).

    Raises:
        ResumeAcrossWorldSizes: the saved world size is smaller than ``processes`` (a process would compute
            no row); the file is left as it is.
    """
    f = state_dir / STATE_FILE
    if not f.exists():
        return world
    state = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
    saved = state.get("world")
    if state.get("key_any_world") != state_key({**settings, "world": None}):
        saved = next((w for w in range(1, LEGACY_MAX_WORLD + 1) if state.get("key") == state_key(
            {**settings, "world": w})), None) if "key_any_world" not in state else None
    if saved is None or saved == world:
        return world
    if saved < processes:
        raise ResumeAcrossWorldSizes(
            f"{f}: saved at step {state.get('step')} by this run on world size {saved} (ranks: GPUs, or rows per "
            f"step on CPU), but this run has {processes} processes: a run resumes on as many processes as its "
            f"world size or fewer (each then computes several ranks' rows), not on more. The state is kept: run "
            f"on at most {saved} GPUs (resources.train.gpu) to resume it, or delete {state_dir} to start over on "
            f"{processes}")
    log.warning("resuming %s (step %d) with its world size %d on %d process(es)%s: the run's global batches, "
                "step count and learning-rate schedule are kept (delete %s to start over on %d instead)", f,
                state.get("step", 0), saved, processes,
                f", each computing the rows of {saved / processes:g} ranks per step" if saved > processes else "",
                state_dir, world)
    return saved


@dataclass
class TrainState:
    """What a resumed run needs, around the live model, optimizer and scheduler.

    ``step`` counts optimizer steps; ``epoch`` and ``pos`` name the next batch to run;
    ``history`` and ``epochs`` are the ``train_history`` and ``epochs`` records of
    ``metrics.json`` so far; ``resumed_from`` is the step :meth:`load` resumed at (None when
    the run started afresh).
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    step: int = 0
    epoch: int = 0
    pos: int = 0
    history: list[dict] = field(default_factory=list)
    epochs: list[dict] = field(default_factory=list)
    resumed_from: int | None = None
    best: dict = field(default_factory=dict)  # {"epoch", "tau", "top", "params": {name: CPU tensor}}
    world: int = 1  # the run's world size (ranks), saved with the state
    key_any_world: str = ""  # the settings hash without the world size: tells this run's state at another world size

    def note_epoch(self, epoch: int, tau: float | None) -> bool:
        """Keep a copy (on the CPU) of the trainable parameters when ``tau`` (this epoch's simulated τ)
        is the best so far; True when it is. An epoch within ``TAU_TIE`` of the best counts as
        better: at equal τ the longer-trained weights win, and float noise (another rank count,
        another CPU) cannot tip the choice to an earlier epoch. Frozen weights (the target's
        embeddings) never change, so they are not copied: a 1T target's embedding matrix is GBs."""
        if tau is None or (self.best and tau < self.best["top"] - TAU_TIE):
            return False
        params = {n: p.detach().to("cpu", copy=True) for n, p in self.model.named_parameters() if p.requires_grad}
        # "top": the highest τ seen, so that a run of near-equal epochs cannot drift below it
        self.best = {"epoch": epoch, "tau": float(tau), "top": max(float(tau), self.best.get("top", float(tau))),
                     "params": params}
        return True

    def restore_best(self) -> None:
        """Put the best epoch's trainable parameters back into the model."""
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                if n in self.best["params"]:
                    p.copy_(self.best["params"][n].to(p.device))

    def save(self, state_dir: Path, key: str) -> None:
        """Write ``state_dir/state.pt`` atomically (the module docstring lists its fields)."""
        state = {
            "key": key, "step": self.step, "epoch": self.epoch, "pos": self.pos,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "history": json.dumps(self.history), "epochs": json.dumps(self.epochs), "best": self.best,
            "world": self.world, "key_any_world": self.key_any_world,
        }
        state_dir.mkdir(parents=True, exist_ok=True)
        with atomic_path(state_dir / STATE_FILE) as tmp:
            torch.save(state, tmp)

    def load(self, state_dir: Path, key: str) -> bool:
        """Restore everything from ``state_dir/state.pt`` (tensors onto the model's and optimizer's
        devices, RNG states included) if it was saved under ``key``; False, changing nothing,
        when there is no such file or it belongs to a run with other settings or inputs.

        Raises:
            ResumeAcrossWorldSizes: the state is this run's (``key_any_world``) at another world size than
                ``world`` (:func:`resume_world` gives the run the saved one first); the file is left as it is.
        """
        f = state_dir / STATE_FILE
        if not f.exists():
            return False
        state = torch.load(f, map_location="cpu", weights_only=True)
        saved_world = state.get("world")
        if (state.get("key") != key and self.key_any_world and state.get("key_any_world") == self.key_any_world
                and saved_world != self.world):
            raise ResumeAcrossWorldSizes(
                f"{f}: saved at step {state.get('step')} by this run on world size {saved_world}, loaded with world "
                f"size {self.world} (train_state.resume_world gives a run its saved world size). The state is kept: "
                f"resume it with world size {saved_world}, or delete {state_dir} to start over")
        if state.get("key") != key:
            log.warning("ignoring %s: saved by a run with other settings or inputs", f)
            return False
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"]:
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.step, self.epoch, self.pos = state["step"], state["epoch"], state["pos"]
        self.history, self.epochs = json.loads(state["history"]), json.loads(state["epochs"])
        self.best = state.get("best") or {}
        self.resumed_from = self.step
        log.info("resumed from %s at step %d (epoch %d, batch %d)", state_dir, self.step, self.epoch, self.pos)
        return True
