"""Stage ``plot_benchmark``: the benchmark's figures as one PNG for ``snakemake --report``.

Left: vLLM's acceptance rate at each draft position, one line per k (num_speculative_tokens)
and prompt set, with τ in the legend. Middle: output tokens/s of each run with a head relative to
the baseline per prompt set and over all sets (speed-up bars; the line at 1 is the baseline). Right, where a set was
decoded by category (``mtbench``): τ per category, one bar per run, each labelled with its speed-up. Each
line and bar names its head's method, draft layer, k and trained positions (``benchmark_runs.head_description``).
Values are read from ``benchmark.json``
(eagle3build/schemas/benchmark.schema.json), nothing is recomputed.
"""

from __future__ import annotations

import logging
import os

from ..atomic import atomic_path
from ..config.settings import config_fields, job
from ..formats.benchmark_runs import OWN_HEAD, benchmark_runs, category_figures, head_description, run_label

# Version of what this stage writes: bump it when a change alters the output bytes.
# Not bumped for issue 55 item 4 (each bar and line names its head's method, draft layer, k and trained positions,
# head_description): no finished build replans for it; the plot is redrawn with the names when the benchmark reruns.
OUTPUT_VERSION = 1
STAGE = {"packages": ("matplotlib",), "entry": "plot_benchmark",
         "keys": {"run": "files", "target.offline": "runtime"}}

log = logging.getLogger(__name__)


