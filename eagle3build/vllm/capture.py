"""Capture backend ``vllm``: our own forward hooks inside vLLM's workers.

vLLM's own hidden-state extraction (``speculative_config.method = "extract_hidden_states"``)
needs CUDA. This backend does not use it: the engine is started with
``worker_extension_cls=CaptureExtension`` (vLLM's hook for adding methods to its workers,
called through ``LLM.collective_rpc``), and the extension registers PyTorch forward hooks
on the decoder layers of the model the worker serves, the same layers the ``hooks``
backend hooks in transformers (``target.find_decoder_layers``: plain, ``language_model``
wrapper, MoE). The samples are then submitted as token ids with ``max_tokens=1``: one
prefill each, nothing re-tokenized, and the one generated token is never stored.

What the hooks see (vLLM's decoder layers, e.g. ``vllm/model_executor/models/llama.py``
``LlamaDecoderLayer.forward(positions, hidden_states, residual)``): the residual stream is
passed split in two, so the stream *entering* layer ``k`` is ``hidden_states + residual``
(layer 0: ``residual`` is None), and the stream *leaving* the last layer, before the final
norm, is the sum of that layer's two outputs (``LlamaModel.forward`` fuses the add into
``norm(hidden_states, residual)``; vLLM's own EAGLE-3 aux states are the same sum). A
layer whose signature or output differs is refused with the evidence (``LayoutError``).

Rows to samples: vLLM flattens the scheduled tokens of one engine step request after
request, in its input batch's order (``GPUModelRunner._prepare_inputs``: request ``r``'s
rows are ``query_start_loc[r]:query_start_loc[r+1]`` of the step, in ``input_batch.req_ids``
order; the CPU runner subclasses it). Each request carries its sample index in
``SamplingParams.extra_args`` (which vLLM hands to the worker untouched), and each row's
sequence position comes with the layer call, so rows land at ``(sample, position)``: a
prompt split over several steps by chunked prefill, or recomputed after a preemption,
comes out whole, and positions at or past the prompt's length (generated tokens) are
dropped. A sample is written into the shard (``ShardFileWriter``, the same format,
metadata and temp-file-and-rename as ``hooks``) as soon as its last position is seen.

Parallelism: tensor parallel is supported (the residual stream is whole on every rank
after each layer's all-reduce; only TP rank 0 hooks and writes), and so is expert
parallel inside that group (experts sharded over the TP ranks, data_parallel_size 1).
Pipeline parallel (each rank holds only some layers) and data parallel (each DP rank
serves other requests) are refused with ``ParallelismError``.

The engine runs in eager mode: CUDA graphs replay kernels without calling Python hooks,
and torch.compile would trace them.

Why one module over 400 lines: it is one mechanism, the worker extension (loaded inside
vLLM's workers by its name, ``EXTENSION``), its per-shard state, and the engine-side driver
that calls it through ``LLM.collective_rpc``; splitting it would put the two ends of one RPC
protocol in separate files.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from pathlib import Path

import numpy as np
import torch

from ..config.settings import declared
from ..formats.shards import ShardFileWriter, ShardMeta, encode_states
from ..target import find_decoder_layers

log = logging.getLogger(__name__)

# The decoder-layer call this backend understands (vLLM 0.32 Llama/Qwen/Mixtral/DeepSeek layers).
LAYER_PARAMS = ("positions", "hidden_states", "residual")
SAMPLE_KEY = "eagle3build_sample"  # SamplingParams.extra_args key carrying the shard-local sample index
EXTENSION = "eagle3build.vllm.capture.CaptureExtension"
CAPTURE_SEED = 0  # a capture engine's seed: it samples nothing (one greedy token per prompt); no config key's


class LayoutError(RuntimeError):
    """The served model's decoder layers are not where or what this backend expects."""


class ParallelismError(ValueError):
    """A parallel layout this backend cannot capture from (pipeline or data parallel)."""


