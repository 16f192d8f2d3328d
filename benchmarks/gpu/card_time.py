"""Card time per record (issue 65): what each job took on a card, from Snakemake's own log, and what a sequence of
records will take, from their plans.

    python benchmarks/gpu/card_time.py update OUT/logs/recipe.log --card h100 --run smollm2-8k --source "..."
    python benchmarks/gpu/card_time.py table            # the table of docs/card-time.md, from card_seconds.yaml

``card_seconds.yaml`` beside this file holds, per card, the hosts measured (lent machines of one card differ by 2x:
a 135M target's jobs are bound by the host's per-launch overhead, not by the card), each with its host probe where one
ran (``host_probe``) and, per run (the config's ``run``), one job's seconds of each rule as that host's logs measured
them (the median over the finished jobs of that rule, a job cut by a call's end and resumed counted whole), with its
source (command, commit, date). ``record.py`` probes the host it runs on (a few seconds), adds the table's seconds up
over the jobs a record plans (``sequence``: each record after the ones before it in the same call, whose jobs count
as made), each scaled by the probe's ratio to the measured host's (``scale``), and prints the estimate before it
starts; ``--dry-run`` prints the whole sequence and which records fit one lease. Each record then holds each rule's
estimate beside its measured seconds.

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
_WILDCARDS = re.compile(r"^\s+wildcards: (.*)$")
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
    opened = None  # the job whose block is being read (its wildcards line follows its jobid line)
    for line in log.splitlines():
        if m := _STAMP.match(line.strip()):
            stamp = last = time.mktime(time.strptime(m.group(1), "%a %b %d %H:%M:%S %Y"))
            rule = opened = None
            continue
        if line.startswith("Building DAG of jobs"):  # a new Snakemake call: ids restart
            _close(open_, last, jobs)
            continue
        if (m := _RULE.match(line)) and stamp is not None:
            rule = (m.group(1), stamp)
        elif (m := _JOBID.match(line)) and rule:
            opened = open_[m.group(1)] = {"rule": rule[0], "jobid": int(m.group(1)), "start": rule[1], "wildcards": ""}
            rule = None
        elif (m := _WILDCARDS.match(line)) and opened is not None:
            opened["wildcards"] = m.group(1).strip()
        elif (m := _DONE.match(line.strip())) and m.group(1) in open_ and stamp is not None:
            j = open_.pop(m.group(1))
            jobs.append({"rule": j["rule"], "jobid": j["jobid"], "wildcards": j["wildcards"],
                         "seconds": stamp - j["start"], "finished": True})
    _close(open_, last, jobs)
    return jobs


def _close(open_: dict, last: float | None, jobs: list[dict]) -> None:
    for j in open_.values():
        jobs.append({"rule": j["rule"], "jobid": j["jobid"], "wildcards": j["wildcards"],
                     "seconds": (last or j["start"]) - j["start"], "finished": False})
    open_.clear()


# Rules whose job cut by a call's end resumes where it stopped (training saves its state on SIGTERM); any other cut
# job starts again from nothing, so its cut part is the call's loss, not the job's cost.
RESUMES = ("train_draft", "train_draft_method")


def whole_jobs(jobs: Iterable[Mapping]) -> list[dict]:
    """``jobs`` (``job_seconds``) with each cut part of a resuming job (``RESUMES``) added to the same job (rule and
    wildcards) where a later call finished it: a training resumed from its saved state costs its cut part, its
    restart and the rest. A cut job never finished, or one that starts again, is left out."""
    out: list[dict] = []
    cut: dict[tuple, float] = {}
    for j in jobs:
        k = (j["rule"], j.get("wildcards", ""))
        if not j["finished"]:
            if j["rule"] in RESUMES:
                cut[k] = cut.get(k, 0.0) + j["seconds"]
            continue
        out.append({**j, "seconds": j["seconds"] + cut.pop(k, 0.0)})
    return out


def per_rule(jobs: Iterable[Mapping]) -> dict[str, float]:
    """One job's seconds of each rule: the median over the finished jobs of ``jobs`` (``job_seconds``), a job cut by
    a call's end counted with the call that finished it (``whole_jobs``)."""
    by: dict[str, list[float]] = {}
    for j in whole_jobs(jobs):
        if j["finished"]:
            by.setdefault(j["rule"], []).append(j["seconds"])
    return {r: float(statistics.median(v)) for r, v in sorted(by.items())}


