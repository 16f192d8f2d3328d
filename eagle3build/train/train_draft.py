"""Stage ``train_draft``: speculators' EAGLE-3 draft model and loss under the project's own loop.

speculators' ``Trainer`` moves the model to an accelerator and fails on CPU
(speculators/train/trainer.py), so the loop is ours; everything else is speculators': the model
(``Eagle3DraftModel.from_training_args``), the draft-layer config
(``create_transformer_layer_config``), the loss (``resolve_loss_config``), sample
packing (``MultipackDistributedBatchSamplerV2``), collation (``CollateFn``) and the
EAGLE-3 input/target shift (``shift_batch``).

The loop is split as speculators' ``train/`` package splits its own: the config, one
step / epoch / evaluation in ``trainer`` (its ``trainer.py``), data in ``train_data``
(its ``data.py``), the resumable state in ``train_state`` (its ``checkpointer.py``),
process groups and launch in ``ddp`` (its ``distributed.py``), metrics and the plot in
``train_metrics``. The model comes from the shared ``head_model.build_model``; this stage module sets a run
up from its inputs (:func:`setup`), loops (:func:`fit`) and writes the checkpoint
(:func:`write_outputs`). The rule's entry, :func:`train_draft`, takes the job's ``TrainSettings`` (its
``TrainConfig`` beside the capture settings an online run reads, its files, GPUs and draft) and calls :func:`fit` in
its process, or :func:`launch` (torchrun, each rank running :func:`train`, the same run from JSON-able keyword
arguments) on more than one GPU.

On CPU the draft uses ``sdpa`` attention (flex attention has no CPU backward) and the
eager ``kl_div`` loss (the fused one needs Triton); on CUDA ``simple_flex_attention`` with bf16 autocast and the loss
``train.loss_implementation`` names (``auto``: fused). ``train.compile`` sets how a step is computed
(``compiled``): by default on CUDA the model's call (forward, loss, backward) compiled whole in
``reduce-overhead`` (CUDA graphs), eager on CPU.

Fine-tuning (config ``train.init_from``, :func:`start_from`): the model starts from a given head's weights (speculators'
format, or the EAGLE repo's converted by speculators' converter), trained on the head's own d2t/t2d (build_vocab_map
takes them) with its head flags; ``metrics.json`` gets ``initial_eval``, the eval before the first step, and
``train_meta.json`` ``init_from``, the head's folder and format.

Simulated chain acceptance length: τ_sim = 1 + Σ_k full_acc_k (see ``train_metrics``;
EAGLE-3 paper, arXiv:2503.01840, τ = tokens emitted per target forward).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Mapping
from dataclasses import asdict, fields, replace
from typing import Any

import torch

from ..atomic import atomic_path
from ..config.settings import config_fields, declared, job
from ..draft import given_head
from ..draft.choice import Draft, resolve
from ..draft.head_format import HEAD_FLAGS, HEAD_VARIANTS
from ..draft.head_model import build_model
from ..formats.artifacts import Decisions
from ..formats.shards import ShardReader, check_meta
from . import compiled, ddp, fused_loss, online_data
from .train_data import Batches, BatchLayout
from .train_metrics import plot_curves
from .train_state import TrainState, resume_world, state_key
from .trainer import (
    OnlineSettings,
    Placement,
    Throughput,
    TrainConfig,
    Trainer,
    TrainInputs,
    evaluate,
    loss_implementation,
    run_metrics,
    save_on_term,
    train_epoch,
)

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 3  # 2: train.select (the best epoch's weights by simulated tau); 3: train_meta.capture_mode
# Online (capture.mode), the states are made in this stage: what shapes them (sample counts, storage and compute dtypes,
# batching) becomes its trigger; offline the shards carry them. Its inputs are then the tokens files instead of the
# shards (rules/common.smk, states_input). train.compile and train.compile_breaks choose how the same step is computed
# (which kernels, fused how, in which graphs), not what: the weights differ from eager ones at float rounding only, as
# with another thread count or GPU, so they are runtime-only, and left out of the settings a saved training state must
# match (trainer.TrainConfig.settings): a run may resume under another. train.init_from (a head to fine-tune): its
# files are the input ``init_from`` (a changed weight retrains), its path part of the ``train`` param.
STAGE = {
    "inputs": ("target", "init_from"), "packages": ("speculators", "torch"), "entry": "train_draft",
    "decisions": ("target.fingerprint", "capture.aux_layer_ids", "head.recommended_variant", "capture.backend"),
    "params": {"aux_layer_ids": "requested", "online": "online"},
    "keys": {"run": "files", "target.bundled": "files", "target.path": "files", "target.trust_remote_code": "trigger",
             "target.offline": "runtime", "capture.mode": "trigger:online files", "capture.online.*": "runtime",
             "capture.aux_layer_ids": "trigger:aux_layer_ids", "capture.num_train_samples": "trigger:online",
             "capture.num_eval_samples": "trigger:online", "capture.tokens_per_batch": "trigger:online",
             "capture.compute_dtype": "trigger:online", "capture.storage_dtype": "trigger:online",
             "draft.method": "trigger:train", "draft.layer": "trigger:train", "draft.*.*": "trigger:train/*",
             "train.*": "trigger:train", "train.init_from": "trigger:train files", "train.compile": "runtime",
             "train.compile_breaks": "runtime", "resources.gpu_model": "runtime", "resources.train.*": "runtime"},
}



def setup(cfg: TrainConfig, inputs: TrainInputs, device: str = "auto", world_size: int | None = None,
          trust_remote_code: bool = declared("target.trust_remote_code"), draft: Draft | None = None) -> Trainer:
    """Check the inputs against the compat report, build model, batches, optimizer and scheduler.

    ``torch.manual_seed(cfg.seed)`` comes first: the model's initial weights depend on it.
    ``device`` is resolved by ``ddp.resolve_device`` (one GPU per rank under torchrun); the
    model is wrapped in DDP (``Trainer.net``) when a process group is up.
    Batches load as bf16 on CUDA (computed under bf16 autocast; half the host->device bytes)
    and fp32 on CPU (bf16 matmuls are ~20x slower there). ``draft`` (a ``choice.Draft``: config ``draft.method``,
    its options ``draft.<method>.*`` and ``draft.layer``; None: eagle3 with the llama layer) picks speculators'
    model and its layer (``head_model.build_model``), its forward arguments (``Draft.trainer_kwargs``) and whether
    rows are ``shift_batch``ed (``DraftMethod.shifted``).
    The world size (packed rows per step): torchrun's process count, or ``world_size`` rows in one
    process; where ``checkpoint_every`` > 0 and this run saved a state, the state's
    (``train_state.resume_world``: a run saved on 8 GPUs resumes on 4 with two ranks' rows per process).

    Raises:
        ShardMismatch: a shard's target fingerprint or aux ids differ from the compat report.
        ValueError: the vocab map files are inconsistent, there is nothing to train on, the
            head variant is unknown, the ``fused`` loss is asked for off CUDA, or a ``train.compile`` or
            ``train.compile_breaks`` setting outside its choices (``compiled.resolve_plan``).
        train_state.ResumeAcrossWorldSizes: this run's saved state has a smaller world size than the
            processes (the state is kept).
    """
    from ..draft import vocab_map

    distributed, rank, processes = ddp.dist_info()
    decisions = Decisions.load(inputs.decisions_json)
    fp, aux = decisions.target_fingerprint, decisions.aux_layer_ids
    init = given_head.read(cfg.init_from, "train.init_from") if cfg.init_from else None
    if cfg.head_variant == "auto":  # a given head's flags are its weights': its variant
        cfg = replace(cfg, head_variant=head_variant_of(init) if init else decisions.head_variant)
    if cfg.head_variant not in HEAD_VARIANTS:
        raise ValueError(f"train.head_variant {cfg.head_variant!r} is not one of {['auto', *HEAD_VARIANTS]}")
    if inputs.online and distributed:
        raise ValueError("capture.mode online trains in one process (the target over the job's GPUs, the draft on "
                         "the first): not under torchrun")
    for p in list(inputs.train_shards) + list(inputs.eval_shards):
        check_meta(p, ShardReader(p).meta, fp, aux)
    d2t, t2d, vocab_info = vocab_map.load(inputs.d2t_path, inputs.t2d_path, inputs.vocab_json)
    settings = {**cfg.settings(), "shards": [(p, os.path.getsize(p)) for p in inputs.train_shards],
                "vocab": vocab_info["fingerprint"], "target": fp, "aux": aux}
    draft = draft or resolve()
    settings.update(draft.state_fields())  # an EAGLE-3 llama run's saved states keep their key
    if inputs.online:  # what the states are made from: a state saved online resumes only the same online run
        on = inputs.online
        settings["online"] = on.state_settings()
        settings["online"].update(backend=decisions.backend, tokens=[(p, os.path.getsize(p)) for p in
                                                                      (on.train_tokens, on.eval_tokens)])
    # the world size (rows per step) is the run's: a saved state's where this run has one (8 GPUs resumed on 4:
    # each process computes two ranks' rows), else the processes' (or ``world_size`` rows in one process)
    world = processes if distributed else (world_size or 1)
    if cfg.checkpoint_every > 0:
        world = resume_world(inputs.state_dir, settings, world, processes)
    settings["world"] = world
    device = ddp.resolve_device(device, distributed)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    # Online: the target first (a vLLM engine sizes its memory from what is free), then the seed, so the
    # draft's initial weights are an offline run's (loading a target draws from torch's RNG).
    target = None
    if inputs.online:
        if device.startswith("cuda"):
            log.info("online GPU split: %s", online_data.check_memory_split(
                inputs, decisions.backend, len(aux), cfg, int(d2t.shape[0]), trust_remote_code)["message"])
        target = online_data.open_target(inputs, decisions.backend, aux, trust_remote_code)
        if device.startswith("cuda"):  # before the draft takes its own memory
            from ..target import load_config, text_config

            online_data.check_trainer_memory(device, text_config(load_config(inputs.target_dir, trust_remote_code)),
                                             cfg, len(aux), int(d2t.shape[0]))
    torch.manual_seed(cfg.seed)
    model = build_model(inputs.target_dir, aux, d2t, t2d, cfg.ttt_steps, cfg.head_variant, device,
                        trust_remote_code=trust_remote_code, draft=draft)
    if init is not None:
        start_from(model, init, inputs.target_dir, aux, d2t, t2d)
    hidden = model.config.transformer_layer_config.hidden_size
    ranks = [r for r in range(world) if r % processes == rank]  # all in one process; its own under torchrun
    # the eval batches: no noise, one rank's rows, whatever the world size
    shift = draft.method.shifted
    # fp8 shards dequantised on the GPU, not on the loader's thread (BatchLayout.dequantize_on_device)
    on_gpu = device.startswith("cuda")
    train_layout = BatchLayout(cfg.total_seq_len, hidden, len(aux), dtype, cfg.seed, cfg.noise_std, world, ranks,
                               shift=shift, dequantize_on_device=on_gpu)
    eval_layout = BatchLayout(cfg.total_seq_len, hidden, len(aux), dtype, cfg.seed, 0.0, shift=shift,
                              dequantize_on_device=on_gpu)
    if target is not None:
        on = inputs.online
        train_b = online_data.OnlineBatches(on, "train", target, train_layout)
        eval_b = online_data.OnlineBatches(on, "eval", target, eval_layout) if on.num_eval > 0 else None
    else:
        train_b = Batches(inputs.train_shards, train_layout)
        eval_b = Batches(inputs.eval_shards, eval_layout) if inputs.eval_shards else None
    steps_per_epoch = train_b.steps_per_epoch()
    if steps_per_epoch == 0:
        raise ValueError(f"no training batch can be formed from {inputs.train_shards} for {world} rank(s)")
    total_steps = steps_per_epoch * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, steps_per_epoch * cfg.epochs)
    loss = loss_implementation(cfg.loss_implementation, device)
    # the model's call (forward, loss, backward) compiled as train.compile says, before DDP wraps it
    plan = compiled.resolve_plan(cfg.compile, cfg.compile_breaks, device, draft.method.static_shapes,
                                 distributed=distributed, rows_per_step=len(ranks), online=target is not None)
    compiled.compile_model(model, plan)
    log.info("train step: %s; loss %s", plan.describe(), loss)
    net = ddp.wrap(model, device) if distributed else model
    call_kwargs = draft.trainer_kwargs(cfg.ttt_steps, cfg.ttt_step_loss_decay, loss)
    if plan.mode is not None and loss == "fused":  # speculators' fused KL as one op of the graph (fused_loss)
        call_kwargs["loss_config"] = fused_loss.compile_safe(call_kwargs["loss_config"])
    params, opt, sched = _optimizer(model, cfg, total_steps, device)
    meta = {"target_fingerprint": fp, "aux_layer_ids": aux, "vocab_fingerprint": vocab_info["fingerprint"],
            "draft_vocab_size": int(d2t.shape[0]), "head_variant": cfg.head_variant,
            "head_flags": draft.head_flags(HEAD_VARIANTS[cfg.head_variant]), "ttt_steps": cfg.ttt_steps,
            "world_size": world,
            "capture_mode": inputs.mode, "capture_backend": decisions.backend,
            **draft.meta_fields(),  # an EAGLE-3 llama checkpoint's train_meta.json stays as it was
            **({"init_from": {"path": cfg.init_from, "format": init.format}} if init else {}),
            # the served form the states came from (issue 74); a dense target's train_meta.json stays as it was
            **({"target_quantization": decisions.target_quantization} if decisions.target_quantization else {})}
    place = Placement(device, distributed, rank, ranks, world, processes)
    return Trainer(cfg=cfg, inputs=inputs, place=place, model=model, net=net, params=params, opt=opt, sched=sched,
                   call_kwargs=call_kwargs, train_b=train_b, eval_b=eval_b, total_steps=total_steps,
                   key=state_key(settings), meta=meta, plan=plan, target=target,
                   key_any_world=state_key({**settings, "world": None}))


def head_variant_of(head: given_head.GivenHead) -> str:
    """The head variant (``head_format.HEAD_VARIANTS``) whose flags are those of a given head's config.json.

    Raises:
        ValueError: its flags are no variant's (named).
    """
    flags = {f: bool(head.config.get(f, False)) for f in HEAD_FLAGS}
    for name, want in HEAD_VARIANTS.items():
        if want == flags:
            return name
    raise ValueError(f"train.init_from {head.path}: its head flags {flags} are none of the variants {HEAD_VARIANTS}")


def start_from(model, head: given_head.GivenHead, target_dir: str, aux: list[int], d2t: torch.Tensor,
               t2d: torch.Tensor) -> None:
    """Put the weights of the given ``head`` (config ``train.init_from``; the EAGLE format converted by speculators'
    converter, ``given_head.as_speculators``) into speculators' ``model`` (fp32, as ``build_model`` made it), in
    place: every tensor of the head, cast to the model's dtype. The head's aux layers must be ``aux`` (the
    decisions'), its ``d2t`` (int64 [draft]) and ``t2d`` (bool [target]) the run's map (build_vocab_map takes them
    from the head).

    Raises:
        ValueError: other aux layers or another map than the run's, or a tensor the model lacks or holds in another
            shape (each named).
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="eagle3-init-") as work:
        folder = given_head.as_speculators(head, target_dir, os.path.join(work, "converted"))
        ids = json.loads((folder / "config.json").read_text()).get("eagle_aux_hidden_state_layer_ids")
        state = given_head.load_state(folder)
    if ids is not None and list(ids) != list(aux):
        raise ValueError(f"train.init_from {head.path} reads aux layers {list(ids)}, the run's shards hold {list(aux)}")
    if not torch.equal(state["d2t"], d2t) or not torch.equal(state["t2d"].to(torch.bool), t2d):
        raise ValueError(f"train.init_from {head.path}: its d2t/t2d are not the run's vocab map (build_vocab_map "
                         "writes the head's)")
    own = model.state_dict()
    bad = [f"{k} {tuple(v.shape)}" + (f" (the model's {tuple(own[k].shape)})" if k in own else " (not in the model)")
           for k, v in state.items() if k not in own or own[k].shape != v.shape]
    if bad:
        raise ValueError(f"train.init_from {head.path}: {'; '.join(bad)}")
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=False)
    log.info("training starts from %s (%s): %d tensors", head.path, head.described, len(state))