def check_parallelism(tensor_parallel_size: int, pipeline_parallel_size: int, data_parallel_size: int = 1,
                      enable_expert_parallel: bool = False) -> None:
    """Refuse the parallel layouts this backend cannot capture from.

    Supported: tensor parallel of any size, with or without expert parallel (experts
    sharded over the TP ranks). Refused: ``pipeline_parallel_size > 1`` (a rank holds only
    some layers, so no rank sees the aux and last layers together) and
    ``data_parallel_size > 1`` (each DP rank serves other requests; rank 0 would miss them).

    Raises:
        ParallelismError: naming the setting and what to do instead.
    """
    if pipeline_parallel_size > 1:
        raise ParallelismError(
            f"capture.backend vllm: pipeline_parallel_size {pipeline_parallel_size} is not supported (each stage "
            "holds only some decoder layers); capture with tensor parallel over one node's GPUs (resources.capture.gpu) "
            "or with capture.backend hooks")
    if data_parallel_size > 1:
        raise ParallelismError(
            f"capture.backend vllm: data_parallel_size {data_parallel_size} is not supported (each DP rank serves "
            "other requests); run more shard jobs in parallel instead")
    if tensor_parallel_size < 1:
        raise ParallelismError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")


def layer_signature(layer: torch.nn.Module) -> list[str]:
    """Parameter names of ``layer.forward`` (the evidence recorded when a layout is refused)."""
    return list(inspect.signature(layer.forward).parameters)


def check_layer_signature(layer: torch.nn.Module, model_type: str, expected=LAYER_PARAMS) -> list[str]:
    """The layer's forward must take ``expected`` as its first parameters; returns its parameter names.

    Raises:
        LayoutError: naming the model type, the layer class, its parameters and ``expected``.
    """
    params = layer_signature(layer)
    if tuple(params[:len(expected)]) != tuple(expected):
        raise LayoutError(
            f"model type {model_type!r}: decoder layer {type(layer).__name__}.forward{tuple(params)} does not start "
            f"with {tuple(expected)}; this vLLM passes the residual stream differently, so capture.backend vllm cannot "
            "read it (use hooks)")
    return params


