"""Card time per record (issue 65): what each job took on a card, from Snakemake's own log, and what a sequence of
records will take, from their plans.

    python benchmarks/gpu/card_time.py update OUT/logs/recipe.log --card h100 --run smollm2-8k --source "..."
    python benchmarks/gpu/card_time.py table            # the table of docs/gpus.md, from card_seconds.yaml

``card_seconds.yaml`` beside this file holds, per card and run (the config's ``run``), one job's seconds of each rule
as the latest logs measured them (the median over the log's finished jobs of that rule), with its source (command,
commit, date). ``record.py`` adds them up over the jobs a record plans (``sequence``: each record after the ones
before it in the same call, whose jobs count as made) and prints the estimate before it starts; ``--dry-run`` prints
the whole sequence and which records fit one lease.

A job is the same job as one an earlier record planned where its rule, wildcards and rerun-trigger params are the same
(what Snakemake compares: tests/plan_params.py) and none of the jobs it reads from runs again (their outputs would be
newer); every other job of a record's plan runs. The benchmark job's seconds are per vLLM engine it starts
(``benchmark_engines``): a run measured with 2 engines, estimated for a record serving 3 heads at 2 ks.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TABLE = HERE / "card_seconds.yaml"
LEASE_S = 25 * 60  # Snakemake's seconds in one lease: a machine is held 30 minutes, its start and the carry ~3-5 of them

_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
_RULE = re.compile(r"^(?:local)?(?:checkpoint|rule) (\S+):$")
_JOBID = re.compile(r"^\s+jobid: (\d+)$")
_DONE = re.compile(r"^Finished jobid: (\d+) \(Rule: (\S+)\)$")


def job_seconds(log: str) -> list[dict]:
    """The jobs of a Snakemake log (its main output, as ``record.py`` keeps it in ``OUT/logs/<name>.log``), in order:
    ``{"rule", "jobid", "seconds", "finished"}``. A job's seconds run from the timestamp before its ``rule X:`` block to
    the one before its ``Finished jobid`` line (Snakemake's 1 s resolution, ``time.asctime``); one never finished (the
    call ended first, a failure) runs to the log's last timestamp and is marked ``finished: False``. Several Snakemake
    calls appended to one log are read one after another (job ids restart in each)."""
    jobs: list[dict] = []
    open_: dict[str, dict] = {}
    stamp = last = None
    rule = None
    for line in log.splitlines():
        if m := _STAMP.match(line.strip()):
            stamp = last = time.mktime(time.strptime(m.group(1), "%a %b %d %H:%M:%S %Y"))
            rule = None
            continue
        if line.startswith("Building DAG of jobs"):  # a new Snakemake call: ids restart
            _close(open_, last, jobs)
            continue
        if (m := _RULE.match(line)) and stamp is not None:
            rule = (m.group(1), stamp)
        elif (m := _JOBID.match(line)) and rule:
            open_[m.group(1)] = {"rule": rule[0], "jobid": int(m.group(1)), "start": rule[1]}
            rule = None
        elif (m := _DONE.match(line.strip())) and m.group(1) in open_ and stamp is not None:
            j = open_.pop(m.group(1))
            jobs.append({"rule": j["rule"], "jobid": j["jobid"], "seconds": stamp - j["start"], "finished": True})
    _close(open_, last, jobs)
    return jobs


def _close(open_: dict, last: float | None, jobs: list[dict]) -> None:
    for j in open_.values():
        jobs.append({"rule": j["rule"], "jobid": j["jobid"], "seconds": (last or j["start"]) - j["start"],
                     "finished": False})
    open_.clear()


def per_rule(jobs: Iterable[Mapping]) -> dict[str, float]:
    """One job's seconds of each rule: the median over the finished jobs of ``jobs`` (``job_seconds``)."""
    by: dict[str, list[float]] = {}
    for j in jobs:
        if j["finished"]:
            by.setdefault(j["rule"], []).append(j["seconds"])
    return {r: float(statistics.median(v)) for r, v in sorted(by.items())}


def load_table(path: Path = TABLE) -> dict:
    """``card_seconds.yaml``: ``{card: {run: {"engines": int (the benchmark's, where it ran), "rules": {rule:
    {"s": one job's seconds, "from": its source: command, commit, date}}}}}``."""
    return yaml.safe_load(path.read_text()) or {}