def _optimizer(model, cfg: TrainConfig, total_steps: int, device: str):
    """AdamW over the trainable parameters (``fused`` on CUDA, one kernel per step; ``foreach`` elsewhere: one
    multi-tensor op per update, not one per parameter) and transformers' warmup schedule:
    ``(params, optimizer, scheduler)``; warmup is ceil(``warmup_ratio`` x ``total_steps``) steps."""
    from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    params = [p for p in model.parameters() if p.requires_grad]
    cuda = device.startswith("cuda")
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=cuda, foreach=not cuda)
    warmup = math.ceil(cfg.warmup_ratio * total_steps)
    sched = (get_cosine_schedule_with_warmup(opt, warmup, total_steps) if cfg.schedule == "cosine"
             else get_constant_schedule_with_warmup(opt, warmup))
    return params, opt, sched


def write_outputs(t: Trainer, state: TrainState, metrics: dict) -> None:
    """Write ``out_dir`` as one directory, atomically (``config.json`` + ``model.safetensors``
    via speculators' ``save_pretrained``, ``train_meta.json``, ``metrics.json``, ``curves.png``),
    then remove the resumable state."""
    with atomic_path(t.inputs.out_dir) as tmp:
        t.model.save_pretrained(tmp)
        (tmp / "train_meta.json").write_text(json.dumps(t.meta, indent=2) + "\n")
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        plot_curves(state.history, state.epochs, tmp / "curves.png")
    shutil.rmtree(t.inputs.state_dir, ignore_errors=True)
    log.info("trained %d steps in %.1f s (%.0f tokens/s); final eval %s", state.step, metrics["seconds"],
             metrics["tokens_per_s"], metrics["final_eval"])


