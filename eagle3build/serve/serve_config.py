"""Stage ``serve_config``: the serving files, ``results/<run>/serve/`` (``serving_files``): the run's head behind vLLM's
OpenAI-compatible server, at the benchmark's choice of k, on the serve section's engine layout.

The route. serve.yaml names the target folder as ``model`` and the head through ``--speculative-config`` (vLLM's
speculative_config: method, the head's folder, k, a k schedule's bands), as every engine of the benchmark does
(``head_format.Head.speculative_config``, ``engine_args.drafter_config``). speculators' own route, ``vllm serve <head>``
(vLLM reads the head's ``speculators_config`` and serves its verifier, ``target.served_name``), needs that name to
resolve where the server runs: offline it must be a local folder or in the Hugging Face cache, and the bundled target's
``HuggingFaceTB/SmolLM2-135M-Instruct`` is neither on a fresh machine; it serves the k in the head's config, not the
benchmark's choice, and no k schedule; and vLLM's speculators parser reads llama and qwen3 layers only, so an MLA head
(``draft.layer: mla``, exported in vLLM's own Eagle3DeepseekV3ForCausalLM format) has no such route. The file's route
works offline for every head; ``serving.json`` says whether speculators' route would serve this head here too
(``speculators_route``).

The k (``choose_k``): the k schedule's bands where ``benchmark.k_schedule_concurrencies`` made one (vLLM's
``num_speculative_tokens_per_batch_size``, with the environment it needs: ``k_schedule.SCHEDULE_ENV``), else the k of
the run's own head with the highest speed-up over the target alone in benchmark.json.

The sampling (``server_sampling``): what a request that sets none is sampled with, the server's defaults, from the
target's generation_config.json as vLLM reads it (``--generation-config auto``), else vLLM's own; serving.json says which
(a request's ``"temperature": 0`` is greedy, as the benchmark's engines decode).

The environment (serve.env): offline mode (``target.offline``), the engine settings every engine here runs with
(``engine_process.ENGINE_ENV``) and the schedule's.

The bytes depend on the head's and the target's folders, benchmark.json's choice of k, the layout
(``resources.serve.gpu``, ``target.pipeline_parallel_size``) and the settings named in serve.yaml, and on nothing
else (no times, no measured figures but those behind the choice): a benchmark rerun that chooses the same k rewrites
the same bytes.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..atomic import atomic_path, write_json, write_text
from ..config.settings import config_fields, job
from ..draft.head_format import Head
from ..formats.artifacts import Serving, validate
from ..formats.benchmark_runs import OWN_HEAD, benchmark_runs
from ..formats.quantization import describe
from ..vllm import engine_process
from ..vllm.engine_args import config_json, drafter_config, engine_arg_declared, engine_args, engine_layout
from . import serving_files
from .k_schedule import SCHEDULE_ENV

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes.
OUTPUT_VERSION = 2  # 2: serving.json's sampling
# The serving files (results/<run>/serve/): the head behind vLLM's OpenAI-compatible server at the benchmark's choice
# of k, on the serve section's layout. vLLM's version decides which server options the file may name.
STAGE = {
    "inputs": ("head", "head_config", "target"), "packages": ("vllm",), "entry": "serve_config",
    "keys": {"run": "files", "target.bundled": "files", "target.path": "files", "target.served_name": "trigger:serve",
             "target.serve_dtype": "trigger:serve/dtype", "target.trust_remote_code": "trigger",
             "target.offline": "trigger:serve", "target.pipeline_parallel_size": "trigger:serve",
             "benchmark.max_model_len": "trigger:serve", "benchmark.seed": "trigger:serve", "serve.port": "trigger:serve",
             "resources.serve.gpu": "trigger:serve/gpus"},
}

ROUTE = "speculative-config"
ROUTE_WHY = (
    "serve.yaml names the target folder as model and the head through --speculative-config (method, folder, k): it "
    "works offline whatever target.served_name says, serves the folder the head was trained and benchmarked on, carries "
    "the benchmark's k (or its k schedule) and the engine settings the benchmark measured, and is the one route vLLM "
    "has for an MLA head"
)


# The sampling parameters vLLM's server takes as its defaults from a target's generation config, and vLLM's own where
# it sets none (vllm/config/model.py ModelConfig.get_diff_sampling_param's available_params, max_new_tokens aside;
# vllm/sampling_params.py SamplingParams' defaults; vLLM 0.32).
VLLM_SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
                          "presence_penalty": 0.0, "frequency_penalty": 0.0}


def server_sampling(target_dir: str | os.PathLike, trust_remote_code: bool) -> dict:
    """The sampling a request to the server gets where it sets none: each field of ``VLLM_SAMPLING_DEFAULTS`` from the
    target's generation config where it sets one (``"source": "target"``), else vLLM's default (``"vllm"``).

    The generation config is read as vLLM reads it under ``--generation-config auto`` (its default; serve.yaml sets
    none): ``transformers.GenerationConfig.from_pretrained(target_dir)``, else ``from_model_config`` of the target's
    config.json, its fields that differ from transformers' defaults (``to_diff_dict``;
    vllm/transformers_utils/config.py ``try_get_generation_config``, vllm/config/model.py ``try_get_generation_config``).
    ``trust_remote_code``: the user's ``target.trust_remote_code``, for a config.json of custom code.

    Returns:
        ``{"defaults": {field: value}, "source": {field: "target" | "vllm"}, "greedy": bool, "why": str}``;
        ``greedy``: a request that sets no temperature is decoded greedily (temperature 0).

    Raises:
        ValueError: a field the target sets is not a number (the file and field named).
    """
    from transformers import AutoConfig, GenerationConfig

    target = Path(target_dir)
    try:
        generation = GenerationConfig.from_pretrained(target).to_diff_dict()
        where = target / "generation_config.json"
    except OSError:
        try:
            config = AutoConfig.from_pretrained(target, trust_remote_code=trust_remote_code)
            generation = GenerationConfig.from_model_config(config).to_diff_dict()
        except OSError:
            generation = {}
        where = target / "config.json"
    defaults, source = {}, {}
    for field, default in VLLM_SAMPLING_DEFAULTS.items():
        value = generation.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{where}: {field} is {value!r}, not a number")
        defaults[field] = default if value is None else value
        source[field] = "vllm" if value is None else "target"
    greedy = defaults["temperature"] == 0
    set_here = sorted(f for f, v in source.items() if v == "target")
    why = (f"{where.name} sets {', '.join(set_here)}" if set_here else
           "the target's generation config sets no sampling parameter: vLLM's defaults") + (
        "; a request that sets no temperature is decoded greedily" if greedy else
        f"; a request that sets no temperature is sampled at {defaults['temperature']} (send \"temperature\": 0 for "
        "greedy decoding, as the benchmark decodes)")
    return {"defaults": defaults, "source": source, "greedy": greedy, "why": why}


class ServeConfigError(ValueError):
    """benchmark.json gives no k to serve the run's own head with (named)."""