def _stream(hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    return hidden if residual is None else hidden + residual


class _Collector:
    """Per-worker capture state: buffers of the samples in flight, rows mapped to ``(sample, position)``
    step by step; a sample whose every position was seen goes to ``_complete``."""

    def __init__(self, runner, aux_layer_ids: list[int], hidden: int, lengths: list[int], device: torch.device):
        self.runner = runner
        self.A, self.H = len(aux_layer_ids), hidden
        self.slot = {layer: k for k, layer in enumerate(aux_layer_ids)}
        self.lengths = list(lengths)
        self.device = device
        self.bufs: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # j -> aux, last, filled
        self.done = [False] * len(self.lengths)
        self.step: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.steps = 0
        self.max_requests_per_step = 0
        self.steps_per_sample = [0] * len(self.lengths)
        self.error: BaseException | None = None

    def begin_step(self, positions: torch.Tensor, num_rows: int) -> None:
        """Map this step's rows to ``(sample, position)`` from the runner's per-request boundaries."""
        runner = self.runner
        n = runner.input_batch.num_reqs
        req_ids = runner.input_batch.req_ids[:n]
        qsl = runner.query_start_loc.np[: n + 1]
        if n and int(qsl[n]) > num_rows:
            raise RuntimeError(f"engine step has {num_rows} rows but its requests span {int(qsl[n])} "
                               "(micro-batched forward?); capture.backend vllm needs whole steps")
        pos = positions.reshape(-1)[:num_rows]
        pos_cpu = pos.cpu()
        self.step = []
        for r, rid in enumerate(req_ids):
            state = runner.requests.get(rid)
            extra = (state.sampling_params.extra_args or {}) if state is not None and state.sampling_params else {}
            j = extra.get(SAMPLE_KEY)
            if j is None or self.done[j]:
                continue
            a, b = int(qsl[r]), int(qsl[r + 1])
            keep = pos_cpu[a:b] < self.lengths[j]  # positions past the prompt are generated tokens
            if not bool(keep.any()):
                continue
            rows = torch.arange(a, b)[keep]
            tgt = pos_cpu[a:b][keep]
            self.step.append((j, rows.to(self.device), tgt.to(self.device), tgt))
            self.steps_per_sample[j] += 1
        self.steps += 1
        self.max_requests_per_step = max(self.max_requests_per_step, len(self.step))

    def _buf(self, j: int, dtype: torch.dtype):
        if j not in self.bufs:
            L = self.lengths[j]
            self.bufs[j] = (torch.empty(L, self.A * self.H, dtype=dtype, device=self.device),
                            torch.empty(L, self.H, dtype=dtype, device=self.device), torch.zeros(L, dtype=torch.bool))
        return self.bufs[j]

    def aux(self, layer: int, state: torch.Tensor) -> None:
        k = self.slot[layer]
        for j, rows, tgt, _ in self.step:
            aux, _, _ = self._buf(j, state.dtype)
            aux[:, k * self.H:(k + 1) * self.H].index_copy_(0, tgt, state.index_select(0, rows))

    def last(self, state: torch.Tensor) -> None:
        for j, rows, tgt, tgt_cpu in self.step:
            aux, last, filled = self._buf(j, state.dtype)
            last.index_copy_(0, tgt, state.index_select(0, rows))
            filled[tgt_cpu] = True
            if bool(filled.all()):
                del self.bufs[j]
                self.done[j] = True
                self._complete(j, aux, last)
        self.step = []

    def _complete(self, j: int, aux: torch.Tensor, last: torch.Tensor) -> None:
        raise NotImplementedError

    def missing(self) -> list[int]:
        """Samples not fully seen (prefix caching on, or the engine dropped a request)."""
        return [j for j, d in enumerate(self.done) if not d]

    def stats(self) -> dict:
        return {"samples": len(self.lengths), "tokens": sum(self.lengths), "engine_steps": self.steps,
                "max_requests_per_step": self.max_requests_per_step,
                "max_steps_per_sample": max(self.steps_per_sample, default=0),
                "samples_over_several_steps": sum(s > 1 for s in self.steps_per_sample),
                "steps_per_sample": list(self.steps_per_sample)}


class _ShardCapture(_Collector):
    """Samples to one shard file: each completed sample is encoded and written (``WriterPipeline``)."""

    def __init__(self, runner, aux_layer_ids: list[int], hidden: int, out_path: str, meta: dict, ids: list[list[int]],
                 masks: list[list[int]], writer_threads: int, fsync: bool, device: torch.device):
        from ..formats.shard_pipeline import WriterPipeline

        self.meta = ShardMeta.from_strings(out_path, meta)
        self.tokens = [(np.asarray(i, np.int32), np.asarray(m, np.uint8)) for i, m in zip(ids, masks, strict=True)]
        super().__init__(runner, aux_layer_ids, hidden, [len(t[0]) for t in self.tokens], device)
        self.writer = ShardFileWriter(out_path, self.meta, self.lengths, fsync=fsync)
        self.pipe = WriterPipeline(self.writer, self.tokens, str(device), threads=writer_threads)

    def _complete(self, j: int, aux: torch.Tensor, last: torch.Tensor) -> None:
        self.pipe.submit([j], encode_states(aux, last, self.meta))

    def finish(self) -> dict:
        missing = [self.meta.sample_ids[j] for j in self.missing()]
        if self.error is None and missing:
            self.error = RuntimeError(f"{self.writer.path}: the engine finished but samples {missing[:5]} were never "
                                      "fully seen by the hooks (prefix caching on?)")
        if self.error is not None:
            self.abort()
            raise self.error
        self.pipe.finish()
        self.writer.close()
        return self.stats()

    def abort(self) -> None:
        try:
            self.pipe.finish()
        except BaseException:  # noqa: BLE001 - the first error is the one reported
            pass
        self.writer.abort()


class _OnlineCapture(_Collector):
    """Samples kept in memory for online training (``online_states.VllmStates``): each completed
    sample's ``(aux [T, A*H], last [T, H])`` in the engine's dtype, on the worker's device where the
    caller shares the worker's process, else on the CPU (they then travel through vLLM's RPC)."""

    def __init__(self, runner, aux_layer_ids: list[int], hidden: int, lengths: list[int], device: torch.device,
                 to_cpu: bool):
        super().__init__(runner, aux_layer_ids, hidden, lengths, device)
        self.to_cpu = to_cpu
        self.states: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _complete(self, j: int, aux: torch.Tensor, last: torch.Tensor) -> None:
        self.states[j] = (aux.cpu(), last.cpu()) if self.to_cpu else (aux, last)

    def finish(self) -> dict:
        if self.error is None and self.missing():
            self.error = RuntimeError(f"the engine finished but samples {self.missing()[:5]} of the batch were never "
                                      "fully seen by the hooks (prefix caching on?)")
        if self.error is not None:
            raise self.error
        return {"states": [self.states[j] for j in range(len(self.lengths))], **self.stats()}


class CaptureExtension:
    """Methods added to vLLM's worker (``worker_extension_cls``); called via ``LLM.collective_rpc``.

    ``self`` is the worker: ``self.model_runner.model`` is the served model and
    ``self.vllm_config`` its configuration.
    """

    def eagle3_install(self, aux_layer_ids: list[int], expected_params: list[str] | None = None) -> dict:
        """Find the decoder layers, check their call, register the hooks (TP rank 0 only).

        Returns the evidence: rank, model type, layer path and class, the layer's parameters;
        or ``{"error": "LayoutError: ..."}`` where the layout or parallelism is refused (returned,
        not raised: an exception in a worker brings the engine down before the reason reaches
        the caller; ``start_capture_engine`` raises it).
        """
        try:
            return self._eagle3_install(aux_layer_ids, expected_params)
        except (LayoutError, ParallelismError, ValueError) as e:
            return {"error": f"{type(e).__name__}: {e}", "writes": True}

    def _eagle3_install(self, aux_layer_ids: list[int], expected_params: list[str] | None) -> dict:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        pc = self.vllm_config.parallel_config
        check_parallelism(pc.tensor_parallel_size, pc.pipeline_parallel_size, pc.data_parallel_size,
                          bool(getattr(pc, "enable_expert_parallel", False)))
        mc = self.vllm_config.model_config
        model_type = getattr(mc.hf_config, "model_type", type(mc.hf_config).__name__)
        n = mc.hf_text_config.num_hidden_layers
        model = self.model_runner.model
        try:
            stack = find_decoder_layers(model, n)
        except LookupError as e:
            raise LayoutError(f"model type {model_type!r} ({type(model).__name__}): no stack of {n} decoder layers in "
                              f"vLLM's module tree ({e}); capture.backend vllm cannot hook it (use hooks)") from e
        params = check_layer_signature(stack.layers[0], model_type, tuple(expected_params or LAYER_PARAMS))
        for i in aux_layer_ids:
            if not 0 <= i < n:
                raise ValueError(f"aux layer id {i} out of range for {n} decoder layers")
        runner = self.model_runner
        if not all(hasattr(runner, a) for a in ("input_batch", "query_start_loc", "requests")):
            raise LayoutError(f"vLLM model runner {type(runner).__name__} has no input_batch/query_start_loc/requests "
                              "(the V1 runner's per-request step boundaries); start the engine with "
                              "VLLM_USE_V2_MODEL_RUNNER=0")
        rank = get_tensor_model_parallel_rank()
        self._e3 = {"stack": stack, "aux": list(aux_layer_ids), "hidden": mc.hf_text_config.hidden_size,
                    "capture": None, "handles": [], "bind": inspect.signature(stack.layers[0].forward).bind}
        if rank == 0:
            first = min(aux_layer_ids)
            for i in aux_layer_ids:
                self._e3["handles"].append(stack.layers[i].register_forward_pre_hook(
                    self._e3_pre_hook(i, first), with_kwargs=True))
            self._e3["handles"].append(stack.layers[n - 1].register_forward_hook(self._e3_last_hook))
        return {"rank": rank, "writes": rank == 0, "model_type": model_type, "layer_path": stack.path,
                "layer_class": type(stack.layers[0]).__name__, "layer_params": params, "num_layers": n,
                "model_class": type(model).__name__}

    def _e3_pre_hook(self, i: int, first: int):
        def hook(module, args, kwargs):
            cap = self._e3["capture"]
            if cap is None or cap.error is not None:
                return
            try:
                a = self._e3["bind"](*args, **kwargs).arguments
                state = _stream(a["hidden_states"], a.get("residual"))
                if i == first:
                    cap.begin_step(a["positions"] if a["positions"].dim() == 1 else self.model_runner.positions,
                                   state.shape[0])
                cap.aux(i, state)
            except BaseException as e:  # noqa: BLE001 - reported by eagle3_finish_shard, the engine keeps running
                cap.error = e
        return hook

    def _e3_last_hook(self, module, args, output):
        cap = self._e3["capture"]
        if cap is None or cap.error is not None:
            return
        try:
            if not (isinstance(output, tuple) and len(output) == 2):
                raise LayoutError(f"decoder layer {type(module).__name__} returned {type(output).__name__}, expected "
                                  "(hidden_states, residual)")
            cap.last(_stream(*output))
        except BaseException as e:  # noqa: BLE001
            cap.error = e

    def eagle3_begin_shard(self, out_path: str, meta: dict, ids: list[list[int]], masks: list[list[int]],
                           writer_threads: int = 4, fsync: bool = False) -> bool:
        """Open the shard ``out_path`` (temporary name until ``eagle3_finish_shard``) for these samples."""
        if not self._e3["handles"]:
            return False
        self._e3["capture"] = _ShardCapture(self.model_runner, self._e3["aux"], self._e3["hidden"], out_path, meta, ids,
                                            masks, writer_threads, fsync, self.model_runner.device)
        return True

    def eagle3_finish_shard(self) -> dict | None:
        """Write the last samples and rename the shard into place; returns its statistics.

        Raises:
            the first error a hook met, or RuntimeError when a sample was never fully seen.
        """
        cap, self._e3["capture"] = self._e3["capture"], None
        return cap.finish() if cap is not None else None

    def eagle3_abort_shard(self) -> None:
        """Drop the shard's temporary file."""
        cap, self._e3["capture"] = self._e3["capture"], None
        if cap is not None:
            cap.abort()

    def eagle3_begin_online(self, lengths: list[int], caller_pid: int) -> bool:
        """Collect the next requests' states in memory (online training: ``online_states.VllmStates``);
        ``lengths``: their prompt lengths in tokens, by the index each request carries."""
        if not self._e3["handles"]:
            return False
        self._e3["capture"] = _OnlineCapture(self.model_runner, self._e3["aux"], self._e3["hidden"], lengths,
                                             self.model_runner.device, to_cpu=os.getpid() != caller_pid)
        return True

    # The end of an online batch is the end of a shard's capture: the open collector's finish() (its
    # states, with the step statistics), or the first error a hook met.
    eagle3_take_online = eagle3_finish_shard


def _rank0(results: list):
    return next((r for r in results if r is not None), None)


def capture_in_engine(llm, out_path: str, meta: dict, samples: list[tuple], writer_threads: int = 4,
                      fsync: bool = False, alive=None) -> dict | None:
    """Capture ``samples`` (``(input_ids, loss_mask)`` int sequences) through a started engine into ``out_path``.

    The engine must have been started with ``worker_extension_cls=EXTENSION`` and the hooks
    installed (``eagle3_install``). Returns the shard statistics and wall seconds; None where ``alive`` (asked once
    the engine has run every sample, before the shard is renamed into place) says False: the shard is then dropped.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    ids = [list(map(int, s[0])) for s in samples]
    masks = [list(map(int, s[1])) for s in samples]
    llm.collective_rpc("eagle3_begin_shard", args=(str(out_path), meta, ids, masks, writer_threads, fsync))
    t0 = time.perf_counter()
    try:
        prompts = [TokensPrompt(prompt_token_ids=x) for x in ids]
        params = [SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, extra_args={SAMPLE_KEY: j})
                  for j in range(len(ids))]
        llm.generate(prompts, params, use_tqdm=False)
        if alive is not None and not alive():
            llm.collective_rpc("eagle3_abort_shard")
            return None
        stats = _rank0(llm.collective_rpc("eagle3_finish_shard"))
    except BaseException:
        llm.collective_rpc("eagle3_abort_shard")
        raise
    stats["seconds"] = round(time.perf_counter() - t0, 3)
    stats["tokens_per_s"] = round(stats["tokens"] / max(stats["seconds"], 1e-9), 1)
    return stats


def start_capture_engine(engine: dict, aux_layer_ids: list[int], expected_params=None):
    """Start an engine with the capture extension and install the hooks; ``(llm, install evidence, start seconds)``.

    Raises:
        LayoutError: a worker refused the hooks (its reason: layout, layer call or parallelism).
    """
    from .measure import start_engine

    llm, start_s = start_engine(engine)
    results = llm.collective_rpc("eagle3_install", args=(list(aux_layer_ids), expected_params))
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise LayoutError(f"vLLM worker refused the capture hooks: {errors[0]}")
    info = _rank0([r for r in results if r.get("writes")])
    return llm, info, start_s


def run_capture(spec: dict) -> dict:
    """Child-process entry (``engine_process.run_child``): one engine, one or more shards.

    ``spec``: ``engine`` (``capture_engine_args``), ``aux_layer_ids``, optional ``expected_params``,
    ``writer_threads``, ``fsync`` and ``shards``: ``[{"out_path", "meta" (ShardMeta strings),
    "tokens_path", "indices"}]``. Returns the install evidence, the engine start seconds and
    each shard's statistics.
    """
    from ..formats.tokens import read_tokens

    # The hooks read the step's request boundaries from vLLM's V1 model runner (``input_batch``,
    # ``query_start_loc``); on CUDA with Triton vLLM 0.32 defaults to its V2 runner, which keeps them elsewhere.
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    llm, info, start_s = start_capture_engine(spec["engine"], spec["aux_layer_ids"], spec.get("expected_params"))
    shards = []
    for sh in spec["shards"]:
        toks = read_tokens(sh["tokens_path"])
        samples = [toks.sample(i) for i in sh["indices"]]
        shards.append(capture_in_engine(llm, sh["out_path"], sh["meta"], samples, spec.get("writer_threads", 4),
                                        spec.get("fsync", False)))
        log.info("captured %s: %s", sh["out_path"], shards[-1])
    return {"install": info, "engine_start_s": round(start_s, 2), "shards": shards}


def capture_engine_args(target_dir: str, *, gpus: int, max_model_len: int, tokens_per_step: int, dtype: str,
                        pipeline_parallel_size: int = declared("target.pipeline_parallel_size"),
                        trust_remote_code: bool = declared("target.trust_remote_code"), **extra) -> dict:
    """``engine_args`` for capture: the extension, prefix caching off, eager, no tokenizer;
    for a multimodal wrapper, its language model only.

    ``tokens_per_step``: vLLM's ``max_num_batched_tokens`` (tokens of one engine step;
    longer prompts are split by chunked prefill). ``max_model_len`` in tokens (the longest
    sample + 1 for the generated token). ``dtype``: the capture's compute dtype (``capture.compute_dtype``,
    or ``auto``: ``engine_args.resolve_dtype``). The engine's seed is ``CAPTURE_SEED``: a capture samples nothing
    (one greedy token per prompt), so no config seed reaches it.

    Raises:
        ParallelismError: ``pipeline_parallel_size > 1``.
    """
    from ..target import capture_kv_cache_tokens
    from .engine_args import engine_args, engine_layout

    check_parallelism(**engine_layout(gpus, pipeline_parallel_size))
    step = max(tokens_per_step, 16)
    # Eager (hooks need Python calls; no compile, graphs or autotuning to pay for) and a KV cache
    # for one step's prompts plus a prompt split over steps, twice over for the scheduler's
    # look-ahead: requests finish after their prefill, so more cache would sit idle (vLLM's
    # default of 92 % of an H200, 127 GiB, took most of a 132 s start for a 135M target).
    kw = dict(worker_extension_cls=EXTENSION, enable_prefix_caching=False, eager=True,
              kv_cache_tokens=capture_kv_cache_tokens(step, max_model_len), skip_tokenizer_init=True, max_num_batched_tokens=step,
              trust_remote_code=trust_remote_code)
    kw.update(extra)  # a multimodal wrapper gets language_model_only from engine_args, as every engine does
    return engine_args(target_dir, gpus=gpus, served_name=Path(target_dir).name, max_model_len=max_model_len,
                       seed=CAPTURE_SEED, dtype=dtype, pipeline_parallel_size=pipeline_parallel_size, **kw)


def capture_shard_vllm(target_dir: str, tokens_path: str, out_path: str, indices: list[int], lengths: list[int],
                       meta: ShardMeta, *, gpus: int, compute_dtype: str = "auto", tokens_per_batch: int,
                       pipeline_parallel_size: int = declared("target.pipeline_parallel_size"),
                       trust_remote_code: bool = declared("target.trust_remote_code"), writer_threads: int = 4,
                       fsync: bool = False, expected_params: list[str] | None = None, **engine_extra) -> dict:
    """Capture one shard through a vLLM engine started in a child process; returns its statistics.

    ``gpus``: the job's GPUs (tensor parallel size; its cards are the job's
    ``CUDA_VISIBLE_DEVICES``); 0 = vLLM's CPU backend (float32). ``compute_dtype``: the capture job passes
    ``capture.compute_dtype``; the default ``auto`` (bf16 on CUDA, float32 on CPU: the compat report's smoke
    capture) deliberately differs from the key's. ``tokens_per_batch``: tokens per engine step
    (``capture.tokens_per_batch``). ``expected_params``: the decoder-layer call to require (default
    ``LAYER_PARAMS``). ``engine_extra``: more ``vllm.LLM`` arguments.

    Raises:
        ParallelismError: pipeline parallel asked for.
        RuntimeError: the engine child failed (its output is in the job's log).
    """
    import tempfile

    from .engine_process import require_vllm, run_child

    require_vllm(str(out_path))
    engine = capture_engine_args(str(target_dir), gpus=gpus, max_model_len=max(lengths, default=1) + 1,
                                 tokens_per_step=tokens_per_batch, dtype=compute_dtype,
                                 pipeline_parallel_size=pipeline_parallel_size, trust_remote_code=trust_remote_code,
                                 **engine_extra)
    spec = {"engine": engine, "aux_layer_ids": list(meta.aux_layer_ids), "writer_threads": writer_threads, "fsync": fsync,
            "expected_params": list(expected_params or LAYER_PARAMS),
            "shards": [{"out_path": os.path.abspath(out_path), "meta": meta.to_strings(),
                        "tokens_path": os.path.abspath(tokens_path), "indices": list(indices)}]}
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    # spec and result JSON of the engine child: not next to the shard, where the worker's writer clears
    # stale temporaries and Snakemake watches the outputs
    with tempfile.TemporaryDirectory(prefix="eagle3build-vllm-capture-") as work:
        res = run_child("eagle3build.vllm.capture:run_capture", spec, work, "capture")
    out = dict(res["shards"][0])
    out.update(engine_start_s=res["engine_start_s"], process_s=res["process_s"], install=res["install"])
    return out