def fit(cfg: TrainConfig, inputs: TrainInputs, device: str = "auto", world_size: int | None = None,
        trust_remote_code: bool = declared("target.trust_remote_code"), draft: Draft | None = None) -> dict:
    """Train a draft head as :func:`train` describes (:func:`setup`, then resume from a saved
    :class:`TrainState` when ``checkpoint_every`` > 0, then :func:`train_epoch` and :func:`evaluate`
    per epoch); rank 0 writes the outputs. Returns ``metrics.json``'s content.

    Raises:
        ShardMismatch, ValueError: as :func:`setup`.
        train_state.ResumeAcrossWorldSizes: as :func:`setup` (the state kept).
    """
    t = setup(cfg, inputs, device, world_size, trust_remote_code, draft)
    state = TrainState(t.model, t.opt, t.sched, world=t.world, key_any_world=t.key_any_world)
    if t.cfg.checkpoint_every > 0:
        state.load(t.inputs.state_dir, t.key)
    log.info("training %d trainable params on %s: %d train / %d eval samples, %d steps/epoch x %d epochs (%d steps), "
             "world size %d, ttt_steps=%d, %s", sum(p.numel() for p in t.params), t.device, len(t.train_b.dataset),
             len(t.eval_b.dataset) if t.eval_b else 0, t.train_b.steps_per_epoch(), t.cfg.epochs, t.total_steps,
             t.world, t.cfg.ttt_steps, t.cfg.head_variant)
    initial = initial_eval(t, state)
    speed = Throughput()
    t.model.train()
    with save_on_term(t, t.cfg.checkpoint_every > 0):  # SIGTERM: the state after the step in flight, then stop
        for epoch in range(state.epoch, t.cfg.epochs):
            if state.step >= t.total_steps:
                break
            train_epoch(t, state, epoch, speed)
            ev = (evaluate(t.model, t.eval_b, t.device, t.call_kwargs, t.cfg.ttt_steps, t.target, t.plan.cudagraphs)
                  if t.eval_b else {})
            state.epochs.append({"epoch": epoch, "step": state.step, "eval": ev,
                                 "train_loss_last": state.history[-1]["loss"] if state.history else None})
            state.epoch, state.pos = epoch + 1, 0
            if t.cfg.select == "best_simulated_tau":
                state.note_epoch(epoch, ev.get("simulated_acceptance_length"))
            if t.rank == 0:
                log.info("epoch %d: %s", epoch, json.dumps(state.epochs[-1]))
                if t.cfg.checkpoint_every > 0:
                    state.save(t.inputs.state_dir, t.key)
    metrics = run_metrics(t, state, speed)
    if initial is not None:
        metrics["initial_eval"] = initial
    metrics["selection"] = select_epoch(t.cfg.select, state)
    metrics["capture_mode"] = t.inputs.mode
    metrics["prefetch"] = t.train_b.waits.summary(metrics["seconds"])
    log.info("training batches: loader %.1f s (%s), loader waited %.1f s, trainer waited %.1f s (%.1f %% of %.1f s)",
             t.train_b.waits.load_s, "the online target's forwards" if t.target else "shard reads",
             t.train_b.waits.loader_wait_s, t.train_b.waits.trainer_wait_s,
             100 * metrics["prefetch"]["trainer_wait_share"], metrics["seconds"])
    if t.target is not None:
        metrics["online"] = online_data.online_summary(t, metrics["seconds"])
        t.target.close()
    if t.rank == 0:
        write_outputs(t, state, metrics)
    return metrics