def choose_k(bench: Mapping[str, Any]) -> dict:
    """The k the serving files serve, from benchmark.json ``bench``: the k schedule where the benchmark made one
    (``k_schedule.speculative_config`` not null: its bands as vLLM's ``num_speculative_tokens_per_batch_size``, the
    largest band k as ``num_speculative_tokens``), else the run's own head's run of the highest speed-up over the
    target alone (all sets; the smaller k on a tie). Returns ``{"source": "k_schedule" | "best_k",
    "num_speculative_tokens": k, "bands": list | None, "benchmark": the figures behind the choice, "why": str}``.

    Raises:
        ServeConfigError: benchmark.json holds no run of the run's own head.
    """
    runs = [r for r in benchmark_runs(dict(bench)) if r.get("head", OWN_HEAD) == OWN_HEAD]
    if not runs:
        raise ServeConfigError("benchmark.json holds no run of the run's own head: nothing to choose k from")
    best = max(runs, key=lambda r: (r["speedup"], -r["num_speculative_tokens"]))
    ks = sorted(r["num_speculative_tokens"] for r in runs)
    k = best["num_speculative_tokens"]
    out = {"source": "best_k", "num_speculative_tokens": k, "bands": None,
           "benchmark": {"concurrency": bench["settings"]["concurrency"], "speedup": round(best["speedup"], 4),
                         "mean_acceptance_length": best.get("mean_acceptance_length")},
           "why": f"k {k}: the highest speed-up over the target alone in benchmark.json among k {ks} "
                  f"(x{best['speedup']:.3f}, {bench['settings']['concurrency']} request(s) in flight)"}
    sched = bench.get("k_schedule")
    if sched and sched.get("speculative_config"):
        bands = [list(b) for b in sched["schedule"]]
        return {"source": "k_schedule", "num_speculative_tokens": max(b[2] for b in bands), "bands": bands,
                "benchmark": {"scheduled": sched["scheduled"], "never_slower": sched["never_slower"]},
                "why": f"the benchmark's k schedule {bands} ([first batch size, last, k]) measured at "
                       f"{sched['concurrencies']} requests in flight, on vLLM's V1 runner ({SCHEDULE_ENV})"}
    if sched:
        out["why"] += (f"; the k schedule found the head slower than the target alone on balance at "
                       f"{sched['concurrencies']} requests in flight (benchmark.json k_schedule): this serves the head "
                       "anyway, at that k")
    return out


