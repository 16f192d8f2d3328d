"""The target's hidden states computed when training asks for them: online training's target side.

``capture.mode: online`` trains the draft head without shards: each training batch's samples
are run through the target as the batch is formed, by the backend the compat report chose,
and their states are rounded to ``capture.storage_dtype`` exactly as a shard would store them
(``shard_rounding``), so an online run sees the numbers an offline run reads back from its
shards. A private module of the train subpackage (``online_data`` uses it); nothing here is written to disk.

- ``HooksStates``: the target in this process (transformers), the forward hooks of ``hooks``, batched
  as the ``hooks`` capture backend batches (``hooks.plan_batches``, ``capture.tokens_per_batch``).
- ``VllmStates``: a vLLM engine in this process with our worker extension
  (``vllm.capture.CaptureExtension``: the same hooks and row-to-sample mapping as the ``vllm``
  capture backend), whose engine core runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: a
  one-GPU worker hands its tensors over without serialisation; tensor-parallel workers copy
  theirs to the CPU and send them through vLLM's RPC). The colocated-engine pattern of vLLM's
  RLHF examples (examples/offline_inference/rlhf_colocate.py).

Both return, per sample, ``(aux [T, A*H], last [T, H])`` on the CPU in the storage dtype
(float32 after fp8 dequantisation), as ``shards.ShardReader`` returns a shard's sample.

The target's forwards run in the trainer's process, on the prefetch thread, while the trainer's thread runs
the draft, whose ``forward`` speculators compiles on CUDA (``models/utils.py``, ``conditional_torch_compile``).
Compiling traces with FX, which patches ``torch.nn.Module.__call__`` for the whole process (torch/fx/
_symbolic_trace.py, ``_Patcher``), so a target forward on the other thread runs through the tracer's wrapper:
on the H200 (vLLM 0.26, 2026-12-04) the Kimi-shaped target's MoE router, itself a ``torch.compile``d function
(vllm/model_executor/layers/fused_moe/router/grouped_topk_router.py), failed there with "Detected that you are
using FX to symbolically trace a dynamo-optimized function". Each backend's ``guard`` (a lock) keeps the two
apart: ``states`` holds it for the target's forwards and the trainer for each draft forward and backward (the
forward compiles and recompiles there; the backward is compiled lazily at its first call, torch/_functorch/
_aot_autograd/graph_compile.py, and inductor traces with FX too); the optimizer step and the GPU's queued work
still overlap the target.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

import numpy as np
import torch

from ..formats.shards import ShardMeta, dequantize_fp8, encode_states

log = logging.getLogger(__name__)


def shard_rounding(aux: torch.Tensor, last: torch.Tensor, storage_dtype: str, num_aux: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(aux [T, A*H], last [T, H])`` as a shard of ``storage_dtype`` stores them and ``ShardReader`` reads
    them back, on the CPU: cast to the storage dtype (``shards.encode_states``), fp8 quantised per token and
    layer and dequantised to float32 (``shards.dequantize_fp8``)."""
    meta = ShardMeta("", list(range(num_aux)), storage_dtype, last.shape[-1], [], "")
    h, lq, hs, ls = encode_states(aux, last, meta)
    if meta.fp8:
        return dequantize_fp8(h.cpu(), hs.cpu()), dequantize_fp8(lq.cpu(), ls.cpu())
    return h.cpu(), lq.cpu()


