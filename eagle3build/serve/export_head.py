"""Stage ``export_head``: the trained checkpoint -> a head directory vLLM loads as ``speculative_config.model``.

Format (speculators' EAGLE-3 format: speculators/models/eagle3.py, read by vLLM's
vllm/transformers_utils/configs/speculators/): ``config.json``
(``speculators_model_type: eagle3``, ``transformer_layer_config``, ``draft_vocab_size``,
``eagle_aux_hidden_state_layer_ids``, head flags, ``speculators_config`` with the
verifier) and ``model.safetensors`` (``fc.weight``, ``layers.0.*``, ``norm.weight``,
``lm_head.weight``, ``d2t`` int64 [draft], ``t2d`` bool [target], the frozen
``embed_tokens.weight``; ``input_norm.weight`` when ``norm_before_fc``). An MLA head (``draft.layer: mla``) has the
same tensors with an MLA layer 0, under the config vLLM's ``Eagle3DeepseekV3ForCausalLM`` loads
(``mla_format.served_config``: vLLM's speculators parser refuses an EAGLE-3 head of that layer). A P-EAGLE head (``draft.method:
peagle``) is that plus ``mask_hidden``, a DFlash head (``dflash``) speculators' DFlash format
(``head_format.expected_shapes``); each is reloaded with its own speculators class and load-checked in vLLM
with its own ``speculative_config``. The checkpoint and the exported head are each a ``head_format.Head``, read
once.

The verifier is named by ``served_name`` (e.g. the hub id), never by a local path,
so the directory is portable. ``head_meta.json`` beside them records the target and
vocab-map fingerprints and the aux ids the head was trained with.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch

from ..atomic import atomic_path, write_json
from ..config.settings import config_fields, declared, job
from ..draft import vocab_map
from ..draft.head_format import Head, HeadError
from ..draft.head_model import TORCH_DTYPES
from ..formats.artifacts import TrainMeta
from ..vllm import engine_process
from ..vllm.engine_args import engine_args
from ..vllm.measure import RUN_ENTRY

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 2  # 2: transformer_layer_config.num_aux_hidden_states (eagle3build.draft.servable)
STAGE = {
    "inputs": ("checkpoint", "target"), "packages": ("speculators", "torch"), "entry": "export",
    "keys": {"run": "files", "target.bundled": "files", "target.path": "files", "target.served_name": "trigger",
             "target.trust_remote_code": "trigger", "target.offline": "runtime",
             "target.pipeline_parallel_size": "trigger", "draft.layer": "trigger:version",
             "export.weights_dtype": "trigger:dtype", "export.vllm_load_check": "trigger",
             "resources.gpu_model": "runtime", "resources.serve.*": "runtime"},
}


class ExportError(ValueError):
    """The checkpoint cannot become a valid head; the message says which tensor/field and why."""


def _absolute_paths(obj, where: str = "") -> list[str]:
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _absolute_paths(v, f"{where}.{k}" if where else k)]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _absolute_paths(v, f"{where}[{i}]")]
    if isinstance(obj, str) and (os.path.isabs(obj) or obj.startswith(("./", "../", "~"))):
        return [f"{where}={obj!r}"]
    return []


@config_fields({"served_name": "target.served_name", "weights_dtype": "export.weights_dtype",
                "vllm_load_check": "export.vllm_load_check", "pipeline_parallel_size": "target.pipeline_parallel_size",
                "trust_remote_code": "target.trust_remote_code"})
class ExportSettings:
    """One export (``export``): the checkpoint of ``checkpoint_dir`` (train_draft's) with the vocab map it was trained
    with (``d2t_path``, ``t2d_path``, ``vocab_json``: build_vocab_map's) into the head folder ``out_dir``, the target of
    ``target_dir`` for the load checks, on the job's ``gpus`` GPUs (the vLLM check's tensor parallel size; 0 = CPU);
    ``benchmarked_by``: the file of the same plan's benchmark (``workflow.plan.benchmark_in_plan``), None where the
    plan does not benchmark the head. The config fields (below) are made from their keys' declarations
    (``config.settings``): ``served_name`` names the verifier in the head's config; ``weights_dtype`` the head's
    tensors; ``vllm_load_check``: auto | always | never."""

    checkpoint_dir: str | os.PathLike = job("params.checkpoint_dir")
    d2t_path: str = job("inputs.d2t")
    t2d_path: str = job("inputs.t2d")
    vocab_json: str = job("inputs.vocab")
    out_dir: str | os.PathLike = job("params.out_dir")
    target_dir: str = job("params.target_dir")
    gpus: int = job("resources.gpu?", default=0)
    benchmarked_by: str | None = job("params.benchmarked_by?", default=None)


def export(s: ExportSettings) -> dict:
    """Check the checkpoint of ``s.checkpoint_dir`` against the vocab map and write the head directory ``s.out_dir``;
    then load it with speculators and, where vLLM is installed (``s.vllm_load_check``: auto | always | never), with
    vLLM, serving the target tensor-parallel over the job's ``s.gpus`` GPUs (0 = CPU, float32). Returns the head's
    meta (``head_meta.json``'s content).

    ``auto`` without an importable vLLM skips the vLLM check with a warning, recorded in
    ``head_meta.json`` (``vllm_load_check.skipped``); ``always`` then fails before any work. ``auto`` also skips it
    where the same plan benchmarks the head (``s.benchmarked_by``: that benchmark's file, ``workflow.plan
    .benchmark_in_plan``): the benchmark's engines load it minutes later, and a head that does not load fails there,
    naming vLLM's error; ``head_meta.json`` says so.

    Raises:
        artifacts.ArtifactError: the checkpoint's ``train_meta.json`` is missing or does not match its schema.
        engine_process.VLLMUnavailable: ``vllm_load_check="always"`` and vLLM cannot be imported.
        ExportError: vocab-map fingerprint differs from the one trained with (both named);
            the checkpoint's config.json is of another method or layer than its train_meta.json says
            (``Head.read``); a required tensor is missing or has the wrong shape/dtype; d2t/t2d disagree
            with each other or with the map files; an absolute path would be written.
    """
    from safetensors.torch import load_file, save_file

    checkpoint_dir, d2t_path, t2d_path, out_dir = s.checkpoint_dir, s.d2t_path, s.t2d_path, s.out_dir
    served_name, target_dir, dtype, vllm_load_check = s.served_name, s.target_dir, s.weights_dtype, s.vllm_load_check
    benchmarked_by = s.benchmarked_by
    vllm_check = vllm_load_check == "always"
    if vllm_load_check == "always":
        engine_process.require_vllm(needed_by=f"{os.fspath(out_dir)} (export.vllm_load_check: always)")
    elif vllm_load_check == "auto" and benchmarked_by:
        skipped = f"the same plan's benchmark ({benchmarked_by}) loads this head in vLLM"
        log.info("vLLM load check left out: %s", skipped)
    elif vllm_load_check == "auto":
        try:
            engine_process.require_vllm(needed_by=f"the vLLM load check of {os.fspath(out_dir)}")
            vllm_check = True
        except engine_process.VLLMUnavailable as e:
            log.warning("vLLM load check skipped: %s", e)
            skipped = str(e)
    ck = Path(checkpoint_dir)
    try:  # its train_meta.json checked against eagle3build/schemas/train_meta.schema.json
        trained = Head.read(ck, meta=TrainMeta)
    except HeadError as e:
        raise ExportError(str(e)) from None
    cfg, meta = trained.config, trained.meta
    d2t, t2d, vinfo = vocab_map.load(d2t_path, t2d_path, s.vocab_json)
    if vinfo["fingerprint"] != meta["vocab_fingerprint"]:
        raise ExportError(
            f"vocab map {s.vocab_json} has fingerprint {vinfo['fingerprint']}, but the checkpoint "
            f"{ck} was trained with {meta['vocab_fingerprint']}; retrain or use the matching map"
        )
    state = load_file(str(ck / "model.safetensors"))
    shapes = trained.expected_shapes()
    for name, shape in shapes.items():
        if name not in state:
            raise ExportError(f"{ck}/model.safetensors: required tensor {name} is missing")
        if tuple(state[name].shape) != shape:
            raise ExportError(f"{ck}/model.safetensors: {name} has shape {tuple(state[name].shape)}, expected {shape}")
    if state["d2t"].dtype != torch.int64 or state["t2d"].dtype != torch.bool:
        raise ExportError(f"{ck}: d2t must be int64 and t2d bool, got {state['d2t'].dtype} / {state['t2d'].dtype}")
    vocab_map.check_consistent(state["d2t"], state["t2d"])
    if not torch.equal(state["d2t"], d2t) or not torch.equal(state["t2d"], t2d):
        raise ExportError(f"{ck}: d2t/t2d inside the checkpoint differ from {d2t_path}/{t2d_path}")
    flags = {k: cfg.get(k) for k in meta["head_flags"]}
    if flags != meta["head_flags"]:
        raise ExportError(f"{ck}: config head flags {flags} differ from those trained with {meta['head_flags']}")
    aux = list(trained.aux_layer_ids or [])
    if aux != list(meta["aux_layer_ids"]):
        raise ExportError(f"{ck}: config aux ids {aux} != trained {meta['aux_layer_ids']}")
    problem = trained.export_problem()
    if problem:
        raise ExportError(f"{ck}/config.json: {problem}")

    tdt = TORCH_DTYPES[dtype]
    out_state = {k: (v.to(tdt) if v.is_floating_point() else v).contiguous() for k, v in state.items() if k in shapes}
    cfg = trained.served_config(served_name, dtype)
    bad = _absolute_paths(cfg)
    if bad:
        raise ExportError(f"head config would contain local paths: {bad}")
    head_meta = {**meta, "served_name": served_name, "dtype": dtype, "tensors": {k: list(v.shape) for k, v in out_state.items()}}
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        save_file(out_state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "head_meta.json").write_text(json.dumps(head_meta, indent=2) + "\n")
    try:
        head = Head.of(out_dir, cfg)  # the exported head, of the config just written
        check_loads_with_speculators(head, target_dir, out_state, trained)
        if vllm_check:
            head_meta["vllm_load_check"] = check_loads_with_vllm(head, target_dir, served_name, gpus=s.gpus,
                                                                 pipeline_parallel_size=s.pipeline_parallel_size,
                                                                 trust_remote_code=s.trust_remote_code)
        elif vllm_load_check == "auto":
            head_meta["vllm_load_check"] = {"skipped": skipped}
        write_json(Path(out_dir) / "head_meta.json", head_meta)
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)  # a head that does not load is no artifact
        raise
    log.info("exported head to %s (%d tensors, %s)", out_dir, len(out_state), dtype)
    return head_meta


LOAD_CHECK_MAX_MODEL_LEN = 256  # tokens: the check's one prompt and its 8 answer tokens


def check_loads_with_vllm(head: Head, target_dir: str, served_name: str, max_tokens: int = 8,
                          gpus: int = 0, pipeline_parallel_size: int = declared("target.pipeline_parallel_size"),
                          trust_remote_code: bool = declared("target.trust_remote_code")) -> dict:
    """Serve the target with the exported ``head`` (a ``Head``) as its drafter (EAGLE-3, P-EAGLE or DFlash:
    ``Head.speculative_config``; its KV-cached layers sized in) in vLLM (a child process started by
    ``engine_process.run_child``: tensor-parallel over ``gpus`` GPUs in bf16, or float32 on CPU) and decode one prompt
    greedily with k=1.

    Returns vLLM's counters for that request (drafts, accepted tokens, seconds).

    Raises:
        ExportError: vLLM fails to load the head (with ``Head.load_hint``: a P-EAGLE head of an older build gets
            the cause and the retrain command) or drafts nothing with it.
    """
    import tempfile

    # Sized to one short request: eager (no torch.compile, CUDA graphs or autotuning) and a KV cache of
    # one sequence, not 92 % of the card (on an H200 that check took 199 s, 138 s of it engine start).
    # Seed 0: the check decodes greedily, and export has no seed key.
    eng = engine_args(target_dir, gpus=gpus, served_name=served_name, max_model_len=LOAD_CHECK_MAX_MODEL_LEN,
                      seed=0, pipeline_parallel_size=pipeline_parallel_size,
                      trust_remote_code=trust_remote_code, max_num_seqs=1,
                      kv_cache_tokens=LOAD_CHECK_MAX_MODEL_LEN + 1, draft_layers=head.kv_layers,
                      eager=True)
    spec = {"engine": eng, "max_tokens": max_tokens, "concurrency": 1,
            "prompts": [{"id": "load-check", "messages": [{"role": "user", "content": "What is the capital of France?"}]}],
            "speculative_config": head.speculative_config(1)}
    with tempfile.TemporaryDirectory(prefix="eagle3-load-") as tmp:
        try:
            r = engine_process.run_child(RUN_ENTRY, spec, tmp, "vllm_load_check")
        except RuntimeError as e:
            raise ExportError(f"vLLM cannot serve {head.path} as a draft head: {e}{head.load_hint()}") from e
    if not r.get("drafts"):
        raise ExportError(f"vLLM loaded {head.path} but proposed no draft tokens with it")
    log.info("vLLM served the head: %d drafts, %d accepted, in %.1f s", r["drafts"], r["accepted_tokens"], r["process_s"])
    return {"drafts": r["drafts"], "accepted_tokens": r["accepted_tokens"], "seconds": r["process_s"]}


def check_loads_with_speculators(head: Head, target_dir: str, state: dict[str, torch.Tensor],
                                 checkpoint: Head | None = None) -> None:
    """Load the exported ``head`` (a ``Head``) with its speculators class's ``from_pretrained`` (``Eagle3DraftModel``,
    ``PEagleDraftModel`` or ``DFlashDraftModel``: ``Head.speculators_class``) and compare every tensor.

    The config names the verifier by its served name, which need not exist on this
    machine; for the check the verifier is pointed at the local target directory. ``checkpoint``: the trained
    head it was exported from, whose speculators config is read where the exported one is not speculators' (an MLA
    head's is vLLM's own: ``DraftLayer.speculators_config_dir``); None: ``head`` itself.

    Raises:
        ExportError: loading fails or a loaded tensor differs from the one written.
    """
    head_dir = head.path
    try:
        spec_dir = os.fspath(head.layer.speculators_config_dir(head_dir, (checkpoint or head).path))
        cls = head.speculators_class()
        cfg = cls.config_class.from_pretrained(spec_dir)
        cfg.speculators_config.verifier.name_or_path = os.fspath(target_dir)
        cfg.transformer_layer_config._attn_implementation = "sdpa"
        model = cls.from_pretrained(os.fspath(head_dir), config=cfg)
    except Exception as e:  # noqa: BLE001 - any failure to load is the finding
        raise ExportError(f"speculators cannot load {head_dir}: {type(e).__name__}: {e}") from e
    loaded = model.state_dict()
    for k, v in state.items():
        if k not in loaded:
            raise ExportError(f"speculators dropped tensor {k} when loading {head_dir}")
        if not torch.equal(loaded[k].to(v.dtype), v):
            raise ExportError(f"tensor {k} differs after loading {head_dir} with speculators")
