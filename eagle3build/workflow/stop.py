"""A stop from outside (issue 71): SIGINT or SIGTERM sent to the Snakemake process alone (``kill PID``, ``timeout``, a
batch scheduler or a service manager) keeps every finished job and loses no training step past the one in flight.

What Snakemake 9.27.1 does by itself (snakemake/scheduling/job_scheduler.py; tests/test_stop.py shows it):

- SIGINT raises ``KeyboardInterrupt`` in its scheduler loop (``schedule``): it waits for the running jobs
  (``executor.cancel``: the local executor's thread pool is shut down with ``wait``) but never post-processes them, so
  the outputs of a job that finished after the signal keep their ``.snakemake/incomplete`` marks and the next run
  forces the job again (``--rerun-incomplete``, in the repository's profiles): a training that ran to its end, and
  removed its resumable state as a finished one does, trains again from step 0;
- SIGTERM calls ``exit_gracefully``: no new job is started, each running one is post-processed as it ends (a
  finished one is accepted, a failed one has its outputs removed), then it exits 1; but the jobs are told nothing
  and run to their end (a whole training).

Neither reaches the jobs, which a terminal's Ctrl-C does (SIGINT to the foreground process group). ``forward_signals``
(called from the ``onstart`` of rules/common.smk, where the jobs run in this process's executor) handles both signals
alike: it sends SIGTERM to the running jobs (``job_processes``: each job's own process, below the shell that runs it)
and takes Snakemake's own graceful path (``JobScheduler.exit_gracefully``). Each job stops as SIGTERM tells it to: a
training saves its state after the step in flight and fails with ``TrainingStopped`` (the rerun resumes there), a
hosted capture job asks its host to drop its shard (``host.run_job``: a shard finished by then is kept, and the job
succeeds), a training on several ranks passes it to them (``train.ddp.launch``), any other job ends at once (its
outputs are written to a temporary and renamed, so none is half-written), and a job whose outputs are all in place
ignores it (``job.finish_or_end``: it is about to exit 0). A job that finishes anyway is accepted as any finished job:
the next run plans it no more. SIGTERM is what a job is told: the signal a cluster's time limit sends each job too,
which training answers by saving its state (``train.trainer.save_on_term``). After the stop (``onerror``),
``mark_unrun`` marks the present outputs of the jobs planned and not started incomplete.

Not chosen (issue 71's other candidates):

- keeping a finished training's state until its outputs are accepted: the forced rerun would still start the job, load
  the target's files and the shards and write every output again, for training alone (a capture shard or a benchmark
  finished after SIGINT would still be made again), and states would pile up where no run accepts them;
- checking the outputs' provenance on a forced rerun: Snakemake removes a job's outputs before it starts it
  (snakemake/jobs.py, ``Job.prepare``: ``remove_existing_output``), so the job never sees them;
- telling the jobs only, with Snakemake's own SIGINT kept: a job that ends after it is still never recorded.

Limits: a second SIGINT stops Snakemake at once (its own handler: the running jobs are not recorded, a finished one is
made again), and SIGKILL stops nothing but Snakemake (its jobs run on; `--unlock`, then the next run); under a cluster
executor nothing is installed (Snakemake's SIGTERM waits for the cluster's jobs, its SIGINT cancels them, and the
cluster sends them SIGTERM); a training with ``train.checkpoint_every: 0`` keeps no state and starts over; a job that
does not handle SIGTERM ends at once (its temporary is cleared by the next writer, ``atomic.clear_stale_temporaries``).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "fish"})  # a script job's `sh -c`, not the job itself
STOPPED_BY: set[int] = set()  # the signals ``handler`` took in this process


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(command name, parent pid, process group)`` of ``pid`` (Linux ``/proc/<pid>/stat``), None where gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat[stat.rindex(")") + 2:].split()
    return stat[stat.index("(") + 1:stat.rindex(")")], int(rest[1]), int(rest[2])


def job_processes(root: int | None = None) -> list[int]:
    """The running jobs' own processes under ``root`` (default: this process, Snakemake's): each first process below it
    that is not a shell (a script job's ``sh -c``: a shell waiting on its job would end at once and leave the job
    behind), in its process group (what a terminal's Ctrl-C reaches; a job host, a vLLM engine lead groups of their own
    and watch their job). What a job started is the job's to tell (a training's torchrun: ``train.ddp.launch``).
    Empty where ``/proc`` cannot tell (not Linux)."""
    root = os.getpid() if root is None else root
    me = _stat(root)
    if me is None:
        return []
    children: dict[int, list[int]] = {}
    stats = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                stats[int(entry.name)] = st
                children.setdefault(st[1], []).append(int(entry.name))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if stats[pid][2] != me[2]:
            continue
        if stats[pid][0] not in SHELLS:
            out.append(pid)
        else:
            todo.extend(children.get(pid, []))
    return sorted(out)


def tell_jobs(sig: int = signal.SIGTERM, root: int | None = None) -> list[int]:
    """Send ``sig`` to each of ``job_processes(root)``; return the pids it reached."""
    reached = []
    for pid in job_processes(root):
        try:
            os.kill(pid, sig)
            reached.append(pid)
        except OSError:
            pass  # ended meanwhile
    return reached


def handler(graceful: Callable[[], Any], log: Callable[[str], Any]) -> Callable[[int, Any], None]:
    """A signal handler for the Snakemake process: SIGTERM to the running jobs (``tell_jobs``), then ``graceful``
    (Snakemake's ``exit_gracefully``) on a thread of its own (it takes the scheduler's lock, which the interrupted
    main thread may hold); a second SIGINT raises ``KeyboardInterrupt`` (Snakemake's own immediate stop). ``log``: a
    line for the terminal."""
    def on_signal(signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and signum in STOPPED_BY:
            raise KeyboardInterrupt
        STOPPED_BY.add(signum)
        reached = tell_jobs()
        log(f"{signal.Signals(signum).name}: SIGTERM sent to the running jobs (pids {reached or 'none'}): a training "
            "saves its state after the step in flight, a finished job is kept; waiting for them"
            + (" (SIGINT again stops at once)" if signum == signal.SIGINT else ""))
        threading.Thread(target=graceful, name="eagle3build-stop", daemon=True).start()

    return on_signal


def forward_signals(workflow: Any, log: Callable[[str], Any]) -> bool:
    """Install ``handler`` for SIGINT and SIGTERM in the Snakemake process of ``workflow`` (its ``onstart``: the
    scheduler exists then), where it runs the jobs (``local_exec``: a cluster's jobs are stopped by the cluster,
    and Snakemake's SIGINT cancels them) and on the main thread. Returns whether it did."""
    main_thread = threading.current_thread() is threading.main_thread()
    if not (workflow.is_main_process and workflow.local_exec and main_thread):
        return False
    on_signal = handler(workflow.scheduler.exit_gracefully, log)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return True


def mark_unrun(workflow: Any, log: Callable[[str], Any]) -> list[str]:
    """After a stop (the Snakefile's ``onerror``, where ``handler`` took a signal): mark the present outputs of each job
    this run planned and did not run (the scheduler's ``remaining_jobs``) incomplete, as Snakemake marks a job's
    outputs when it starts it (``persistence.started``), so that the next run (``--rerun-incomplete``, in the
    repository's profiles) makes them again. Without it, a job planned only because the job before it was to run
    again (``train_draft`` after a changed setting) keeps its old outputs, made from files that job removed when it
    started: Snakemake then plans nothing for them, nor for the stopped training (a deleted intermediate,
    docs/staleness.md). Returns the files marked (none where no signal came)."""
    if not STOPPED_BY:
        return []
    marked = []
    for job in workflow.scheduler.remaining_jobs:
        present = [str(f) for f in job.output if os.path.exists(f)]
        if present:
            workflow.persistence.started(job)
            marked += present
    if marked:
        log(f"planned before the stop and not run, marked incomplete (the next run makes them again): {len(marked)} "
            f"file(s): {', '.join(marked[:3])}{', ...' if len(marked) > 3 else ''}")
    return marked
