"""Stage ``capture_hidden_states``: run the target over one shard's samples and store its hidden states.

Backend "hooks": forward pre-hooks on the aux decoder layers record the residual
stream *entering* each (vLLM's and speculators' convention for aux layer id ``k``), and a
forward hook on the last decoder layer records its output *before* the final norm —
the state speculators' ``Eagle3DraftModel`` feeds through its own ``verifier_norm`` and
``verifier_lm_head`` to rebuild the target's logits (speculators/models/eagle3.py; vLLM's
``eagle_aux_hidden_state_layer_ids`` count the same way).
Only the text model that owns the layers is run, so the target's ``lm_head`` costs nothing.

The GPU never waits for the disk: each batch's valid rows are packed and cast (or
fp8-quantised) on the GPU, copied to pinned host memory on a side stream, and a writer
thread puts them straight into the shard file (``ShardFileWriter``) while the next
batch computes.

The hooks are ``hooks.HookCapture``, the copy/write overlap ``shard_pipeline.WriterPipeline``
and the engine backend ``vllm.capture`` (all shared with the compat report's probes).

One target load for a run's shards (issue 70): each shard stays one Snakemake job (its own params, log, benchmark and
staleness), and the job hands its shard to a capture host (eagle3build/workflow/host.py; ``contract.HOSTED``): a
process per Snakemake run and GPU set that loads the target once (``host_load``; the vllm backend: its engine) and
captures the shards of the jobs that come to it, one after another, with ``capture_shard``: the capture itself, the
same in a host and in a caller's own process. This module imports no torch when imported: a job's process only asks.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..config.provenance import NATIVE_BF16_FLAGS, emulates_bf16
from ..config.settings import config_fields, declared, job
from ..formats.tokens import read_tokens

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 1
# One shard per job: the sample counts and the shard size decide which shards exist (a shard's range is its param), and
# the job reads the split's size for its disk check. Aux ids and backend are triggers only: the job reads what the
# report decided. The job hands its shard to a capture host that keeps the target loaded for the next (workflow/host.py).
STAGE = {
    "packages": ("torch", "transformers"), "entry": "capture_shard", "hosted": {"spec": "host_spec", "load": "host_load"},
    "params": {"aux_layer_ids": "requested", "backend": "requested"},
    "keys": {"run": "files", "target.bundled": "files", "target.path": "files", "target.trust_remote_code": "trigger",
             "target.offline": "runtime", "target.pipeline_parallel_size": "runtime", "data.max_seq_len": "runtime",
             "capture.mode": "files", "capture.backend": "trigger:backend", "capture.aux_layer_ids": "trigger:aux_layer_ids",
             "capture.num_train_samples": "runtime files", "capture.num_eval_samples": "runtime files",
             "capture.samples_per_shard": "runtime files", "capture.tokens_per_batch": "trigger",
             "capture.compute_dtype": "trigger:compute_dtype", "capture.storage_dtype": "trigger",
             "resources.gpu_model": "runtime", "resources.capture.*": "runtime"},
}

# hooks.py's batching and capture, this stage's API (tests, benchmarks), imported when first used (they import torch).
_HOOKS_API = ("HookCapture", "padded_batch", "plan_batches", "unpad")


def __getattr__(name: str):
    if name in _HOOKS_API:
        from .. import hooks

        return getattr(hooks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class JobGone(RuntimeError):
    """The job that asked for a shard is gone (``capture_shard``'s ``alive`` said so): its shard was dropped."""


def check_disk_for_shard(out_path: str | os.PathLike, target_dir: str | None, num_aux: int, storage_dtype: str, tokens: int,
                         trust_remote_code: bool = declared("target.trust_remote_code"),
                         hidden_size: int | None = None) -> dict:
    """Fail before the target is loaded if this shard cannot fit on the disk under ``out_path``.

    Bytes: ``tokens x (num_aux + 1) x hidden x element size`` (+ ids, mask and fp8 scales),
    the compat report's disk plan for one shard. The compat report plans the whole run
    when it is built; this check covers a run grown since (more samples).

    Raises:
        OSError: the shard needs more bytes than are free (both numbers in the message).
    """
    from ..target import load_config, text_config
    from ..workflow.budgets import hidden_state_bytes_per_token, plan_disk

    # ``hidden_size`` where the caller already holds the model (no target directory needed)
    hidden = hidden_size or text_config(load_config(target_dir, trust_remote_code)).hidden_size
    d = Path(out_path).resolve().parent
    while not d.exists():
        d = d.parent
    plan = plan_disk(hidden_state_bytes_per_token(num_aux, hidden, storage_dtype, with_tokens=True), tokens,
                     shutil.disk_usage(d).free)
    if plan["status"] == "fail":
        raise OSError(f"{out_path}: not enough disk for this shard: {plan['message']}")
    return plan


def check_disk_for_split(out_path: str | os.PathLike, offsets, split_samples: int, samples_per_shard: int,
                         bytes_per_token: int) -> dict:
    """Fail before the target is loaded if the shards of this split still to capture cannot all fit.

    A split's shard ``j`` (``shard-{j:05d}.safetensors`` beside ``out_path``) holds samples
    ``[j*S, min((j+1)*S, N))``; its bytes are the tokenized data's real token counts
    (``offsets``: int64 [n+1] of the tokens file) x ``bytes_per_token``. Shards already on disk
    count nothing. This is the refusal the compat report cannot make: it plans before the data
    is tokenized, on the upper bound samples x ``max_seq_len``, and only warns on it.
    Returns ``{"shards_missing", "tokens", "needed_bytes", "free_bytes"}``.

    Raises:
        OSError: the missing shards need more bytes than are free (both numbers in the message).
    """
    out_path = Path(out_path)
    n = min(split_samples, len(offsets) - 1)
    missing, tokens = 0, 0
    for j in range(math.ceil(n / samples_per_shard)):
        if (out_path.parent / f"shard-{j:05d}.safetensors").exists():
            continue
        a, b = j * samples_per_shard, min((j + 1) * samples_per_shard, n)
        missing += 1
        tokens += int(offsets[b] - offsets[a])
    d = out_path.resolve().parent
    while not d.exists():
        d = d.parent
    free = shutil.disk_usage(d).free
    need = tokens * bytes_per_token
    if need > free:
        raise OSError(f"{out_path.parent}: not enough disk for the {missing} shard(s) of this split still to capture: "
                      f"{need / 1e9:.2f} GB ({tokens} tokens of the tokenized data x {bytes_per_token} B) against "
                      f"{free / 1e9:.2f} GB free")
    return {"shards_missing": missing, "tokens": tokens, "needed_bytes": need, "free_bytes": free}


@config_fields({
    "compute_dtype": "capture.compute_dtype", "storage_dtype": "capture.storage_dtype",
    "tokens_per_batch": "capture.tokens_per_batch", "samples_per_shard": "capture.samples_per_shard",
    "trust_remote_code": "target.trust_remote_code", "pipeline_parallel_size": "target.pipeline_parallel_size",
    "num_train_samples": "capture.num_train_samples", "num_eval_samples": "capture.num_eval_samples",
    "max_seq_len": "data.max_seq_len",
})
class CaptureSettings:
    """What one capture job runs (``capture_shard``): samples ``[start, start+count)`` of the tokens file
    ``tokens_path`` (prepare_data's split ``split``) into the shard ``out_path``, with the target of ``target_dir``
    (None where the caller hands ``capture_shard`` a loaded model), the compat report's ``aux_layer_ids``,
    ``target_fingerprint`` and ``backend`` (``hooks``: transformers in this process, or ``vllm``: our hooks inside a
    vLLM engine in a child process; the report's choice, not ``capture.backend``'s ``auto``), on ``device``
    (``cpu`` or ``cuda``; None: ``cuda`` where ``gpus`` > 0, else ``cpu``) and the job's ``gpus`` (the vllm backend's
    tensor parallel size; None: 1 on ``cuda``, 0 on ``cpu``). ``writer_threads`` write samples' rows in parallel;
    ``fsync`` flushes the shard to disk before the rename. The config fields (below) are made from their keys'
    declarations (``config.settings``): the split's configured samples (``split_samples``: ``num_train_samples``
    or ``num_eval_samples``, runtime-only) must fit on the disk, the split's shards still missing
    (``check_disk_for_split``, shards of ``samples_per_shard``); ``max_seq_len`` (runtime-only) bounds every sample,
    so one vllm capture engine of that context serves every shard of a run (``host_spec``).
    """

    target_dir: str | os.PathLike | None = job("params.target_dir")
    tokens_path: str | os.PathLike = job("inputs.tokens")
    out_path: str | os.PathLike = job("outputs.shard")
    start: int = job("params.shard.start")
    count: int = job("params.shard.num_samples")
    aux_layer_ids: list[int] = job("decisions.capture.aux_layer_ids")
    target_fingerprint: str = job("decisions.target.fingerprint")
    split: str = job("wildcards.split")
    backend: str = job("decisions.capture.backend", default="hooks")
    # a quantized target's scheme, which its shards record (issue 74); None for a dense target
    target_quantization: str | None = job("decisions.target.quantization.scheme?", default=None)
    device: str | None = None
    gpus: int | None = job("resources.gpu?", default=None)
    writer_threads: int = 4
    fsync: bool = True

    def __post_init__(self) -> None:
        if self.device is None:
            object.__setattr__(self, "device", "cuda" if self.gpus else "cpu")

    @property
    def split_samples(self) -> int | None:
        """The configured samples of split ``split`` (``capture.num_<split>_samples``; None: no such split)."""
        return {"train": self.num_train_samples, "eval": self.num_eval_samples}.get(self.split)


def load_target(target_dir: str | os.PathLike, compute_dtype: str, device: str,
                trust_remote_code: bool = declared("target.trust_remote_code")) -> torch.nn.Module:
    """The target of ``target_dir`` for the hooks backend: in ``compute_dtype`` (``capture.compute_dtype``) on
    ``device`` (``cpu`` or ``cuda``), eval mode (``target.load_model``); logs its load seconds, and warns where a CPU
    without native bf16 emulates it."""
    from ..target import load_model, resolve_dtype

    if emulates_bf16(compute_dtype, device):
        log.warning("capture.compute_dtype %s on a CPU without native bf16 (%s absent): this capture runs about 29x slower "
                    "than in float32 (config.provenance.cpu_bf16_support); capture.compute_dtype: auto takes float32",
                    compute_dtype, " / ".join(NATIVE_BF16_FLAGS))
    t_load = time.perf_counter()
    model = load_model(target_dir, resolve_dtype(compute_dtype, device), device, trust_remote_code)
    log.info("target loaded in %.1f s (%s on %s)", time.perf_counter() - t_load, model.dtype, device)
    return model


def capture_shard(s: CaptureSettings, model: torch.nn.Module | None = None, engine=None,
                  alive: Callable[[], bool] | None = None) -> dict:
    """Capture the samples of ``s`` (``CaptureSettings``) into its shard ``s.out_path``.

    Both backends write the same shard format and metadata. ``model``: an already loaded target (hooks: a capture
    host, benchmarks and tests); else it is loaded from ``s.target_dir``. ``engine``: a started vLLM capture engine
    (vllm: a capture host's, ``vllm.capture.start_capture_engine``, its context at least the longest sample + 1);
    else one is started in a child process for this shard. ``alive``: asked between batches and before the shard is
    renamed into place; where it says False the shard is dropped (no file, its temporary removed). Returns a summary:
    samples, tokens, seconds, tokens/s.

    Raises:
        ValueError: ``s.backend`` is neither ``hooks`` nor ``vllm``.
        vllm.capture.ParallelismError: ``vllm`` with pipeline parallel (``s.pipeline_parallel_size`` > 1).
        OSError: this shard, or the split's missing shards, cannot fit on the disk.
        IndexError: the tokens file holds fewer than ``start + 1`` samples (the message
            gives both numbers; lower ``capture.num_train_samples`` or add data).
        JobGone: ``alive`` said False.
    """
    import torch

    from ..formats.shard_pipeline import WriterPipeline
    from ..formats.shards import ShardFileWriter, ShardMeta, encode_states
    from ..hooks import HookCapture, padded_batch, plan_batches, unpad
    from ..target import text_config

    tokens_path, out_path, start, count = s.tokens_path, s.out_path, s.start, s.count
    aux_layer_ids, backend, device, split = s.aux_layer_ids, s.backend, s.device, s.split
    if backend not in ("hooks", "vllm"):
        raise ValueError(f"capture backend {backend!r}: expected 'hooks' or 'vllm'")
    toks = read_tokens(tokens_path)
    if start >= len(toks) and count > 0:
        raise IndexError(f"{tokens_path}: shard wants samples from {start}, but the split has only {len(toks)}")
    idx = list(range(start, min(start + count, len(toks))))
    if len(idx) < count:
        log.warning("%s holds %d samples; shard %s gets %d instead of %d", tokens_path, len(toks), out_path, len(idx), count)
    plan = check_disk_for_shard(out_path, s.target_dir, len(aux_layer_ids), s.storage_dtype,
                                sum(len(toks.sample(i)[0]) for i in idx), s.trust_remote_code,
                                hidden_size=None if model is None else text_config(model.config).hidden_size)
    if s.split_samples is not None:
        check_disk_for_split(out_path, toks.offsets, s.split_samples, s.samples_per_shard, plan["bytes_per_token"])
    if backend == "vllm":
        return _capture_vllm(s, idx, toks, engine, alive)
    if model is None:
        model = load_target(s.target_dir, s.compute_dtype, device, s.trust_remote_code)
    hidden = text_config(model.config).hidden_size
    cap = HookCapture(model, aux_layer_ids)
    in_device = next(cap.stack.layers[0].parameters()).device if device != "cpu" else torch.device("cpu")
    log.info("decoder layers at %s; aux layers %s", cap.stack.path, aux_layer_ids)

    samples = [toks.sample(i) for i in idx]
    lengths = [len(s[0]) for s in samples]
    meta = ShardMeta(target_fingerprint=s.target_fingerprint, aux_layer_ids=list(aux_layer_ids), dtype=s.storage_dtype,
                     hidden_size=hidden, sample_ids=[toks.sample_ids[i] for i in idx], split=split,
                     target_quantization=s.target_quantization)
    writer = ShardFileWriter(out_path, meta, lengths, fsync=s.fsync)
    from tqdm import tqdm

    t0 = time.perf_counter()
    bar = tqdm(total=sum(lengths), unit="tok", unit_scale=True, file=sys.stderr, mininterval=5, desc=f"capture {split}")
    try:
        pipe = WriterPipeline(writer, samples, str(in_device), threads=s.writer_threads)
        for batch in plan_batches(lengths, s.tokens_per_batch):
            _check_alive(alive, out_path)
            ids, att = padded_batch([samples[j][0] for j in batch], in_device)
            aux, last = unpad(*cap.capture(ids, att), att)
            pipe.submit(batch, encode_states(aux, last, meta))
            bar.update(sum(lengths[j] for j in batch))
        pipe.finish()
        _check_alive(alive, out_path)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
        cap.remove()
    seconds = time.perf_counter() - t0
    ntok = sum(lengths)
    summary = {"samples": len(idx), "tokens": ntok, "seconds": round(seconds, 2),
               "tokens_per_s": round(ntok / max(seconds, 1e-9), 1)}
    log.info("captured %s", summary)
    return summary


def _check_alive(alive: Callable[[], bool] | None, out_path) -> None:
    if alive is not None and not alive():
        raise JobGone(f"{out_path}: the job that asked for this shard is gone; the shard is dropped")


def _capture_vllm(s: CaptureSettings, idx: list[int], toks, engine=None, alive=None) -> dict:
    """The ``vllm`` backend for ``capture_shard``: samples ``idx`` of ``toks`` (the tokens file ``s.tokens_path``
    read), the same metadata; the engine's worker writes the shard. ``engine``: a started capture engine (a capture
    host's), else one is started in a child process for this shard."""
    from ..formats.shards import ShardMeta
    from ..target import load_config, text_config
    from ..vllm.capture import capture_in_engine, capture_shard_vllm

    hidden = text_config(load_config(s.target_dir, s.trust_remote_code)).hidden_size
    meta = ShardMeta(target_fingerprint=s.target_fingerprint, aux_layer_ids=list(s.aux_layer_ids),
                     dtype=s.storage_dtype, hidden_size=hidden, sample_ids=[toks.sample_ids[i] for i in idx],
                     split=s.split, target_quantization=s.target_quantization)
    if engine is not None:
        Path(s.out_path).parent.mkdir(parents=True, exist_ok=True)
        res = capture_in_engine(engine, os.path.abspath(s.out_path), meta.to_strings(), [toks.sample(i) for i in idx],
                                s.writer_threads, s.fsync, alive=alive)
        if res is None:
            raise JobGone(f"{s.out_path}: the job that asked for this shard is gone; the shard is dropped")
        log.info("captured through vLLM %s", res)
        return res
    gpus = s.gpus
    if gpus is None:
        gpus = 1 if s.device.startswith("cuda") else 0
    res = capture_shard_vllm(s.target_dir, s.tokens_path, s.out_path, idx, [len(toks.sample(i)[0]) for i in idx], meta,
                             gpus=gpus, compute_dtype=s.compute_dtype, tokens_per_batch=s.tokens_per_batch,
                             pipeline_parallel_size=s.pipeline_parallel_size, trust_remote_code=s.trust_remote_code,
                             writer_threads=s.writer_threads, fsync=s.fsync)
    log.info("captured through vLLM %s", res)
    return res


def host_spec(s: CaptureSettings) -> dict:
    """What a capture host (eagle3build/workflow/host.py) for the shard ``s`` loads, for ``host_load``: a host serves
    another shard where this and the job's threads and GPUs are equal. vllm: the engine's context is the run's
    ``data.max_seq_len`` + 1 (or the shard's longest sample + 1 where longer: a tokens file made under another length),
    so one engine serves every shard of a run (vLLM-CPU wrote the same shard bytes with contexts of 261 and 1025
    tokens); ``env``, the engine child's environment (``vllm.engine_process.child_env``)."""
    spec = {"target_dir": os.path.abspath(s.target_dir), "target_fingerprint": s.target_fingerprint,
            "backend": s.backend, "compute_dtype": s.compute_dtype, "device": s.device,
            "trust_remote_code": s.trust_remote_code}
    if s.backend == "vllm":
        from ..vllm.engine_process import child_env

        toks = read_tokens(s.tokens_path)
        end = min(s.start + s.count, len(toks))
        longest = max((int(toks.offsets[i + 1] - toks.offsets[i]) for i in range(s.start, end)), default=1)
        gpus = s.gpus if s.gpus is not None else (1 if s.device.startswith("cuda") else 0)
        spec.update(gpus=gpus, aux_layer_ids=list(s.aux_layer_ids), tokens_per_batch=s.tokens_per_batch,
                    pipeline_parallel_size=s.pipeline_parallel_size, max_model_len=max(s.max_seq_len, longest) + 1)
        # the capture hooks read vLLM's V1 model runner (vllm.capture.run_capture)
        spec["env"] = {"VLLM_USE_V2_MODEL_RUNNER": "0", **child_env()}
    return spec


def host_load(spec: dict) -> dict:
    """In a capture host: the target of ``host_spec``'s ``spec``, loaded once, as ``capture_shard``'s keywords:
    ``{"model": ...}`` (hooks, ``load_target``) or ``{"engine": ...}`` (vllm, a capture engine with the hooks
    installed: ``vllm.capture.start_capture_engine``)."""
    if spec["backend"] != "vllm":
        return {"model": load_target(spec["target_dir"], spec["compute_dtype"], spec["device"],
                                     spec["trust_remote_code"])}
    from ..vllm.capture import LAYER_PARAMS, capture_engine_args, start_capture_engine

    t0 = time.perf_counter()
    engine_args = capture_engine_args(spec["target_dir"], gpus=spec["gpus"], max_model_len=spec["max_model_len"],
                                      tokens_per_step=spec["tokens_per_batch"], dtype=spec["compute_dtype"],
                                      pipeline_parallel_size=spec["pipeline_parallel_size"],
                                      trust_remote_code=spec["trust_remote_code"])
    engine, info, start_s = start_capture_engine(engine_args, spec["aux_layer_ids"], list(LAYER_PARAMS))
    log.info("target loaded in %.1f s (a vLLM capture engine, its start %.1f s; hooks at %s of %s)",
             time.perf_counter() - t0, start_s, info.get("layer_path"), info.get("layer_class"))
    return {"engine": engine}