INITIAL_EVAL = "initial_eval.json"  # beside a saved state: the eval before the first step, for a run that resumes


def initial_eval(t: Trainer, state: TrainState) -> dict | None:
    """The eval of a run that starts from a given head (``train.init_from``) before its first step (``evaluate``:
    its loss, accuracy per TTT step and simulated τ), computed where the run starts and kept beside its saved state
    (``INITIAL_EVAL``) for a run that resumes; None without ``train.init_from`` or an eval split."""
    if not t.cfg.init_from or t.eval_b is None:
        return None
    kept = os.path.join(t.inputs.state_dir, INITIAL_EVAL)
    if state.step > 0:
        return json.loads(open(kept).read()) if os.path.exists(kept) else None
    ev = evaluate(t.model, t.eval_b, t.device, t.call_kwargs, t.cfg.ttt_steps, t.target, t.plan.cudagraphs)
    log.info("eval before the first step (from %s): %s", t.cfg.init_from, json.dumps(ev))
    if t.cfg.checkpoint_every > 0 and t.rank == 0:
        os.makedirs(t.inputs.state_dir, exist_ok=True)
        with open(kept, "w") as f:
            json.dump(ev, f)
    return ev


def select_epoch(rule: str, state: TrainState) -> dict:
    """Apply ``train.select`` to the trained model: with ``best_simulated_tau``, put back the
    trainable weights of the epoch whose eval gave the highest simulated τ (``state.best``);
    with ``last``, or without an eval split (no τ), keep the last. Returns what was chosen:
    ``{"rule", "epoch", "simulated_acceptance_length", "last_epoch", "last_simulated_acceptance_length"}``
    (epochs counted from 0; τ None without eval)."""
    last = state.epochs[-1] if state.epochs else {"epoch": None, "eval": {}}
    last_tau = last["eval"].get("simulated_acceptance_length")
    out = {"rule": rule, "epoch": last["epoch"], "simulated_acceptance_length": last_tau,
           "last_epoch": last["epoch"], "last_simulated_acceptance_length": last_tau}
    if rule == "best_simulated_tau" and state.best and state.best["epoch"] != last["epoch"]:
        state.restore_best()
        out.update(epoch=state.best["epoch"], simulated_acceptance_length=state.best["tau"])
        log.info("train.select best_simulated_tau: epoch %d (simulated tau %.4f) over the last, epoch %s (%s)",
                 state.best["epoch"], state.best["tau"], last["epoch"], last_tau)
    return out


