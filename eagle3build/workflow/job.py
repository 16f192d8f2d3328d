"""Set-up shared by the workflow's jobs: one log file per job, offline mode, thread count; and the one
adapter's call of a stage's entry (``run_stage``) with the stage's settings object made from the job
(``stage_settings``: its config fields from the job's ``contract.StageSettings``, its own fields from the job's
named inputs, outputs, params, wildcards, resources and decisions.json as the contract's ``from_job`` says,
``job_fields``).

``setup(snakemake)`` points Python logging *and* the process's stdout/stderr file
descriptors at the rule's log, so output of C extensions and of child processes (vLLM's
engine core) lands there too. Takes the ``snakemake`` object duck-typed; nothing here
imports Snakemake.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
from typing import Any, Callable

from ..vllm.engine_process import OFFLINE_VARS
from .joblog import log_to_file

_GPU_ALLOCATION = None  # this job's GPU slots, held for the life of the process


def setup(smk) -> logging.Logger:
    """Log to ``smk.log[0]``; set HF offline mode when setting ``target.offline`` (``smk.params.settings``,
    the job's ``contract.StageSettings``) is true; use ``smk.threads`` torch threads; for a job with
    ``resources.gpu > 0``, take that many GPUs no concurrent job holds and export them as
    ``CUDA_VISIBLE_DEVICES`` (``gpu_slots``), held until the process exits; log the installed versions of
    the packages that shape the stage's output (its contract's ``packages``), as the job's environment
    holds them. A job that runs in a job host (``host.routed``: a ``contract.HOSTED`` stage's) takes no GPUs
    and imports no torch here: the host holds its GPUs (``main``)."""
    log = log_to_file(smk.log[0])
    from . import gpu_slots, host
    from .contract import CONTRACTS, stage_of

    stage = stage_of(getattr(smk, "rule", None))
    hosted = host.routed(stage)
    n_gpu = int(getattr(smk.resources, "gpu", None) or 0)  # a CPU job's resources name no gpu
    global _GPU_ALLOCATION
    _GPU_ALLOCATION = None if hosted else gpu_slots.claim_for_job(n_gpu)
    if _GPU_ALLOCATION is not None:
        log.info("CUDA_VISIBLE_DEVICES=%s", _GPU_ALLOCATION.cuda_visible_devices)
    offline = smk.params.settings["target.offline"]
    if offline:
        for var in OFFLINE_VARS:
            os.environ[var] = "1"  # inherited by child processes (the vLLM engine) too
    from .staleness import package_versions

    contract = CONTRACTS.get(stage)
    if contract is not None and contract.packages:  # what this job's environment holds (docs/staleness.md)
        log.info("packages that shape this stage's output: %s", package_versions(contract.packages))
    if not hosted:
        import torch

        torch.set_num_threads(max(1, int(smk.threads)))
    log.info("job %s: %d thread(s), offline=%s", getattr(smk, "rule", "?"), smk.threads, offline)
    return log


def _paths(named: Any) -> dict[str, str | list[str]]:
    """Named files as plain paths: a Snakemake ``Namedlist``'s named items or a mapping, each value a ``str``
    or a list of ``str`` (an input function that gave nothing: an empty list)."""
    items = named.items() if hasattr(named, "items") else ()
    return {k: str(v) if isinstance(v, (str, os.PathLike)) else [str(p) for p in v] for k, v in items}


def _mapping(named: Any) -> dict[str, Any]:
    """A ``Namedlist``'s named items (or a mapping's) as a dict; ``{}`` for None."""
    return dict(named.items()) if named is not None else {}


def _attribute(name: str) -> Any:
    """The object ``module:attribute`` names, imported."""
    module, attribute = name.split(":")
    return getattr(importlib.import_module(module), attribute)


def entry_function(rule: str) -> Callable[..., Any]:
    """The entry of ``rule`` (``contract.entry``: ``module:function``), imported.

    Raises:
        KeyError: ``rule`` has no entry.
    """
    from .contract import entry

    return _attribute(entry(rule))


def stage_settings(rule: str, *, inputs: Any = None, outputs: Any = None, params: Any = None, wildcards: Any = None,
                   resources: Any = None, settings: Any = None) -> Any:
    """The settings object a job of ``rule`` runs with: an object of its ``contract.job_entry``'s settings class
    (``config.settings.config_fields``), its config fields (and section fields) read from ``settings`` (the job's
    ``contract.StageSettings``; None: none, for a class without config fields), each of its own fields from the
    job as ``from_job`` says (``job_fields.JobField``: the named ``inputs``, ``outputs``, ``params``,
    ``wildcards``, ``resources``; decisions.json, the ``decisions`` input, read where a field comes from it).

    Raises:
        KeyError: ``rule`` has no entry; ``settings`` lacks a key of a config field; the job lacks what a field that
            is not optional reads (both named).
        artifacts.ArtifactError: decisions.json is missing or off its schema.
        TypeError, ValueError: as the class's constructor (a value outside its key's choices).
    """
    from .contract import job_entry
    from .job_fields import ABSENT

    e = job_entry(rule)
    job = {"inputs": _paths(inputs), "outputs": _paths(outputs), "params": _mapping(params),
           "wildcards": _mapping(wildcards), "resources": _mapping(resources)}
    if e.fields_of("decisions"):
        from ..formats.artifacts import Decisions

        job["decisions"] = Decisions.load(job["inputs"]["decisions"]).data
    own = {}
    for name, f in e.from_job.items():
        try:
            value = f.read(job)
        except KeyError as err:
            raise KeyError(f"{rule}: settings field {name}: {err.args[0]}") from None
        if value is not ABSENT:
            own[name] = value
    return _attribute(e.settings).from_settings({} if settings is None else settings, **own)


def run_stage(rule: str, *, inputs: Any = None, outputs: Any = None, params: Any = None, wildcards: Any = None,
              resources: Any = None, settings: Any = None) -> Any:
    """Call ``rule``'s entry (``entry_function``) with its one settings object, made from the job by
    ``stage_settings``; return what the entry returns. The one Snakemake adapter (scripts/run_stage.py) passes
    ``snakemake``'s ``input``, ``output``, ``params``, ``wildcards`` and ``resources``; without Snakemake, mappings do
    (``inputs={"tokens": path}``). ``settings`` defaults to ``params["settings"]`` (rules/common.smk,
    ``job_settings_param``).

    Raises:
        what ``stage_settings`` and the entry raise.
    """
    params = _mapping(params)
    settings = params.pop("settings", None) if settings is None else settings
    s = stage_settings(rule, inputs=inputs, outputs=outputs, params=params, wildcards=wildcards, resources=resources,
                       settings=settings)
    return entry_function(rule)(s)


def one_line(rule: str, error: BaseException) -> str:
    """A job's error as the one line that ends its log (``main``): the rule, the exception's type and its message with
    every run of whitespace made one space. The messages name the key or file to change (the stages' errors say so:
    ``set capture.aux_layer_ids``, the port and ``serve.port``, the file and field of a bad record)."""
    return f"{rule} failed: {type(error).__name__}: {' '.join(str(error).split())}"


def finish_or_end(outputs: list[str]) -> Callable[[int, Any], None]:
    """A job's SIGTERM handler (``main``; a stop from outside, workflow/stop.py): ignored once each of the job's
    ``outputs`` is in place (every writer renames its output into place last, and Snakemake removed them before the job
    started), so that a job done with its work exits 0 and Snakemake keeps them: a job ended by a signal is a failed
    one, whose outputs it removes (a finished training's, whose state is gone by then, would train again from step 0).
    Before that, the default: the job ends at once. A stage's own handler (training's ``save_on_term``, a hosted job's
    wait, ``host.run_job``) takes over while it runs, and puts this one back."""

    def on_term(signum: int, frame: Any) -> None:
        if outputs and all(os.path.exists(p) for p in outputs):
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    return on_term


def main(smk) -> Any:
    """The adapter's whole job (scripts/run_stage.py): ``setup`` the job's log, then ``run_stage`` of its rule with its
    named inputs, outputs, params, wildcards and resources (with ``threads``, the job's threads); for a job that runs in
    a job host (``host.routed``), its settings object goes to a host of its Snakemake run (``host.run_job``) instead of
    the entry here. An error is logged with its traceback and then as one line (``one_line``), the log's last, before
    the job exits 1: what Snakemake's ``onerror`` prints for it (workflow/summary.py). SIGTERM: ``finish_or_end``, then,
    once the route returned, ignored until the job exits."""
    from . import host
    from .contract import stage_of

    signal.signal(signal.SIGTERM, finish_or_end([str(f) for f in smk.output]))
    log = setup(smk)
    try:
        stage = stage_of(smk.rule)
        resources = {**_mapping(smk.resources), "threads": getattr(smk, "threads", None)}
        if host.routed(stage):
            params = _mapping(smk.params)
            s = stage_settings(smk.rule, inputs=smk.input, outputs=smk.output, params=params,
                               wildcards=smk.wildcards, resources=resources, settings=params.pop("settings"))
            out = host.run_job(stage, s, int(smk.threads), int(resources.get("gpu") or 0))
        else:
            out = run_stage(smk.rule, inputs=smk.input, outputs=smk.output, params=smk.params,
                            wildcards=smk.wildcards, resources=resources)
    except Exception as e:  # noqa: BLE001 - every stage error ends the log as one line
        log.exception("the traceback of the error below")
        logging.shutdown()
        print(one_line(smk.rule, e), file=sys.stderr, flush=True)  # bare, the log's last line
        raise SystemExit(1) from None
    # done: ignored from here to the exit (Python puts its own handlers back to the default while it shuts down)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return out

