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

A given head (config ``draft.head``, ``export_given``) is the run's head in place of a trained one: in speculators'
format it is taken as it is (its config.json and model.safetensors copied byte for byte); in the EAGLE repo's EAGLE-3
format it is converted by speculators' converter (``given_head.as_speculators``) and written as a trained head is
(served config, ``export.weights_dtype``). Either is checked against the target (vocabulary, d2t/t2d, the ``fc``
width of its aux layers) and loaded as a trained head is; ``head_meta.json`` names its source and format.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch

from ..atomic import atomic_path, write_json
from ..config.settings import config_fields, declared
from ..draft import given_head, vocab_map
from ..draft.head_format import HEAD_FLAGS, HEAD_VARIANTS, Head, HeadError
from ..draft.head_model import TORCH_DTYPES
from ..formats.artifacts import TrainMeta
from ..vllm import engine_process
from ..vllm.engine_args import engine_args
from ..vllm.measure import RUN_ENTRY

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 2  # 2: transformer_layer_config.num_aux_hidden_states (eagle3build.draft.servable)


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
    tensors; ``vllm_load_check``: auto | always | never. ``given_files``: a given head's files (config
    ``draft.head``: its config.json first, then its weights; ``export_given``), in place of the checkpoint and vocab
    map (then None)."""

    out_dir: str | os.PathLike
    target_dir: str
    checkpoint_dir: str | os.PathLike | None = None
    d2t_path: str | None = None
    t2d_path: str | None = None
    vocab_json: str | None = None
    gpus: int = 0
    benchmarked_by: str | None = None
    given_files: list[str] | None = None


def vllm_check_plan(s: ExportSettings) -> tuple[bool, str | None]:
    """Whether export's vLLM load check runs (``s.vllm_load_check``, ``s.benchmarked_by``, vLLM importable: see
    ``export``) and, where ``auto`` leaves it out, why.

    Raises:
        engine_process.VLLMUnavailable: ``always`` and vLLM cannot be imported.
    """
    if s.vllm_load_check == "always":
        engine_process.require_vllm(needed_by=f"{os.fspath(s.out_dir)} (export.vllm_load_check: always)")
        return True, None
    if s.vllm_load_check == "auto" and s.benchmarked_by:
        skipped = f"the same plan's benchmark ({s.benchmarked_by}) loads this head in vLLM"
        log.info("vLLM load check left out: %s", skipped)
        return False, skipped
    if s.vllm_load_check == "auto":
        try:
            engine_process.require_vllm(needed_by=f"the vLLM load check of {os.fspath(s.out_dir)}")
            return True, None
        except engine_process.VLLMUnavailable as e:
            log.warning("vLLM load check skipped: %s", e)
            return False, str(e)
    return False, None


def export(s: ExportSettings) -> dict:
    """Check the checkpoint of ``s.checkpoint_dir`` against the vocab map and write the head directory ``s.out_dir``;
    then load it with speculators and, where vLLM is installed (``s.vllm_load_check``: auto | always | never), with
    vLLM, serving the target tensor-parallel over the job's ``s.gpus`` GPUs (0 = CPU, float32). Returns the head's
    meta (``head_meta.json``'s content).

    ``auto`` without an importable vLLM skips the vLLM check with a warning, recorded in
    ``head_meta.json`` (``vllm_load_check.skipped``); ``always`` then fails before any work. ``auto`` also skips it
    where the same plan benchmarks the head (``s.benchmarked_by``: that benchmark's file, ``workflow.plan
    .benchmark_in_plan``): the benchmark's engines load it minutes later, and a head that does not load fails there,
    naming vLLM's error; ``head_meta.json`` says so. With ``s.given_files`` (config ``draft.head``):
    ``export_given``.

    Raises:
        artifacts.ArtifactError: the checkpoint's ``train_meta.json`` is missing or does not match its schema.
        engine_process.VLLMUnavailable: ``vllm_load_check="always"`` and vLLM cannot be imported.
        ExportError: vocab-map fingerprint differs from the one trained with (both named);
            the checkpoint's config.json is of another method or layer than its train_meta.json says
            (``Head.read``); a required tensor is missing or has the wrong shape/dtype; d2t/t2d disagree
            with each other or with the map files; an absolute path would be written.
    """
    from safetensors.torch import load_file, save_file

    if s.given_files:
        return export_given(s)
    checkpoint_dir, d2t_path, t2d_path, out_dir = s.checkpoint_dir, s.d2t_path, s.t2d_path, s.out_dir
    served_name, dtype = s.served_name, s.weights_dtype
    vllm_check, skipped = vllm_check_plan(s)
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
    _check_written(s, Head.of(out_dir, cfg), out_state, head_meta, vllm_check, skipped, trained)
    log.info("exported head to %s (%d tensors, %s)", out_dir, len(out_state), dtype)
    return head_meta


def _check_written(s: ExportSettings, head: Head, state: dict, head_meta: dict, vllm_check: bool,
                   skipped: str | None, checkpoint: Head | None = None) -> None:
    """The head just written to ``s.out_dir`` (``head``, its tensors ``state``) loaded with speculators and, where
    ``vllm_check``, in vLLM (else ``skipped``, auto's reason, is recorded); ``head_meta.json`` rewritten with the
    outcome. A head that does not load is removed.

    Raises:
        ExportError: as ``check_loads_with_speculators`` and ``check_loads_with_vllm``.
    """
    try:
        check_loads_with_speculators(head, s.target_dir, state, checkpoint)
        if vllm_check:
            head_meta["vllm_load_check"] = check_loads_with_vllm(head, s.target_dir, s.served_name, gpus=s.gpus,
                                                                 pipeline_parallel_size=s.pipeline_parallel_size,
                                                                 trust_remote_code=s.trust_remote_code)
        elif skipped is not None:
            head_meta["vllm_load_check"] = {"skipped": skipped}
        write_json(Path(s.out_dir) / "head_meta.json", head_meta)
    except BaseException:
        shutil.rmtree(s.out_dir, ignore_errors=True)  # a head that does not load is no artifact
        raise


def export_given(s: ExportSettings) -> dict:
    """The given head of ``s.given_files`` (config ``draft.head``: its config.json, then its weight file) as the run's
    head folder ``s.out_dir``: in speculators' format its config.json and model.safetensors copied as they are; in
    the EAGLE repo's EAGLE-3 format converted by speculators' converter (``given_head.as_speculators``) and written as
    ``export`` writes a trained head (served config naming ``s.served_name``, tensors in ``s.weights_dtype``). Checked
    against the target of ``s.target_dir`` (``check_given``), loaded with speculators and, as ``export`` says, in
    vLLM. Returns ``head_meta.json``'s content: the head's aux ids, draft vocabulary, flags (its ``head_variant`` where
    they are one of ``head_format.HEAD_VARIANTS``), method and layer where not the defaults, ``source`` (its folder,
    format and route), served name, dtype, tensor shapes and the vLLM load check.

    Raises:
        ExportError: the folder is no head (``given_head.read``: what is missing), the converter fails, or the head
            is not of the target (``check_given``), or it does not load.
        engine_process.VLLMUnavailable: ``vllm_load_check="always"`` and vLLM cannot be imported.
    """
    import tempfile

    from safetensors.torch import load_file, save_file

    folder = Path(s.given_files[0]).parent
    vllm_check, skipped = vllm_check_plan(s)
    try:
        given = given_head.read(folder)
        with tempfile.TemporaryDirectory(prefix="eagle3-given-") as work:
            src = given_head.as_speculators(given, s.target_dir, Path(work) / "converted")
            cfg = json.loads((src / "config.json").read_text())
            head = Head.of(src, cfg)
            state = load_file(str(src / "model.safetensors"))
            if given.format != "speculators":  # converted: written as export writes a trained head
                tdt = TORCH_DTYPES[s.weights_dtype]
                state = {k: (v.to(tdt) if v.is_floating_point() else v).contiguous() for k, v in state.items()}
                cfg = head.served_config(s.served_name, s.weights_dtype)
            check_given(head, state, s.target_dir)
            dtype = next(str(v.dtype).removeprefix("torch.") for k, v in state.items() if v.is_floating_point())
            with atomic_path(s.out_dir) as tmp:
                tmp.mkdir()
                if given.format == "speculators":  # taken as it is
                    shutil.copyfile(src / "config.json", tmp / "config.json")
                    shutil.copyfile(src / "model.safetensors", tmp / "model.safetensors")
                else:
                    (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
                    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    except (given_head.GivenHeadError, HeadError) as e:
        raise ExportError(str(e)) from None
    head = Head.of(s.out_dir, cfg)
    flags = {k: bool(cfg.get(k, False)) for k in HEAD_FLAGS}
    variant = next((v for v, f in HEAD_VARIANTS.items() if f == flags), None)
    head_meta = {"aux_layer_ids": list(head.aux_layer_ids or []), "draft_vocab_size": int(state["d2t"].shape[0]),
                 **({"head_variant": variant} if variant else {}), "head_flags": flags,
                 **({"method": head.method.name} if head.method.recorded else {}),
                 **({"layer": head.layer.name} if head.layer.recorded else {}),
                 "source": {"path": os.path.abspath(folder), "format": given.format, "route": given.described},
                 "served_name": s.served_name, "dtype": dtype,
                 "tensors": {k: list(v.shape) for k, v in state.items()}}
    write_json(Path(s.out_dir) / "head_meta.json", head_meta)
    _check_written(s, head, state, head_meta, vllm_check, skipped)
    log.info("the given head %s (%s) is the run's head %s (%d tensors, %s)", folder, given.described, s.out_dir,
             len(state), dtype)
    return head_meta


def check_given(head: Head, state: dict[str, torch.Tensor], target_dir: str) -> None:
    """A given head (``head``, its tensors ``state``) against the target of ``target_dir`` (its config.json): every
    tensor its layout requires (``Head.expected_shapes``; the embedding optional, vLLM then shares the target's) of
    its shape, ``d2t`` int64 and ``t2d`` bool consistent with each other (``vocab_map.check_consistent``) and ``t2d``
    over the target's vocabulary, and the ``fc`` over its aux layers' states of the target's hidden size.

    Raises:
        ExportError: naming the tensor or field, its value and the target's.
    """
    tc = json.loads((Path(target_dir) / "config.json").read_text())
    tc = tc.get("text_config", tc)
    where = f"{head.path}/model.safetensors"
    for name, shape in Head.of(head.path, given_head.shape_config(head.config)).expected_shapes().items():
        if name not in state:
            if name in given_head.OPTIONAL_TENSORS:
                continue
            raise ExportError(f"{where}: required tensor {name} is missing")
        if tuple(state[name].shape) != shape:
            raise ExportError(f"{where}: {name} has shape {tuple(state[name].shape)}, expected {shape}")
    d2t, t2d = state["d2t"], state["t2d"]
    if d2t.dtype != torch.int64 or t2d.dtype != torch.bool:
        raise ExportError(f"{where}: d2t must be int64 and t2d bool, got {d2t.dtype} / {t2d.dtype}")
    if t2d.shape[0] != tc.get("vocab_size", t2d.shape[0]):
        raise ExportError(f"{where}: t2d covers {t2d.shape[0]} target tokens, the target's vocabulary is "
                          f"{tc['vocab_size']} ({target_dir}/config.json)")
    try:
        vocab_map.check_consistent(d2t, t2d)
    except ValueError as e:
        raise ExportError(f"{where}: {e}") from None
    fc = state.get("fc.weight")
    n_aux = len(head.aux_layer_ids or [0, 0, 0])
    if fc is not None and tc.get("hidden_size") and fc.shape[1] != n_aux * tc["hidden_size"]:
        raise ExportError(f"{where}: fc.weight takes {fc.shape[1]} inputs, {n_aux} aux layers of the target's hidden "
                          f"size {tc['hidden_size']} ({target_dir}/config.json) are {n_aux * tc['hidden_size']}")


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