def plot(benchmark_json: str | os.PathLike, out_png: str | os.PathLike) -> dict:
    """Write ``out_png`` (two panels, 10 x 4 inches at 80 dpi; three, 15 x 4 inches, where a set was decoded by
    category) from ``benchmark_json``.

    Left: acceptance rate per draft position, one line per k and prompt set (τ in the
    legend). Middle: speed-up bars per k, one bar per set and one for all sets together. Right (``mtbench``): τ per
    category, one bar per run, labelled with the category's speed-up. Heads compared beside
    the run's own (``benchmark.compare_heads``) get their runs side by side, named ``NAME k=K``.
    Returns ``{key: {"tau": τ, "speedup": x, "sets": {set: {"tau": τ, "speedup": x}}}}`` for the runs plotted,
    ``key`` the k of the run's own head's runs and ``"NAME k=K"`` of a compared head's; a run with categories also
    ``"categories": benchmark_runs.category_figures(run)``.

    Raises:
        artifacts.ArtifactError: benchmark.json is not JSON or does not match its schema.
        ValueError: the benchmark holds no run with a head.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from ..formats.artifacts import Benchmark

    b = Benchmark.load(benchmark_json).data  # checked against eagle3build/schemas/benchmark.schema.json
    runs = benchmark_runs(b)
    if not runs:
        raise ValueError(f"{benchmark_json}: no run with a head to plot")
    names = list(b["settings"]["sets"])
    styles = ["-", "--", ":", "-."]
    cats = [category_figures(r) for r in runs]  # {} for a run without a set decoded by category
    if any(cats):
        fig, (a, s, c) = plt.subplots(1, 3, figsize=(15, 4))
    else:
        fig, (a, s) = plt.subplots(1, 2, figsize=(10, 4))
    out = {}

    def key(r: dict):  # the returned dict's key: k for the run's own head, its label for a compared one
        return r["num_speculative_tokens"] if r.get("head", OWN_HEAD) == OWN_HEAD else run_label(r)

    for r, by_cat in zip(runs, cats):
        k = key(r)
        who = head_description(r) if r.get("head", OWN_HEAD) == OWN_HEAD else f"{r['head']}: {head_description(r)}"
        out[k] = {"tau": r["mean_acceptance_length"], "speedup": r["speedup"], "sets": {}}
        for j, name in enumerate(names):
            x = r["sets"][name]
            rates, tau = x["acceptance_rate_per_position"] or [], x["mean_acceptance_length"]
            label = f"{who} {name}, τ={tau:.2f}" if tau else f"{who} {name}"
            a.plot(range(1, len(rates) + 1), rates, marker="o", ls=styles[j % len(styles)], label=label)
            out[k]["sets"][name] = {"tau": tau, "speedup": x["speedup"]}
        if by_cat:
            out[k]["categories"] = by_cat
    a.set_xlabel("draft position")
    a.set_ylabel("acceptance rate (vLLM counters)")
    a.set_ylim(0, 1)
    a.set_title("acceptance per position")
    a.legend(fontsize="small")
    groups = [*names, "all"] if len(names) > 1 else names
    width = 0.8 / len(groups)
    xs = np.arange(len(runs))
    for j, name in enumerate(groups):
        ups = [r["speedup"] if name == "all" else r["sets"][name]["speedup"] for r in runs]
        bars = s.bar(xs + (j - (len(groups) - 1) / 2) * width, ups, width, label=name)
        s.bar_label(bars, labels=[f"{u:.2f}x" for u in ups], fontsize="small")
    s.set_xticks(xs, [_tick(r) for r in runs], fontsize="small")
    s.axhline(1.0, color="black", lw=1, ls="--", label=f"baseline {b['baseline']['output_tokens_per_s']:.1f} tok/s")
    compared = any(r.get("head", OWN_HEAD) != OWN_HEAD for r in runs)
    s.set_xlabel("head: method, draft layer, num_speculative_tokens (k)" if compared
                 else "method, draft layer, num_speculative_tokens (k)")
    s.set_ylabel("speed-up (output tokens/s vs baseline)")
    s.set_title("speed-up per prompt set")
    s.legend(fontsize="small")
    if any(cats):
        _categories(c, runs, cats)
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)
    log.info("plotted %s", out)
    return out


def _categories(ax, runs: list[dict], cats: list[dict[str, dict[str, dict]]]) -> None:
    """The per-category panel on ``ax``: for each set decoded by category (``cats``: ``category_figures`` of each of
    ``runs``), τ per category, one bar per run (a missing τ drawn as 0), labelled with the category's speed-up."""
    import numpy as np

    groups = [(name, cat) for name, by_cat in next(c for c in cats if c).items() for cat in by_cat]
    xs = np.arange(len(groups))
    width = 0.8 / len(runs)
    for j, (r, by_set) in enumerate(zip(runs, cats)):
        figs = [by_set.get(name, {}).get(cat, {}) for name, cat in groups]
        taus = [f.get("tau") or 0.0 for f in figs]
        who = head_description(r) if r.get("head", OWN_HEAD) == OWN_HEAD else f"{r['head']}: {head_description(r)}"
        bars = ax.bar(xs + (j - (len(runs) - 1) / 2) * width, taus, width, label=who)
        ax.bar_label(bars, labels=[f"{f['speedup']:.2f}x" if f.get("speedup") else "" for f in figs],
                     fontsize="x-small")
    sets = sorted({name for name, _ in groups})
    ax.set_xticks(xs, [cat for _, cat in groups], rotation=45, ha="right", fontsize="small")
    ax.axhline(1.0, color="black", lw=1, ls="--")
    ax.set_ylabel("τ (mean acceptance length); bar labels: speed-up")
    ax.set_title(f"{', '.join(sets)} per category")
    ax.legend(fontsize="small")


def _tick(run: dict) -> str:
    """A run's bar label: its head's name where heads are compared, then ``head_description`` one part a line."""
    lines = head_description(run).split(", ")
    head = run.get("head", OWN_HEAD)
    return "\n".join(lines if head == OWN_HEAD else [head, *lines])


@config_fields({})
class PlotSettings:
    """One plot_benchmark job: the figure of ``benchmark_json`` (benchmark.json) into ``out_png``. No config field:
    the figure shows what benchmark.json holds."""

    benchmark_json: str = job("inputs.benchmark")
    out_png: str = job("outputs.png")


def plot_benchmark(s: PlotSettings) -> dict:
    """Rule ``plot_benchmark``'s entry (``eagle3build.workflow.job.run_stage``): ``plot`` ``s.benchmark_json`` into
    ``s.out_png``. Returns what ``plot`` returns and raises what it raises."""
    return plot(s.benchmark_json, s.out_png)