def measured(jobs: Iterable[Mapping]) -> dict[str, float]:
    """The seconds of each rule over all its jobs of ``jobs`` (``job_seconds``; cut parts included, finished or not):
    what a record's build spent per rule, beside its estimate."""
    out: dict[str, float] = {}
    for j in jobs:
        out[j["rule"]] = out.get(j["rule"], 0.0) + j["seconds"]
    return out


def load_table(path: Path = TABLE) -> dict:
    """``card_seconds.yaml``: ``{card: [host, ...]}``, each host ``{"host": label, "probe": host_probe()'s figures or
    None (not probed), "runs": {run: {"engines": int (the benchmark's, where it ran), "rules": {rule: {"s": one job's
    seconds, "from": its source: command, commit, date, "bound": optional, as BOUND}}}}}``, oldest host first."""
    return yaml.safe_load(path.read_text()) or {}


# What bounds a rule's job on a lent machine, for scaling a measured host's seconds to this one (``scale``): ``cpu``,
# one host core (tokenising, reading tokens files, the compat report's probes); every other rule ``launch``: at the
# recipe's 135M target, capture, training and decoding are bound by the host's per-kernel launch cost (issue 70's
# profile: 76 ms of CPU against 37 ms of kernels a training step). A rule's ``bound`` in the table overrides this;
# ``gpu`` is not scaled.
BOUND = {"compat_report": "cpu", "prepare_data": "cpu", "build_vocab_map": "cpu", "materialize_target": "cpu",
         "prepare:kimi_target": "cpu"}
PROBE_KEYS = {"cpu": "cpu_s", "launch": "launch_us"}