@dataclasses.dataclass(frozen=True)
class Job:
    """One job of a plan: ``rule``, ``key`` (rule, wildcards and rerun-trigger params: the same job in another record's
    plan), ``deps`` (the keys of the jobs it reads from)."""

    rule: str
    key: tuple
    deps: tuple


def plan(configfiles: Iterable[str | Path], targets: Iterable[str], workdir: Path) -> tuple[dict, list[Job]]:
    """The merged config and every job of the plan of ``targets`` under ``configfiles`` (the repository's Snakefile,
    Snakemake's API as tests/plan_params.py uses it; nothing is built or read from ``workdir``'s results: each job is
    planned as if nothing were made).

    Raises:
        snakemake's WorkflowError and the like: the config does not plan (a missing input, a key the schema refuses).
    """
    import os

    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    cwd = os.getcwd()
    try:
        with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
            wf = api.workflow(resource_settings=ResourceSettings(cores=16), snakefile=REPO / "Snakefile",
                              workdir=Path(workdir), config_settings=ConfigSettings(
                                  configfiles=[Path(f) if Path(f).is_absolute() else REPO / f for f in configfiles]))
            workflow = wf.dag(dag_settings=DAGSettings(targets=set(targets))).workflow_api._workflow
            workflow._prepare_dag(forceall=True, ignore_incomplete=True, lock_warn_only=True, nolock=True)
            workflow._build_dag()
            dag = workflow.dag

            def key(job) -> tuple:
                return (job.rule.name, tuple(sorted(job.wildcards_dict.items())),
                        tuple(workflow.persistence._params(job)))

            jobs = [Job(j.rule.name, key(j), tuple(sorted(key(d) for d in dag.dependencies[j]))) for j in dag.jobs]
            return dict(workflow.config), jobs
    finally:
        os.chdir(cwd)  # the API changes into the workdir


def runs_again(jobs: list[Job], made: set) -> list[Job]:
    """The jobs of ``jobs`` (one plan) that run where the jobs ``made`` (keys) are made: a job not among them, or one
    reading from a job that runs again."""
    by_key = {j.key: j for j in jobs}
    memo: dict[tuple, bool] = {}

    def runs(k: tuple) -> bool:
        if k not in memo:
            memo[k] = k not in made or any(runs(d) for d in by_key[k].deps if d in by_key)
        return memo[k]

    return [j for j in jobs if runs(j.key)]


def benchmark_engines(cfg: Mapping) -> int:
    """The vLLM engines a benchmark job of config ``cfg`` starts: the target alone, each head served (the run's own,
    ``draft.compare_methods``, ``benchmark.compare_heads``) at each k of ``benchmark.ks``, and where
    ``benchmark.k_schedule_concurrencies`` is set, the schedule's sweep (each k and k 0) and its schedule
    (serve/k_schedule.py)."""
    b = cfg["benchmark"]
    heads = 1 + len(cfg["draft"].get("compare_methods") or []) + len(b.get("compare_heads") or [])
    schedule = len(b["ks"]) + 2 if b.get("k_schedule_concurrencies") else 0
    return 1 + heads * len(b["ks"]) + schedule


def job_estimate(rule: str, cfg: Mapping, card_table: Mapping) -> float | None:
    """One job's seconds of ``rule`` for config ``cfg`` on the card of ``card_table`` (``load_table()[card]``): the
    run's own measurement, else that of the run named ``*`` (any run); a ``*_method`` rule (draft.compare_methods) as
    its stage's rule; the benchmark scaled by its engines (``benchmark_engines``) against the measured run's. None
    where nothing was measured."""
    base = rule.removesuffix("_method")
    for run in (cfg["run"], "*"):
        m = card_table.get(run) or {}
        r = (m.get("rules") or {}).get(rule, (m.get("rules") or {}).get(base))
        if r is not None:
            if base == "benchmark" and m.get("engines"):
                return r["s"] * benchmark_engines(cfg) / m["engines"]
            return float(r["s"])
    return None