def verifier_resolves_offline(name: str | None) -> bool:
    """Whether vLLM can find the verifier ``name`` (a head's ``speculators_config.verifier.name_or_path``) without the
    network: a local folder with a config.json, or a repository whose config.json is in the Hugging Face cache
    (``huggingface_hub.try_to_load_from_cache``)."""
    if not name:
        return False
    if (Path(name) / "config.json").is_file():
        return True
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # noqa: BLE001 - a name that is no repository id resolves nowhere
        return False


def speculators_route(head: Head) -> dict:
    """Whether speculators' own route, ``python -m vllm.entrypoints.openai.api_server --model <head folder>`` (vLLM
    reads the head's ``speculators_config`` and serves its verifier), serves ``head`` here offline:
    ``{"available": bool, "command": str | None, "verifier": str | None, "why": str}``. A head whose config.json holds
    no ``speculators_config`` (an MLA head: vLLM's own config format, since vLLM's speculators parser reads llama and
    qwen3 layers only, vllm/transformers_utils/configs/speculators/algos.py, vLLM 0.26-0.32) has none."""
    head_dir, cfg = os.path.abspath(head.path), head.config
    if "speculators_config" not in cfg:
        return {"available": False, "command": None, "verifier": None,
                "why": f"the head's config.json is vLLM's own ({', '.join(cfg.get('architectures') or [])}), not "
                       "speculators' format: vLLM's speculators parser reads llama and qwen3 layers only"}
    verifier = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    cmd = f"python -m {serving_files.SERVER_MODULE} --model {head_dir}"
    if verifier_resolves_offline(verifier):
        return {"available": True, "command": cmd, "verifier": verifier,
                "why": f"its verifier {verifier} resolves offline (a local folder or the Hugging Face cache); it serves "
                       "the k of the head's config.json, not the benchmark's choice"}
    return {"available": False, "command": cmd, "verifier": verifier,
            "why": f"its verifier {verifier} (target.served_name) is neither a local folder nor in the Hugging Face "
                   "cache, so an offline server cannot find it"}


@config_fields({
    "serve_gpus": "resources.serve.gpu", "served_name": "target.served_name",
    "max_model_len": "benchmark.max_model_len", "seed": "benchmark.seed", "dtype": "target.serve_dtype",
    "pipeline_parallel_size": "target.pipeline_parallel_size",
    "trust_remote_code": "target.trust_remote_code", "port": "serve.port", "offline": "target.offline",
})
class ServeConfigSettings:
    """One serve_config job (``serve_config``): the serving files of the head in ``head_dir`` and the target in
    ``target_dir`` at the choice of k of ``benchmark_json`` (benchmark.json), into ``out_dir``;
    ``per_request_metrics``: vLLM's per-request τ in each response (None: where the installed vLLM has it,
    ``engine_args.engine_arg_declared``). The config fields (below, from their keys' declarations): the engine is the
    benchmark's (``serve_gpus`` GPUs of the serve section, ``pipeline_parallel_size`` stages, ``served_name``,
    ``max_model_len`` tokens, ``seed``, ``dtype`` as ``target.serve_dtype``); ``port``; ``offline``: the Hugging Face
    offline variables in the environment."""

    head_dir: str = job("params.head_dir")
    target_dir: str = job("params.target_dir")
    benchmark_json: str | None = job("inputs.benchmark", default=None)
    out_dir: str | None = job("params.out_dir", default=None)
    per_request_metrics: bool | None = None

    def __post_init__(self) -> None:
        if self.per_request_metrics is None:
            object.__setattr__(self, "per_request_metrics", engine_arg_declared("per_request_spec_decode_metrics"))