class HooksStates:
    """The target loaded with transformers in this process, hooked (``hooks.HookCapture``).

    ``device``: ``cpu`` or ``cuda`` (several visible GPUs: the layers spread over all of them,
    ``target.load_model``); ``compute_dtype``: ``capture.compute_dtype`` (``auto``: bf16 on CUDA, fp32 on
    CPU); ``tokens_per_batch``: padded tokens per forward (``capture.tokens_per_batch``).
    On CUDA the forwards run on a side stream, so a training step on the default stream overlaps them.
    """

    backend = "hooks"

    def __init__(self, target_dir: str, aux_layer_ids: list[int], storage_dtype: str, device: str = "cpu", *,
                 compute_dtype: str, tokens_per_batch: int, trust_remote_code: bool,
                 model: torch.nn.Module | None = None):
        from ..hooks import HookCapture
        from ..target import load_model, resolve_dtype

        t0 = time.perf_counter()
        self.model = model if model is not None else load_model(
            target_dir, resolve_dtype(compute_dtype, device), device, trust_remote_code)
        self.load_s = time.perf_counter() - t0
        self.cap = HookCapture(self.model, aux_layer_ids)
        self.num_aux = len(aux_layer_ids)
        self.storage_dtype = storage_dtype
        self.tokens_per_batch = tokens_per_batch
        self.device = next(self.cap.stack.layers[0].parameters()).device
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.guard = threading.Lock()  # held for the forwards, and by the trainer for the draft's (module doc)
        log.info("online target (hooks) loaded in %.1f s on %s, %s", self.load_s, self.device, self.model.dtype)

    def states(self, ids: list[np.ndarray]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per sample of ``ids`` (token ids, int), ``(aux [T, A*H], last [T, H])`` on the CPU, rounded as stored
        (``shard_rounding``), in the order given."""
        from ..hooks import padded_batch, plan_batches, unpad

        out: list = [None] * len(ids)
        lengths = [len(x) for x in ids]
        ctx = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        with self.guard, ctx:
            for batch in plan_batches(lengths, self.tokens_per_batch):
                x, att = padded_batch([ids[j] for j in batch], self.device)
                aux, last = unpad(*self.cap.capture(x, att), att)
                row = 0
                for j in batch:
                    sl = slice(row, row + lengths[j])
                    out[j] = shard_rounding(aux[sl], last[sl], self.storage_dtype, self.num_aux)
                    row += lengths[j]
        return out

    def close(self) -> None:
        self.cap.remove()


class VllmStates:
    """A vLLM engine on the target in this process, its workers hooked (``vllm.capture.CaptureExtension``).

    ``online``: the run's ``trainer.OnlineSettings``: ``gpus``, the engine's tensor-parallel size (0: vLLM's CPU
    backend, float32); ``storage_dtype`` and ``compute_dtype``; ``tokens_per_batch``: tokens per engine step
    (``max_num_batched_tokens``); ``target_memory_fraction``: ``gpu_memory_utilization`` of the engine
    (``capture.online.target_memory_fraction``: the trainer shares the cards). ``max_model_len``: the longest
    sample + 1.

    Raises:
        engine_process.VLLMUnavailable: vLLM is not installed.
        vllm.capture.LayoutError: the workers refused the hooks.
    """

    backend = "vllm"

    def __init__(self, target_dir: str, aux_layer_ids: list[int], online, *, max_model_len: int,
                 trust_remote_code: bool):
        from ..vllm.capture import capture_engine_args, start_capture_engine
        from ..vllm.engine_process import child_env, require_vllm

        require_vllm(target_dir)
        # The engine's environment as its own child process would get it (offline, vLLM's CPU
        # settings, IEEE float32 in Triton), its engine core in this process, and the V1 runner
        # whose step boundaries the hooks read (vllm.capture.run_capture).
        env = child_env()
        for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_NUM_OF_RESERVED_CPU", "TRITON_F32_DEFAULT", "HF_HUB_OFFLINE",
                  "TRANSFORMERS_OFFLINE"):
            os.environ.setdefault(k, env[k])
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        gpus, fraction = online.gpus, online.target_memory_fraction
        extra = {"gpu_memory_utilization": fraction} if fraction and gpus > 0 else {}
        engine = capture_engine_args(target_dir, gpus=gpus, max_model_len=max_model_len,
                                     tokens_per_step=online.tokens_per_batch, dtype=online.compute_dtype,
                                     trust_remote_code=trust_remote_code, **extra)
        self.llm, self.install, self.load_s = start_capture_engine(engine, aux_layer_ids)
        self.num_aux = len(aux_layer_ids)
        self.storage_dtype = online.storage_dtype
        self.guard = threading.Lock()  # held for the engine's forwards, and by the trainer for the draft's (module doc)
        log.info("online target (vLLM engine, tensor parallel %d) started in %.1f s: %s", max(1, gpus), self.load_s,
                 self.install)

    def states(self, ids: list[np.ndarray]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """As ``HooksStates.states``: the samples go to the engine as token prompts with ``max_tokens=1``
        (one prefill each; chunked prefill and the batch's composition as vLLM schedules it).

        Raises:
            RuntimeError: a hook failed or a sample was not fully seen (the worker's reason).
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from ..vllm.capture import SAMPLE_KEY, _rank0

        lengths = [len(x) for x in ids]
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in x]) for x in ids]
        params = [SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, extra_args={SAMPLE_KEY: j})
                  for j in range(len(ids))]
        with self.guard:
            self.llm.collective_rpc("eagle3_begin_online", args=(lengths, os.getpid()))
            self.llm.generate(prompts, params, use_tqdm=False)
            res = _rank0(self.llm.collective_rpc("eagle3_take_online"))
        return [shard_rounding(a, b, self.storage_dtype, self.num_aux) for a, b in res["states"]]

    def close(self) -> None:
        import gc

        self.llm = None
        gc.collect()


def open_states(backend: str, target_dir: str, aux_layer_ids: list[int], online, *, max_model_len: int,
                trust_remote_code: bool):
    """The online target for ``backend`` (the compat report's ``capture.backend``): ``HooksStates`` on
    ``cuda`` when the run's GPUs (``online.gpus``) are > 0 (else the CPU), or ``VllmStates`` with tensor parallel
    over them. ``online``: the run's ``trainer.OnlineSettings`` (``storage_dtype``, ``compute_dtype``,
    ``tokens_per_batch``, ``target_memory_fraction``: the engine's share of each GPU); the other arguments are the
    job's (``online_data.open_target``), passed on.

    Raises:
        ValueError: ``backend`` is neither ``hooks`` nor ``vllm``.
    """
    gpus = online.gpus
    if backend == "hooks":
        return HooksStates(target_dir, aux_layer_ids, online.storage_dtype, "cuda" if gpus > 0 else "cpu",
                           compute_dtype=online.compute_dtype, tokens_per_batch=online.tokens_per_batch,
                           trust_remote_code=trust_remote_code)
    if backend == "vllm":
        return VllmStates(target_dir, aux_layer_ids, online, max_model_len=max_model_len,
                          trust_remote_code=trust_remote_code)
    raise ValueError(f"online target backend {backend!r}: expected 'hooks' or 'vllm'")
