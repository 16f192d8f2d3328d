"""benchmark.json's runs (shared layer, no torch): which heads a benchmark serves (``method_heads``: the run's own,
``draft.compare_methods``' beside it, checked against ``benchmark.compare_heads``), the runs of a written file in
either layout (``benchmark_runs``: ``runs`` from issue 55 on, ``eagle3`` before) and their names in logs and plots
(``run_label``, ``head_description``) and the figures of a run per category of a set (``category_figures``: set
``mtbench``). Read when planning (``workflow.plan``), by the benchmark, its plot and the records
(benchmarks/records.py).
"""

from __future__ import annotations

import os

# benchmark.json's label of the run's own head; benchmark.compare_heads names the others (serve.benchmark)
OWN_HEAD = "head"


def check_compare_names(compare_heads: list[dict]) -> None:
    """``benchmark.compare_heads`` (``[{"name", "path"}]``): each name unique and not ``OWN_HEAD``. Called when
    planning (``workflow.plan.check_compare_heads``) and by the benchmark itself (serve.benchmark, usable without
    Snakemake).

    Raises:
        ValueError: a name used twice or equal to ``OWN_HEAD``.
    """
    names = [h["name"] for h in compare_heads]
    if OWN_HEAD in names or len(set(names)) < len(names):
        raise ValueError(f"benchmark.compare_heads names {names}: each must be unique and not {OWN_HEAD!r} (the run's "
                         "own head)")


def method_heads(res: str, method: str, compare_methods: list[str], compare_heads: list[dict]) -> list[dict]:
    """The heads of ``draft.compare_methods`` (``compare_methods``), trained from the run's shards beside its own
    head of method ``method`` (``draft.method``), as ``benchmark.compare_heads`` entries: ``[{"name": m, "path":
    f"{res}/methods/{m}/head"}]`` in the listed order (``res``: the run's results folder, results/<run>). Called
    when planning (``workflow.plan.resolve_drafts``: the benchmark's inputs and its ``method_heads`` param, the heads
    it serves).

    Raises:
        ValueError: a listed method is the run's own ``method``, is listed twice, or its name or head folder is
            one of ``compare_heads``' (the benchmark serves each head once, under one name).
    """
    if method in compare_methods or len(set(compare_methods)) < len(compare_methods):
        raise ValueError(f"draft.compare_methods {compare_methods}: each once, and not draft.method ({method!r}), "
                         "whose head is the run's own")
    heads = [{"name": m, "path": f"{res}/methods/{m}/head"} for m in compare_methods]
    taken = sorted({h["name"] for h in compare_heads} & set(compare_methods))
    if taken:
        raise ValueError(f"draft.compare_methods and benchmark.compare_heads both name {taken}: the benchmark names "
                         "each head once (rename the compare_heads entry)")
    twice = sorted({os.path.normpath(h["path"]) for h in compare_heads} & {h["path"] for h in heads})
    if twice:
        raise ValueError(f"benchmark.compare_heads lists {twice}, a head of draft.compare_methods, which the benchmark "
                         "serves anyway")
    return heads


def run_label(run: dict) -> str:
    """A benchmark.json run's name in logs, errors and plots: ``k=3`` for the run's own head's run at k = 3,
    ``NAME k=3`` for a compared head's (its ``head``, ``benchmark.compare_heads``' name)."""
    k, head = run["num_speculative_tokens"], run.get("head", OWN_HEAD)
    return f"k={k}" if head == OWN_HEAD else f"{head} k={k}"


def head_description(run: dict) -> str:
    """What a benchmark.json run served, in words for plots: its draft method, draft layer, k and the positions
    the head was trained to fill in one forward (``any k`` for a head of one token a forward):
    ``peagle, llama layer, k=3 (trained for 8)``. A run written in the layout before issue 55 (under ``eagle3``)
    may name no method, layer or trained positions: those parts are left out (``k=3``)."""
    parts = [run["method"]] if run.get("method") else []
    if run.get("draft_layer"):
        parts.append(f"{run['draft_layer']} layer")
    k = f"k={run['num_speculative_tokens']}"
    if "trained_positions" in run:
        tp = run["trained_positions"]
        k += f" (trained for {tp})" if tp is not None else " (trained for any k)"
    return ", ".join([*parts, k])


def benchmark_runs(result: dict) -> list[dict]:
    """The runs with a head of a benchmark.json ``result``: ``runs`` (issue 55 on), or ``eagle3``, their key
    before (every head's runs were filed there, whatever its method)."""
    return result.get("runs", result.get("eagle3")) or []


def category_figures(run: dict) -> dict[str, dict[str, dict]]:
    """A benchmark.json run's figures per category of each set decoded by category (``mtbench``): ``{set: {category:
    {"tau": mean acceptance length τ (tokens; None where nothing was drafted), "speedup": output tokens/s over the
    baseline's same category, "acceptance_rate_per_position": [rate at draft position 1, ...] or None}}}``, sets
    and categories in the file's order; ``{}`` for a run without categories (every set but ``mtbench``, or a file
    written before issue 67)."""
    return {name: {cat: {"tau": c.get("mean_acceptance_length"), "speedup": c.get("speedup"),
                         "acceptance_rate_per_position": c.get("acceptance_rate_per_position")}
                   for cat, c in v["categories"].items()}
            for name, v in run.get("sets", {}).items() if v.get("categories")}
