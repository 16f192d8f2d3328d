"""The one driver for GPU records (issue 51): each record made by name, resuming across device calls.

    python benchmarks/gpu/record.py NAME [NAME ...] --seconds 560 --out "$OUT"

Each NAME is a Snakemake build of the project's own rules under the recipe or a record's overlay (the overlays
beside this file), run with ``--cores 16 --resources gpu=1 --scheduler greedy --rerun-incomplete`` until its
target exists; then the record (``eagle3build.records``: command, commit, versions, card, date, the quoted
figures) is written to ``OUT/records/<name>_<card>.json`` and the run's small result files and logs to
``OUT/<name>.tgz``. The records go to ``benchmarks/records/`` in the repository; the archives stay out of it
(git history or the record's ``archive`` keeps what a reader needs).

Resuming: a call cut by ``--seconds`` stops Snakemake 25 s before its deadline (TERM, KILL 10 s later), so the
next call, on the same machine, resumes it (``--rerun-incomplete``; training resumes from its saved state where
the config sets ``train.checkpoint_every``). A record already written on this machine (``results/records/``) is
not made again. Records in order: names run one after another within the seconds given.

Records (``RECORDS``): ``recipe`` (examples/configs/smollm2-8k-gpu.yaml, the README's GPU line: k 3, one request in
flight), ``recipe-k5``, ``recipe-c16`` (16 in flight, 64 prompts a set), ``kschedule`` (the recipe head's k
per batch size at 1, 4, 16 and 32 in flight), ``methods`` (the recipe's P-EAGLE and DFlash heads beside its
EAGLE-3 head, one benchmark job), ``peer`` (speculators' own training entry point on the recipe's shards,
benchmarks/peer_route.py, then one benchmark of both heads), ``dense`` (the bundled target with its pre-flight
bound), ``dense-methods`` (the same build with P-EAGLE and DFlash heads from its shards, served beside its
EAGLE-3 head in its one benchmark job, the pre-flight's comparison included), ``dense-kschedule``, ``kimi``,
``kimi-mla-preflight`` (that target's pre-flight with the MLA draft layer beside the llama one, no benchmark),
``kimi-online`` (the Kimi-K2.5-shaped target, offline and online capture), ``kimi-c16``.

The commit is read from ``COMMIT`` beside this file: ``git archive`` writes HEAD's hash into it
(``.gitattributes``: export-subst), which is how the project travels to a lent machine; in a checkout it is
``git rev-parse HEAD``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Callable

from eagle3build import records
from eagle3build.benchkit import load_config

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RECIPE = "examples/configs/smollm2-8k-gpu.yaml"
GPU = "benchmarks/gpu"
MARGIN_S = 25  # Snakemake is stopped this long before the deadline, so the call still packs its results
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
       "HF_HUB_OFFLINE": "1"}
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--cores", "16", "--resources", "gpu=1", "--scheduler", "greedy",
             "--rerun-incomplete"]
KIMI_TARGET = "resources/targets/kimi-k25-card"


@dataclasses.dataclass(frozen=True)
class Record:
    """How one record is made: ``configfiles`` (``--configfile``, in order), the extra Snakemake ``targets``
    besides ``results/<run>/benchmark.json`` (none where ``benchmark`` is False: the record reads
    ``results/<run>/preflight.json``), and a ``prepare`` step run first (returns False where it ran out of time)."""

    configfiles: tuple[str, ...]
    targets: tuple[str, ...] = ()
    prepare: Callable[["Call", "Record"], bool] | None = None
    benchmark: bool = True  # False: a pre-flight record, its figures from results/<run>/preflight.json alone


def _kimi_target(call: "Call", rec: Record) -> bool:
    """The Kimi-K2.5-shaped checkpoint (examples/targets/kimi_k25_shaped.py, preset card, seed 0), once."""
    if (REPO / KIMI_TARGET / "config.json").exists():
        return True
    return call.run([sys.executable, "examples/targets/kimi_k25_shaped.py", KIMI_TARGET, "--preset", "card"],
                    "kimi_target") == 0


PEER_DIR = "results/heads/speculators"


def _peer(call: "Call", rec: Record) -> bool:
    """The recipe's shards (its build up to capture), then speculators' own route on them (benchmarks/peer_route.py)
    into ``results/heads/speculators``, the head that ``compare_peer.yaml`` lists."""
    if (REPO / PEER_DIR / "head" / "config.json").exists():
        return True
    base = rec.configfiles[:1]
    if call.snakemake(base, ["--until", "capture_hidden_states"], "peer_capture") != 0:
        return False
    return call.run([sys.executable, "benchmarks/peer_route.py", "--configfile", *base, "--out", PEER_DIR],
                    "peer_route") == 0


RECORDS: dict[str, Record] = {
    "recipe": Record((RECIPE,)),
    "recipe-k5": Record((RECIPE, f"{GPU}/ks5.yaml")),
    "recipe-c16": Record((RECIPE, f"{GPU}/c16_64.yaml")),
    "kschedule": Record((RECIPE, f"{GPU}/kschedule.yaml")),
    "methods": Record((RECIPE, f"{GPU}/compare_methods.yaml")),
    "peer": Record((RECIPE, f"{GPU}/compare_peer.yaml"), prepare=_peer),
    "dense": Record((f"{GPU}/dense_preflight.yaml",), targets=("results/smollm2-preflight/preflight.json",)),
    "dense-methods": Record((f"{GPU}/dense_preflight.yaml", f"{GPU}/compare_methods.yaml"),
                            targets=("results/smollm2-preflight/preflight.json",)),
    "dense-kschedule": Record((f"{GPU}/dense_preflight.yaml", f"{GPU}/kschedule.yaml")),
    "kimi": Record((f"{GPU}/kimi_k25_card.yaml",), targets=("results/kimi-k25-card/preflight.json",),
                   prepare=_kimi_target),
    "kimi-mla-preflight": Record((f"{GPU}/kimi_k25_card.yaml", f"{GPU}/mla.yaml"),
                                 targets=("results/kimi-k25-card/preflight.json",), prepare=_kimi_target,
                                 benchmark=False),
    "kimi-online": Record((f"{GPU}/kimi_k25_card.yaml", f"{GPU}/kimi_k25_card_online.yaml"), prepare=_kimi_target),
    "kimi-c16": Record((f"{GPU}/kimi_k25_card.yaml", f"{GPU}/c16.yaml"), prepare=_kimi_target),
}


def run_name(configfiles: tuple[str, ...]) -> str:
    """The config's ``run`` after merging ``configfiles`` over config.yaml as the workflow does, validated
    (``eagle3build.benchkit.load_config``: a typo'd key stops here, before any device time is spent).

    Raises:
        ValueError: the merged config fails the schema (the message names the files and the field).
    """
    return load_config([f if Path(f).is_absolute() else REPO / f for f in configfiles])["run"]


def commit() -> str:
    """HEAD's hash: from ``COMMIT`` (written by ``git archive``'s export-subst), else ``git rev-parse HEAD``.

    Raises:
        RuntimeError: neither gives a hash.
    """
    text = (HERE / "COMMIT").read_text().strip()
    if not text.startswith("$Format"):
        return text
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(f"{HERE / 'COMMIT'}: not substituted and no git checkout: {e}") from None


class Call:
    """One device call's budget: commands run with what is left of ``seconds`` less ``MARGIN_S``; their output
    goes to ``out/logs/<label>.log``."""

    def __init__(self, seconds: float, out: Path):
        self.deadline = time.monotonic() + seconds
        self.out = out
        (out / "logs").mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.monotonic() - MARGIN_S

    def run(self, cmd: list[str], label: str) -> int:
        """``cmd`` in the repository with ``ENV``; TERM at the budget, KILL 10 s later. Returns its exit status
        (124 when stopped by the budget, as ``timeout``)."""
        left = self.left()
        if left < 30:
            print(f"{label}: {left:.0f} s left, not started", flush=True)
            return 124
        start = time.monotonic()
        with open(self.out / "logs" / f"{label}.log", "a") as log:
            log.write(f"$ {shlex.join(cmd)}\n")
            log.flush()
            p = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **ENV}, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            try:
                rc = p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                rc = 124
        print(f"{label}: rc {rc} after {time.monotonic() - start:.0f} s", flush=True)
        return rc

    def snakemake(self, configfiles: tuple[str, ...], args: list[str], label: str) -> int:
        """Unlock (a call cut from outside leaves Snakemake's lock), then build with ``configfiles``."""
        cfg = ["--configfile", *configfiles]
        subprocess.run([*SNAKEMAKE[:3], "--unlock", *cfg], cwd=REPO, env={**os.environ, **ENV},
                       capture_output=True)
        return self.run([*SNAKEMAKE, *cfg, *args], label)


def result_files(run: str) -> list[Path]:
    """The run's small result files (JSON, the compat report, Snakemake's job benchmarks): what a record reads and
    what its archive keeps."""
    r = REPO / "results" / run
    pats = ["*.json", "*.md", "checkpoint/*.json", "head/*.json", "data/data_report.json", "vocab/vocab.json",
            "methods/*/checkpoint/*.json", "methods/*/head/*.json"]
    files = [p for pat in pats for p in sorted(r.glob(pat))]
    return files + sorted((REPO / "benchmarks" / run).glob("**/*.tsv")) + sorted((REPO / "logs" / run).glob("**/*.log"))


def results_of(run: str, benchmark: bool = True) -> dict:
    """The record's figures from ``results/<run>/``: the benchmark and the training metrics; without a benchmark,
    the pre-flight bound's whole output flattened (``records.flatten``)."""
    r = REPO / "results" / run
    if not benchmark:
        pre = json.loads((r / "preflight.json").read_text())
        return records.flatten({k: v for k, v in pre.items() if k not in ("versions", "hardware", "schema")})
    bench = json.loads((r / "benchmark.json").read_text())
    out = records.summarise_benchmark(bench)
    metrics = r / "checkpoint" / "metrics.json"
    if metrics.exists():
        out.update(records.summarise_metrics(json.loads(metrics.read_text())))
    return out


def plan_targets(rec: Record) -> list[str]:
    """What Snakemake builds for ``rec``: the run's benchmark.json (where it has one) and its extra targets."""
    return [*([f"results/{run_name(rec.configfiles)}/benchmark.json"] if rec.benchmark else []), *rec.targets]


def make(name: str, call: Call, state: Path) -> bool:
    """Build record ``name`` and write it; True once it is written (now or on an earlier call)."""
    done = state / f"{name}.json"
    if done.exists():
        print(f"{name}: recorded on this machine already ({done})", flush=True)
        return True
    rec = RECORDS[name]
    if rec.prepare and not rec.prepare(call, rec):
        return False
    run = run_name(rec.configfiles)
    targets = plan_targets(rec)
    if call.snakemake(rec.configfiles, targets, name) != 0:
        return False
    bench = json.loads((REPO / "results" / run / ("benchmark.json" if rec.benchmark else "preflight.json")).read_text())
    argv = f"python {GPU}/record.py {name} --seconds SECONDS --out OUT"
    record = records.make_record(name, command=argv, commit=commit(), versions=bench["versions"],
                                 hardware=bench["hardware"], results=results_of(run, rec.benchmark),
                                 configfiles=list(rec.configfiles), targets=targets)
    path = records.write_record(call.out / "records", record)
    state.mkdir(parents=True, exist_ok=True)
    done.write_text(json.dumps(record, indent=2))
    with tarfile.open(call.out / f"{name}.tgz", "w:gz") as tar:
        for f in result_files(run):
            tar.add(f, arcname=str(f.relative_to(REPO)))
    print(f"{name}: record {path.name}", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="+", choices=sorted(RECORDS), metavar="NAME", help=", ".join(RECORDS))
    ap.add_argument("--seconds", type=float, required=True, help="this call's budget, seconds")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "records-out")),
                    help="where records, archives and logs go (default $OUT)")
    ap.add_argument("--dry-run", action="store_true", help="plan each record (snakemake -n) and make none")
    ap.add_argument("--overlay", action="append", default=[], metavar="YAML",
                    help="a config file applied after each record's own (a CPU rehearsal at tiny size: the smoke test)")
    a = ap.parse_args(argv)
    call = Call(a.seconds, a.out)
    if a.overlay:
        for n in a.names:
            RECORDS[n] = dataclasses.replace(RECORDS[n], configfiles=(*RECORDS[n].configfiles, *a.overlay))
    if a.dry_run:
        rc = 0
        for n in a.names:
            rc = max(rc, call.snakemake(RECORDS[n].configfiles, ["-n", *plan_targets(RECORDS[n])], f"{n}_plan"))
            log = (a.out / "logs" / f"{n}_plan.log").read_text()
            at = log.rfind("Job stats:")  # Snakemake prints the table before the jobs and again after them
            stats = log[at:log.find("Reasons:", at)] if at >= 0 else log[-2000:]
            print(f"{n} (plan in {a.out / 'logs' / f'{n}_plan.log'}):\n{stats.rstrip()}", flush=True)
        return rc
    state = REPO / "results" / "records"
    for name in a.names:
        if not make(name, call, state):
            print(f"{name}: not finished in this call; run the same command again to resume", flush=True)
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