def serving(s: ServeConfigSettings, bench: Mapping[str, Any]) -> dict:
    """The serving files' contents for ``s`` (``ServeConfigSettings``: the head's config.json read) at the k
    ``choose_k`` takes from benchmark.json ``bench``: ``{"options": serve.yaml's (``serving_files.server_options``),
    "env": serve.env's, "serving": serving.json's}``.

    Raises:
        ServeConfigError: as ``choose_k``.
        OSError, ValueError: the head's config.json cannot be read, or names no registered method; a 16-bit dtype on CPU.
    """
    head_dir, target_dir = os.path.abspath(s.head_dir), os.path.abspath(s.target_dir)
    gpus, port, served_name = s.serve_gpus, s.port, s.served_name
    engine = engine_args(target_dir, gpus=gpus, served_name=served_name, max_model_len=s.max_model_len,
                         seed=s.seed, dtype=s.dtype, pipeline_parallel_size=s.pipeline_parallel_size,
                         trust_remote_code=s.trust_remote_code)
    choice = choose_k(bench)
    head = Head.read(head_dir)
    spec = head.speculative_config(choice["num_speculative_tokens"], choice["bands"] or None)
    spec = drafter_config(engine, spec)  # an MLA head on CPU: the engine's attention backend
    env = {**({v: "1" for v in engine_process.OFFLINE_VARS} if s.offline else {}), **engine_process.ENGINE_ENV,
           **(SCHEDULE_ENV if choice["bands"] else {})}
    options = serving_files.server_options(engine, spec, port, s.per_request_metrics)
    return {"options": options, "env": env, "serving": {
        "head": head_dir, "target": target_dir, "route": ROUTE, "why": ROUTE_WHY,
        "speculators_route": speculators_route(head), "k": choice, "speculative_config": spec,
        "layout": engine_layout(gpus, s.pipeline_parallel_size), "dtype": engine["dtype"], "port": port,
        "served_name": served_name, "env": env, "per_request_metrics": s.per_request_metrics,
        "sampling": server_sampling(target_dir, s.trust_remote_code),
        **target_form(target_dir),
    }}


def target_form(target_dir: str | os.PathLike) -> dict:
    """``{"target_quantization": scheme}`` for a quantized target (issue 74: vLLM starts it from its folder as it is,
    quantized, reading its config.json's quantization_config; serving.json says which form it serves), ``{}`` for a
    dense one (its serving.json keeps its bytes)."""
    d = describe(config_json(target_dir))
    return {"target_quantization": d["scheme"]} if d else {}


def write(out_dir: str | os.PathLike, contents: Mapping[str, Any], python: str = sys.executable) -> dict[str, str]:
    """Write ``contents`` (``serving``) as the serving files in ``out_dir``, each atomically; serve.sh executable, run
    with ``python`` unless ``PYTHON`` is set. The command (``serving_files.command``) goes into serving.json too,
    which is checked against its schema (eagle3build/schemas/serving.schema.json) before any file is written.
    Returns ``{file name: path}``.

    Raises:
        artifacts.ArtifactError: serving.json's content is off its schema (the field named).
    """
    out_dir = Path(out_dir)
    yml = str(out_dir.resolve() / serving_files.SERVE_YAML)
    serving_json = {**contents["serving"], "command": shlex.join(serving_files.command(yml, contents["env"]))}
    validate(serving_json, Serving.SCHEMA, out_dir / serving_files.SERVING_JSON)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / serving_files.SERVE_YAML,
               serving_files.serve_yaml_text(contents["options"], contents["serving"]["head"]))
    write_text(out_dir / serving_files.SERVE_ENV, serving_files.env_text(contents["env"]))
    with atomic_path(out_dir / serving_files.SERVE_SH) as tmp:
        tmp.write_text(serving_files.serve_sh_text(yml, contents["env"], python))
        tmp.chmod(0o755)
    write_json(out_dir / serving_files.SERVING_JSON, serving_json)
    names = (serving_files.SERVE_YAML, serving_files.SERVE_ENV, serving_files.SERVE_SH, serving_files.SERVING_JSON)
    return {n: str(out_dir / n) for n in names}


def serve_config(s: ServeConfigSettings) -> dict:
    """Rule ``serve_config``'s entry (``eagle3build.workflow.job.run_stage``): the serving files of ``s`` (``serving``
    of ``s.benchmark_json``), written into ``s.out_dir``. Returns serving.json's content; raises what ``serving`` and
    ``write`` raise."""
    import json

    contents = serving(s, json.loads(Path(s.benchmark_json).read_text()))
    paths = write(s.out_dir, contents)
    serving_json = Serving.load(paths[serving_files.SERVING_JSON]).data
    log.info("serving files in %s: %s (k: %s); speculators' route: %s", s.out_dir, serving_json["command"],
             contents["serving"]["k"]["why"], contents["serving"]["speculators_route"]["why"])
    return serving_json