def train(**run: Any) -> dict:
    """Train a draft head on the shards and write ``out_dir`` (atomically, as one directory).

    ``run``: one run's keyword arguments, JSON-able (what :func:`launch` hands each torchrun rank):

    - its files, ``TrainInputs``' fields: ``target_dir``, ``train_shards``, ``eval_shards``, ``d2t_path``,
      ``t2d_path``, ``vocab_json``, ``decisions_json``, ``out_dir`` and ``online`` (below; absent: None);
    - how it runs: ``world_size`` (None), ``device`` (``auto``), ``trust_remote_code`` (``target.trust_remote_code``'s
      default) and ``draft``, the head's kind: a ``choice.Draft``, or the config's ``draft`` section it is resolved
      from (``choice.resolve``: ``{"method": "dflash", "dflash": {"block_size": 4}}``; None: eagle3 with the llama
      layer);
    - its settings: the config's ``train:`` keys (:class:`TrainConfig`'s fields, its defaults for those left out).

    ``out_dir`` receives: ``config.json`` + ``model.safetensors``
    (speculators format, fp32 master weights), ``train_meta.json`` (target fingerprint,
    aux ids, vocab fingerprint, head flags — what export checks), ``metrics.json`` (per-step
    train loss, per-epoch eval loss / accuracy per TTT step / simulated τ, tokens/s, and
    ``selection``: the epoch whose weights were written, by ``select``) and ``curves.png``.
    ``checkpoint_every`` > 0 saves the full training state
    (``train_state.TrainState``) every that many steps to ``<out_dir>.state/``; a run
    started again with the same settings and inputs resumes from it and ends bit-identical
    (CPU) to an uninterrupted run. The state keeps the run's world size: restarted on fewer
    processes (8 GPUs, then 4 or 1; ``world_size`` is then ignored) each computes several ranks' rows
    and the run goes on as it started; on more it is refused and the state kept
    (``train_state.ResumeAcrossWorldSizes``, naming both sizes). Under
    ``torch.distributed`` (torchrun, :func:`launch`)
    each process trains its rank's rows with DDP; ``world_size`` without it computes all
    ranks' rows in one process (the same global batch). ``device``: ``auto``, ``cpu`` or
    ``cuda``. Returns ``metrics.json``'s content.

    ``online`` (``capture.mode: online``: a ``trainer.OnlineSettings``, or a dict of its fields): no shards
    (``train_shards`` and ``eval_shards`` empty); the target (the compat report's backend) runs in
    this process beside the trainer and computes each step's states while the draft trains on the
    step before (``online_data.OnlineBatches``: a queue ``queue_depth`` steps deep). Each epoch runs
    the target again over its samples. With the same seeds, data and dtypes an online run ends with
    an offline run's weights (bit-identical where both compute each sample's states the same way,
    tests/test_online.py), and it resumes as an offline run does. ``metrics.json`` gets ``online``
    (the target's start and tokens/s) and, in both modes, ``prefetch``: where the loader and the
    trainer waited on each other (``train_data.PrefetchWaits``).

    Raises:
        TypeError: a file of ``TrainInputs`` is missing, or another key is not a ``TrainConfig`` field.
        choice.DraftError: ``draft`` is a section that cannot be built (a layer the method is not built with).
        artifacts.ArtifactError: ``decisions_json`` is missing or does not match its schema.
        ShardMismatch: a shard's target fingerprint or aux ids differ from the compat report.
        ValueError: the vocab map files are inconsistent, there is nothing to train on, a
            setting is not one of its choices, or an online run under torchrun.
        MemoryError: online on CUDA, the planned split of the GPUs cannot fit (``online_data.check_memory_split``),
            or the trainer's estimated need exceeds what the target left free.
    """
    inputs = TrainInputs(**{f.name: run.pop(f.name) for f in fields(TrainInputs) if f.name in run})
    world_size, device, draft = run.pop("world_size", None), run.pop("device", "auto"), run.pop("draft", None)
    trust_remote_code = run.pop("trust_remote_code", declared("target.trust_remote_code"))
    draft = draft if draft is None or isinstance(draft, Draft) else resolve(draft)
    return fit(TrainConfig(**run), inputs, device, world_size, trust_remote_code, draft)


