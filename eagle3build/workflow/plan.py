"""Planning policy the rules read, tested without Snakemake: what the plan refuses before any job, and what it tells jobs
about the plan itself (what Snakemake was asked to build).

``aux_layer_ids_problem``: ``capture.aux_layer_ids`` against the target's decoder layers (its config.json), refused at
planning in one line rather than in the compat report after the data (issue 67).
``benchmark_in_plan``: whether this plan builds the run's benchmark, which serves the run's heads in vLLM engines; the
export job then leaves its own vLLM load check out (``export.vllm_load_check: auto``), since the benchmark's engines
load the same head minutes later (issue 65: 38 s of a 51 s export on an H100).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from ..formats.target_files import check_aux_layer_ids, default_aux_layer_ids, num_decoder_layers

# The rules whose jobs need the run's benchmark.json (rules/benchmark.smk and the rules below it): asking for one of
# them, or for one of their files, plans the benchmark.
BENCHMARK_RULES = ("all", "benchmark", "plot_benchmark", "serve_config", "serve_check")
# The files of those rules under results/<run>/ (rules/benchmark.smk, plot_benchmark.smk, serve_config.smk,
# serve_check.smk).
BENCHMARK_FILES = ("benchmark.json", "report/benchmark.png", "serve/serve.yaml", "serve/serve.env", "serve/serve.sh",
                   "serve/serving.json", "serve/serve_check.json")


def benchmark_in_plan(targets: Iterable[str], res: str, until: Iterable[str] = (), omit_from: Iterable[str] = (),
                      target_jobs: Iterable[str] = ()) -> str | None:
    """The run's benchmark file (``<res>/benchmark.json``) where the plan asked for by ``targets`` (Snakemake's targets:
    rule names or file paths, relative to the working directory) and ``target_jobs`` (``--target-jobs`` specs,
    ``rule:wildcards``: how a cluster job's own Snakemake is given its one job) builds it, else None. Neither given:
    the default target, rule ``all``, which does. A plan cut by ``--until`` or ``--omit-from`` is taken not to (a
    head exported there is checked by itself).

    ``res``: the run's results folder (``results/<run>``).
    """
    if tuple(until) or tuple(omit_from):
        return None
    wanted = {os.path.normpath(os.path.join(res, f)) for f in BENCHMARK_FILES}
    asked = set(targets) | {str(j).split(":", 1)[0] for j in target_jobs}
    if not asked or any(t in BENCHMARK_RULES or os.path.normpath(t) in wanted for t in asked):
        return os.path.join(res, "benchmark.json")
    return None


def aux_layer_ids_problem(aux_layer_ids: str | list[int], target_config: Mapping[str, Any] | None,
                          target: str = "the target") -> str | None:
    """Why the config's ``capture.aux_layer_ids`` (``auto`` or a list) cannot be captured from a target whose
    config.json is ``target_config`` (a dict; None: not readable at planning, checked by the compat report), as one
    line naming the key and ``target`` (``target.path /models/x``); None where they can (``auto``: three distinct
    layers for any target of 3 layers or more, ``target_files.default_aux_layer_ids``)."""
    n = num_decoder_layers(dict(target_config)) if target_config else None
    if n is None:
        return None
    try:
        if aux_layer_ids == "auto":
            default_aux_layer_ids(n)
        else:
            check_aux_layer_ids(list(aux_layer_ids), n)
    except ValueError as e:
        return f"config: {e} ({target}: {n} decoder layers in its config.json)"
    return None