def host_probe(device: str | None = None, launches: int = 2000, rounds: int = 5) -> dict:
    """This host's speed, in a few seconds: ``cpu_s``, the seconds of a fixed single-threaded Python task (strings,
    a dict, JSON: the work of tokenising and of a job's setup), the least of ``rounds``; ``launch_us``, the host's
    microseconds per small kernel launch (``launches`` in-place adds on a 1-element tensor queued on ``device``,
    then synchronised; the median of ``rounds``), the bound of a 135M target's decode and training step on a card;
    ``device``: ``cuda`` where torch sees one, else ``cpu`` (``device`` forces it).

    Raises:
        RuntimeError: ``device`` is ``cuda`` and torch has none.
    """
    import json

    import torch

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("host_probe: device cuda asked for, torch sees none")
    cpu = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        acc = 0
        for i in range(200_000):
            s = f"token {i} of the probe"
            acc += len(s.split()) + len(s.upper())
        json.loads(json.dumps({str(i): [i, str(i)] for i in range(50_000)}))
        cpu.append(time.perf_counter() - t0)
    x = torch.zeros(1, device=dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    per = []
    for r in range(rounds + 1):
        sync()
        t0 = time.perf_counter()
        for _ in range(launches):
            x.add_(1)
        sync()
        if r:  # the first round warms the allocator and the kernel cache
            per.append((time.perf_counter() - t0) / launches * 1e6)
    return {"cpu_s": round(min(cpu), 4), "launch_us": round(statistics.median(per), 3), "device": dev}


def scale(rule: str, measured_on: Mapping | None, here: Mapping | None, bound: str | None = None) -> float | None:
    """The factor from a job's seconds measured on a host with probe ``measured_on`` to this host (probe ``here``):
    the ratio of the probes' figure for what bounds ``rule`` (``bound``, else ``BOUND``, else ``launch``); 1.0 for a
    ``gpu``-bound rule; None where either host was not probed or the two probed different devices (unscaled)."""
    kind = bound or BOUND.get(rule.removesuffix("_method"), "launch")
    if kind == "gpu":
        return 1.0
    if not measured_on or not here or measured_on.get("device") != here.get("device"):
        return None
    key = PROBE_KEYS[kind]
    return here[key] / measured_on[key]


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


@dataclasses.dataclass(frozen=True)
class JobEstimate:
    """One job's estimate: ``seconds`` (scaled), the host whose measurement it is (``host``, its label), the
    ``factor`` applied (None: unscaled, a host not probed)."""

    seconds: float
    host: str
    factor: float | None


def job_estimate(rule: str, cfg: Mapping, hosts: list[Mapping], probe: Mapping | None = None) -> JobEstimate | None:
    """One job's seconds of ``rule`` for config ``cfg`` on a card whose measured hosts are ``hosts`` (``load_table()
    [card]``), on this host (``probe``: ``host_probe()``, or None). The measurement: the run's own, else that of the run
    named ``*`` (any run); a ``*_method`` rule (draft.compare_methods) as its stage's rule; the benchmark scaled by its
    engines (``benchmark_engines``) against the measured run's. Of the hosts that measured it, the one whose probe is
    nearest this host's (launch cost), scaled by ``scale``; where no probe compares, the latest host's, unscaled. None
    where nothing was measured."""
    import math

    base = rule.removesuffix("_method")
    found = []
    for h in hosts:
        for run in (cfg["run"], "*"):
            m = (h.get("runs") or {}).get(run) or {}
            r = (m.get("rules") or {}).get(rule, (m.get("rules") or {}).get(base))
            if r is not None:
                s = float(r["s"])
                if base == "benchmark" and m.get("engines"):
                    s = s * benchmark_engines(cfg) / m["engines"]
                found.append((h, s, scale(rule, h.get("probe"), probe, r.get("bound"))))
                break
    if not found:
        return None

    def distance(f) -> float:
        hp = f[0].get("probe")
        if not hp or not probe or hp.get("device") != probe.get("device"):
            return math.inf
        return abs(math.log(probe["launch_us"] / hp["launch_us"]))

    probed = [f for f in found if distance(f) < math.inf]
    h, s, k = min(probed, key=distance) if probed else found[-1]
    return JobEstimate(s * (k if k is not None else 1.0), h["host"], k)


@dataclasses.dataclass
class Estimate:
    """A record's estimate: the jobs it runs (``rule -> count``), its seconds (measured jobs and its ``prepare`` step),
    each rule's seconds (``per_rule``: all its jobs), the rules of the jobs nothing measured, the cumulative seconds of
    its sequence so far, and the hosts' scaling (``scaled``: factor per host label; None for an unscaled one)."""

    name: str
    jobs: dict[str, int]
    seconds: float
    unmeasured: list[str]
    cumulative: float = 0.0
    per_rule: dict[str, float] = dataclasses.field(default_factory=dict)
    scaled: dict[str, float | None] = dataclasses.field(default_factory=dict)

    def line(self, lease_s: float = LEASE_S) -> str:
        """One line: ``name: ~N s (M jobs: rule xK, ...)``, the rules nothing measured, how the measured hosts' seconds
        were scaled, the cumulative seconds and whether the sequence still fits one lease of ``lease_s`` seconds of
        Snakemake."""
        jobs = ", ".join(f"{r} x{n}" if n > 1 else r for r, n in self.jobs.items())
        out = f"{self.name}: ~{self.seconds:.0f} s ({sum(self.jobs.values())} jobs: {jobs})"
        if self.unmeasured:
            out += f"; unmeasured, counted 0: {', '.join(self.unmeasured)}"
        if self.scaled:
            out += "; " + ", ".join(f"{h} x{k:.2f}" if k is not None else f"{h} unscaled (not probed)"
                                    for h, k in self.scaled.items())
        fits = "fits one lease" if self.cumulative <= lease_s else "beyond one lease"
        return out + f"; {self.cumulative:.0f} s so far ({fits}, {lease_s:.0f} s)"


class Sequence:
    """Estimates of records made one after another on ``card`` (``h100``, ``h200``: records.card_slug) in
    ``workdir``: each record's plan runs the jobs its predecessors' did not make (``runs_again``), each job's seconds
    from the card's measured hosts scaled to this host's ``probe`` (``job_estimate``). ``table``: ``load_table()``
    unless given."""

    def __init__(self, workdir: Path, card: str, table: Mapping | None = None, probe: Mapping | None = None):
        self.workdir, self.card, self.probe = workdir, card, probe
        self.hosts = list((load_table() if table is None else table).get(card) or [])
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
        seconds, unmeasured, per_rule, scaled = 0.0, [], {}, {}
        for rule, n in [*counts.items(), *([(prepare, 1)] if prepare else [])]:
            e = job_estimate(rule, cfg, self.hosts, self.probe)
            if e is None:
                unmeasured.append(rule)
                continue
            per_rule[rule] = round(n * e.seconds, 1)
            seconds += n * e.seconds
            scaled.setdefault(e.host, e.factor)
        self.total += seconds
        return Estimate(name, counts, seconds, unmeasured, self.total, per_rule, scaled)


def markdown(table: Mapping) -> str:
    """The card-time table of docs/card-time.md: per card and host measured, a line naming them with the host's probe
    (``host_probe``; ``not probed``), then a row per run and rule: one job's seconds and the source."""
    out = []
    for card, hosts in table.items():
        for h in hosts:
            p = h.get("probe")
            probe = f"{p['launch_us']:g} µs a launch, {p['cpu_s']:g} s of CPU" if p else "not probed"
            out += [f"{card}, {h['host']} ({probe}):", "", "| run | rule | s per job | source |", "|---|---|---|---|"]
            for run, m in (h.get("runs") or {}).items():
                for rule, r in (m.get("rules") or {}).items():
                    eng = f" ({m['engines']} engines)" if rule == "benchmark" and m.get("engines") else ""
                    out.append(f"| {run} | {rule}{eng} | {r['s']:g} | {r['from']} |")
            out.append("")
    return "\n".join(out).rstrip("\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("update", help="set a host's seconds per job of a run from Snakemake logs")
    up.add_argument("logs", nargs="+", type=Path)
    up.add_argument("--card", required=True, help="h100, h200 (records.card_slug)")
    up.add_argument("--host", required=True, help="the host's label (a new label adds a host, the latest)")
    up.add_argument("--probe", type=Path, default=None,
                    help="a JSON file with the host's probe (host_probe's fields, or a record whose results hold "
                         "host.cpu_s, host.launch_us, host.device)")
    up.add_argument("--run", required=True, help="the config's run the logs built")
    up.add_argument("--source", required=True, help="command, commit, date")
    up.add_argument("--engines", type=int, default=None, help="the vLLM engines the benchmark job started")
    up.add_argument("--table", type=Path, default=TABLE)
    tb = sub.add_parser("table", help="print the card-time table (Markdown)")
    tb.add_argument("--table", type=Path, default=TABLE)
    pr = sub.add_parser("probe", help="print this host's probe (JSON)")
    pr.add_argument("--device", choices=("cuda", "cpu"), default=None)
    a = ap.parse_args(argv)
    if a.cmd == "probe":
        import json

        print(json.dumps(host_probe(a.device)))
        return 0
    table = load_table(a.table) if a.table.exists() else {}
    if a.cmd == "table":
        print(markdown(table))
        return 0
    rules = per_rule(j for f in a.logs for j in job_seconds(f.read_text(errors="replace")))
    if not rules:
        print(f"no finished job in {', '.join(map(str, a.logs))}", file=sys.stderr)
        return 1
    hosts = table.setdefault(a.card, [])
    host = next((h for h in hosts if h["host"] == a.host), None)
    if host is None:
        host = {"host": a.host, "probe": None, "runs": {}}
        hosts.append(host)
    if a.probe:
        host["probe"] = read_probe(a.probe)
    entry = host["runs"].setdefault(a.run, {})
    entry["rules"] = {**(entry.get("rules") or {}), **{r: {"s": round(s, 1), "from": a.source} for r, s in rules.items()}}
    if a.engines:
        entry["engines"] = a.engines
    head = "".join(line + "\n" for line in (a.table.read_text().splitlines() if a.table.exists() else [])
                   if line.startswith("#"))  # the file's leading comment stays
    a.table.write_text(head + yaml.safe_dump(table, sort_keys=False, width=120, allow_unicode=True))
    print(markdown({a.card: [host]}))
    return 0


def read_probe(path: Path) -> dict:
    """A host's probe from ``path``: ``host_probe``'s JSON, or a record whose results hold ``host.cpu_s``,
    ``host.launch_us`` and ``host.device`` (record.py writes them).

    Raises:
        ValueError: the file holds neither (the message names it).
    """
    import json

    d = json.loads(path.read_text())
    r = d.get("results", {})
    if "host.launch_us" in r:
        d = {"cpu_s": r["host.cpu_s"], "launch_us": r["host.launch_us"], "device": r["host.device"]}
    if not all(k in d for k in ("cpu_s", "launch_us", "device")):
        raise ValueError(f"{path}: no host probe (cpu_s, launch_us, device; or a record's host.* results)")
    return {k: d[k] for k in ("cpu_s", "launch_us", "device")}


if __name__ == "__main__":
    sys.exit(main())