def launch(kwargs: dict, nproc: int) -> None:
    """Run ``train(**kwargs)`` on ``nproc`` processes with torchrun (DDP; NCCL on GPUs, gloo on CPU). SIGTERM to this
    process reaches the ranks (``ddp.launch``): rank 0 saves the state after the step in flight.

    Raises:
        RuntimeError: a rank failed (its traceback is in the log above), or SIGTERM stopped the ranks.
    """
    ddp.launch("eagle3build.train.train_draft", kwargs, nproc)


@config_fields({
    "train": TrainConfig, "trust_remote_code": "target.trust_remote_code", "mode": "capture.mode",
    "num_train_samples": "capture.num_train_samples", "num_eval_samples": "capture.num_eval_samples",
    "storage_dtype": "capture.storage_dtype", "compute_dtype": "capture.compute_dtype",
    "tokens_per_batch": "capture.tokens_per_batch", "queue_depth": "capture.online.queue_depth",
    "target_memory_fraction": "capture.online.target_memory_fraction",
})
class TrainSettings:
    """One train_draft job (``train_draft``): its ``TrainConfig`` (``train``, the config's ``train:`` section) beside
    the capture settings an online run reads, made from their keys' declarations (below), and its own fields: the
    target of ``target_dir``; ``train_files`` and ``eval_files``, the shards of each split (online, ``mode``, the one
    tokens file of each); the vocab map (``d2t_path``, ``t2d_path``, ``vocab_json``); the compat report's
    ``decisions_json`` (target fingerprint, aux ids, head variant, capture backend); the checkpoint folder
    ``out_dir``; ``draft``, the head's kind as planning resolved it (a ``choice.Draft``; its section, the job's
    ``draft`` param, becomes one; a draft.compare_methods job's: its method with its layer); the job's ``gpus``."""

    target_dir: str = job("params.target_dir")
    out_dir: str = job("params.out_dir")
    train_files: list[str] = job("inputs.train")
    eval_files: list[str] = job("inputs.eval")
    d2t_path: str = job("inputs.d2t")
    t2d_path: str = job("inputs.t2d")
    vocab_json: str = job("inputs.vocab")
    decisions_json: str = job("inputs.decisions")
    draft: Draft = job("params.draft", default_factory=resolve)
    gpus: int = job("resources.gpu?", default=0)

    def __post_init__(self) -> None:
        if isinstance(self.draft, Mapping):
            object.__setattr__(self, "draft", resolve(self.draft))

    @property
    def online(self) -> OnlineSettings | None:
        """``train``'s ``online`` argument: None where ``mode`` is ``offline`` (the files are shards), else the states'
        settings (the sample counts, ``storage_dtype``, ``compute_dtype``, ``tokens_per_batch``, ``queue_depth``,
        ``target_memory_fraction``) over the tokens files, on the job's ``gpus``."""
        if self.mode != "online":
            return None
        return OnlineSettings(train_tokens=str(self.train_files[0]), eval_tokens=str(self.eval_files[0]),
                              num_train=self.num_train_samples, num_eval=self.num_eval_samples,
                              storage_dtype=self.storage_dtype, compute_dtype=self.compute_dtype,
                              tokens_per_batch=self.tokens_per_batch, gpus=self.gpus, queue_depth=self.queue_depth,
                              target_memory_fraction=self.target_memory_fraction)