@dataclasses.dataclass
class Estimate:
    """A record's estimate: the jobs it runs (``rule -> count``), its seconds (measured jobs and its ``prepare`` step),
    the rules of the jobs nothing measured, and the cumulative seconds of its sequence so far."""

    name: str
    jobs: dict[str, int]
    seconds: float
    unmeasured: list[str]
    cumulative: float = 0.0

    def line(self, lease_s: float = LEASE_S) -> str:
        """One line: ``name: ~N s (M jobs: rule xK, ...)``, the rules nothing measured, the cumulative seconds and
        whether the sequence still fits one lease of ``lease_s`` seconds of Snakemake."""
        jobs = ", ".join(f"{r} x{n}" if n > 1 else r for r, n in self.jobs.items())
        out = f"{self.name}: ~{self.seconds:.0f} s ({sum(self.jobs.values())} jobs: {jobs})"
        if self.unmeasured:
            out += f"; unmeasured, counted 0: {', '.join(self.unmeasured)}"
        fits = "fits one lease" if self.cumulative <= lease_s else "beyond one lease"
        return out + f"; {self.cumulative:.0f} s so far ({fits}, {lease_s:.0f} s)"


class Sequence:
    """Estimates of records made one after another on ``card`` (``h100``, ``h200``: records.card_slug) in
    ``workdir``: each record's plan runs the jobs its predecessors' did not make (``runs_again``). ``table``:
    ``load_table()`` unless given."""

    def __init__(self, workdir: Path, card: str, table: Mapping | None = None):
        self.workdir, self.card = workdir, card
        self.card_table = (load_table() if table is None else table).get(card) or {}
        self.made: set = set()
        self.total = 0.0

    def add(self, name: str, configfiles: Iterable[str], targets: list[str], prepare: str | None = None) -> Estimate:
        """The estimate of record ``name`` (its ``configfiles``, Snakemake ``targets`` and ``prepare`` step's label,
        timed in the table as a rule of that name) after the records added before it. A plan Snakemake refuses (the
        ``peer`` record's head does not exist before its prepare step) is counted as unmeasured, with its error."""
        try:
            cfg, jobs = plan(configfiles, targets, self.workdir)
        except Exception as e:  # noqa: BLE001 - any planning error is reported in the estimate
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return Estimate(name, {}, 0.0, [f"the plan ({type(e).__name__}: {first})"], self.total)
        todo = runs_again(jobs, self.made)
        self.made |= {j.key for j in jobs}
        counts: dict[str, int] = {}
        for j in todo:
            counts[j.rule] = counts.get(j.rule, 0) + 1
        seconds, unmeasured = 0.0, []
        for rule, n in [*counts.items(), *([(prepare, 1)] if prepare else [])]:
            s = job_estimate(rule, cfg, self.card_table)
            if s is None:
                unmeasured.append(rule)
            else:
                seconds += n * s
        self.total += seconds
        return Estimate(name, counts, seconds, unmeasured, self.total)


def markdown(table: Mapping) -> str:
    """The card-time table of docs/gpus.md: a row per card, run and rule, one job's seconds and the source."""
    rows = ["| card | run | rule | s per job | source |", "|---|---|---|---|---|"]
    for card, runs in table.items():
        for run, m in runs.items():
            for rule, r in (m.get("rules") or {}).items():
                eng = f" ({m['engines']} engines)" if rule == "benchmark" and m.get("engines") else ""
                rows.append(f"| {card} | {run} | {rule}{eng} | {r['s']:g} | {r['from']} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("update", help="set a run's seconds per job from Snakemake logs")
    up.add_argument("logs", nargs="+", type=Path)
    up.add_argument("--card", required=True, help="h100, h200 (records.card_slug)")
    up.add_argument("--run", required=True, help="the config's run the logs built")
    up.add_argument("--source", required=True, help="command, commit, date")
    up.add_argument("--engines", type=int, default=None, help="the vLLM engines the benchmark job started")
    up.add_argument("--table", type=Path, default=TABLE)
    tb = sub.add_parser("table", help="print the card-time table (Markdown)")
    tb.add_argument("--table", type=Path, default=TABLE)
    a = ap.parse_args(argv)
    table = load_table(a.table) if a.table.exists() else {}
    if a.cmd == "table":
        print(markdown(table))
        return 0
    rules = per_rule(j for f in a.logs for j in job_seconds(f.read_text(errors="replace")))
    if not rules:
        print(f"no finished job in {', '.join(map(str, a.logs))}", file=sys.stderr)
        return 1
    entry = table.setdefault(a.card, {}).setdefault(a.run, {})
    entry["rules"] = {**(entry.get("rules") or {}), **{r: {"s": round(s, 1), "from": a.source} for r, s in rules.items()}}
    if a.engines:
        entry["engines"] = a.engines
    a.table.write_text(yaml.safe_dump(table, sort_keys=False, width=120))
    print(markdown({a.card: {a.run: entry}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