def train_draft(s: TrainSettings) -> None:
    """Rule ``train_draft``'s entry (``eagle3build.workflow.job.run_stage``): ``train`` the run of ``s`` on the CPU
    (``s.gpus`` 0), on one GPU, or with ``launch`` on more (one DDP process per GPU of the job's slots), into
    ``s.out_dir``. Online (``s.online``) the run is always one process: the target over the job's GPUs, the draft on
    the first.

    Raises:
        RuntimeError: a rank of a distributed run failed.
        and what ``fit`` raises.
    """
    device, online = ("cuda" if s.gpus > 0 else "cpu"), s.online
    files = dict(target_dir=s.target_dir, d2t_path=s.d2t_path, t2d_path=s.t2d_path, vocab_json=s.vocab_json,
                 decisions_json=s.decisions_json, out_dir=s.out_dir)
    if s.gpus > 1 and online is None:  # torchrun: the ranks get train's arguments as JSON
        launch(dict(files, train_shards=list(s.train_files), eval_shards=list(s.eval_files), device=device,
                    trust_remote_code=s.trust_remote_code, draft=s.draft.section(), **asdict(s.train)), nproc=s.gpus)
        return
    # one process; online, the target over the job's GPUs and the draft on the first (train's docstring)
    shards = ([], []) if online else (list(s.train_files), list(s.eval_files))
    fit(s.train, TrainInputs(train_shards=shards[0], eval_shards=shards[1], online=online, **files), device,
        trust_remote_code=s.trust_remote_code, draft=s.draft)


if __name__ == "__main__":
    ddp.main(train, "eagle3build.train.train_draft")
