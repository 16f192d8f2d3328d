"""What a build ends with (issue 67): its result on one screen, or each failed job's own error line.

The Snakefile prints ``result_screen`` when a build succeeds (Snakemake's ``onsuccess``) and when Snakemake has nothing
to do (its "Nothing to be done" line: ``onsuccess`` is not called then), and ``failure_screen`` when a job failed
(``onerror``), after Snakemake's own lines. Both read only files: the run's ``benchmark.json`` (serve/benchmark.py),
``head/head_meta.json``, ``serve/serving.json``, ``data/data_report.json`` (a line where prepare_data dropped or cut
anything: issue 71) and each failed job's log.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from ..draft.methods import DEFAULT_LAYER, DEFAULT_METHOD
from ..formats.benchmark_runs import OWN_HEAD, benchmark_runs, head_description


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tau(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def _run_lines(r: dict) -> list[str]:
    """One served run (a head at one k): overall, then each set."""
    ok = {True: "lossless", False: "NOT lossless"}.get(r.get("lossless", r.get("outputs_identical")), "")
    who = "this run's head" if r.get("head", OWN_HEAD) == OWN_HEAD else r["head"]
    lines = [f"  {who} ({head_description(r)}): tau {_tau(r.get('mean_acceptance_length'))}, speed-up "
             f"{r['speedup']:.2f}x over the target alone, {ok}".rstrip(", ")]
    for name, v in (r.get("sets") or {}).items():
        line = f"    {name:<10} tau {_tau(v.get('mean_acceptance_length'))}"
        if "speedup" in v:
            line += f", {v['speedup']:.2f}x"
        lines.append(line)
        for cat, c in (v.get("categories") or {}).items():  # a set with categories (mtbench)
            line = f"      {cat:<12} tau {_tau(c.get('mean_acceptance_length'))}"
            if "speedup" in c:
                line += f", {c['speedup']:.2f}x"
            lines.append(line)
    return lines


def result_screen(res: str | os.PathLike) -> str | None:
    """The result of the run whose results folder is ``res`` (``results/<run>``), one screen: the head (method, draft
    layer; a given head's folder and format, config ``draft.head``) and the k it is served at, τ (tokens per target
    forward) and speed-up per set and overall for each head and k benchmarked (per category too where a set has them),
    whether each was lossless, where the report is and the command that serves the head, and what the data lost
    (``data_line``). None where the run has no benchmark.json yet (a build asked for an earlier artifact alone)."""
    res = Path(res)
    bench = _read(res / "benchmark.json")
    if bench is None:
        return None
    serving = _read(res / "serve" / "serving.json") or {}
    k = (serving.get("k") or {}).get("num_speculative_tokens")
    base = bench.get("baseline") or {}
    s = bench.get("settings") or {}
    own = next((h for h in bench.get("heads") or [] if h.get("name") == OWN_HEAD), {})
    # a benchmark.json written before its heads named their method and layer: the defaults, the only ones then
    head = f"{own.get('method', DEFAULT_METHOD)} head, {own.get('draft_layer', DEFAULT_LAYER)} draft layer"
    served = f"served at k {k}" if k is not None else "serving files not written yet"
    source = (_read(res / "head" / "head_meta.json") or {}).get("source")  # draft.head: a given head
    given = f", given: {source['path']}, {source['format']} format" if source else ""
    lines = [f"Result of run {res.name} ({res}/):",
             f"  {head} ({res / 'head'}{given}), {served}",
             f"  the target alone: {base.get('output_tokens_per_s', 0):.2f} output tokens/s; "
             f"{s.get('concurrency', '?')} request(s) in flight, {s.get('num_prompts', '?')} prompts a set, greedy"]
    for r in benchmark_runs(bench):
        lines += _run_lines(r)
    data = data_line(res)
    if data:
        lines.append(data)
    lines.append(f"  report: {res / 'report' / 'benchmark.png'}; figures: {res / 'benchmark.json'}")
    if (res / "serve" / "serve.sh").exists():
        lines.append(f"  serve it: {res / 'serve' / 'serve.sh'}   (README.md, 'Serve it': requests at temperature 0)")
    return "\n".join(lines)


def data_line(res: str | os.PathLike) -> str | None:
    """What prepare_data left out of the data of the run whose results folder is ``res``, one line that points to its
    ``data/data_report.json`` (data/prepare_data.py): per source, lines that do not parse, a file cut mid-record (the
    byte it ends at, the bytes lost), a compressed stream cut short, Parquet rows unread and bytes not UTF-8; the
    records skipped, by reason (``skipped``: the rules of prepare_data's docstring, duplicates included); and the kept
    conversations cut to ``data.max_seq_len`` tokens. None where nothing was lost, or the report is not there."""
    path = Path(res) / "data" / "data_report.json"
    rep = _read(path)
    if rep is None:
        return None
    parts = []
    for src in rep.get("sources") or []:
        lost = []
        if src.get("bad_lines"):
            lost.append(f"{src['bad_lines']} line(s) not JSON")
        if src.get("truncated_at_byte") is not None:
            lost.append(f"cut off at byte {src['truncated_at_byte']} ({src.get('bytes_lost', 0)} bytes lost)")
        if src.get("compressed_stream_cut"):
            lost.append("its compressed stream cut short")
        if src.get("records_lost"):
            lost.append(f"{src['records_lost']} row(s) unreadable")
        if src.get("bad_utf8_bytes"):
            lost.append(f"{src['bad_utf8_bytes']} byte(s) not UTF-8")
        if lost:
            parts.append(f"{src.get('path', '?')}: {', '.join(lost)}")
    skipped = {k: v for k, v in (rep.get("skipped") or {}).items() if v}
    if skipped:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0])))
        parts.append(f"{sum(skipped.values())} record(s) skipped ({reasons}), {rep.get('kept', '?')} kept")
    if rep.get("truncated_to_max_seq_len"):
        parts.append(f"{rep['truncated_to_max_seq_len']} kept conversation(s) cut to data.max_seq_len "
                     f"{rep.get('max_seq_len', '?')} tokens")
    if not parts:
        return None
    return f"  data lost: {'; '.join(parts)}; see {path}"


def build_end(res: str | os.PathLike) -> str:
    """What a successful build ends with (the Snakefile's ``onsuccess``): ``result_screen``, or, where the run has no
    benchmark.json yet (a build asked for an earlier artifact), a line that says so and ``data_line``."""
    screen = result_screen(res)
    if screen is not None:
        return screen
    data = data_line(res)
    return f"{Path(res)}/benchmark.json is not built yet" + (f"\n{data}" if data else "")


def error_line(log: str | os.PathLike) -> str:
    """A failed job's own error: the last non-empty line of its log (the stage's one-line error, which ends the log:
    ``job.run_stage``), or why there is none."""
    try:
        lines = [x.strip() for x in Path(log).read_text(errors="replace").splitlines() if x.strip()]
    except OSError as e:
        return f"(its log cannot be read: {e.strerror})"
    return lines[-1] if lines else "(its log is empty)"


def failure_screen(failed: Iterable[tuple[str, Iterable[str]]]) -> str:
    """Each failed job (``(rule, its log files)``) on two lines: the rule and its own error line, then its log's path;
    what Snakemake's generic "At least one job did not complete successfully" leaves out. None failed (a build stopped
    from outside, whose jobs all finished: workflow/stop.py): a line that says so."""
    failed = list(failed)
    if not failed:
        return "No job failed: the build was stopped before its end; the next run goes on from what it finished"
    out = ["What failed:"]
    for rule, logs in failed:
        logs = [str(x) for x in logs]
        out.append(f"  {rule}: {error_line(logs[0]) if logs else '(no log)'}")
        out.append(f"    log: {', '.join(logs) if logs else '-'}")
    return "\n".join(out)


def failed_jobs(jobs: Iterable) -> list[tuple[str, list[str]]]:
    """``(rule, log files)`` of Snakemake's failed jobs (the Snakefile's workflow's scheduler's ``failed`` set: each
    job with ``rule.name`` and ``log``), sorted by rule, for ``failure_screen``."""
    return sorted((j.rule.name, [str(x) for x in j.log]) for j in jobs)


class _After(logging.Handler):
    """A logging handler that logs ``text()`` on ``logger`` right after a record whose message is ``message``."""

    def __init__(self, logger: logging.Logger, message: str, text: Callable[[], str | None]):
        super().__init__()
        self.logger, self.message, self.text = logger, message, text

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == self.message:
            screen = self.text()
            if screen:
                self.logger.info(screen)


def after_message(logger: logging.Logger, message: str, text: Callable[[], str | None]) -> None:
    """Log ``text()`` on ``logger`` (Snakemake's) right after it logs ``message``: the Snakefile prints the run's result
    after Snakemake's "Nothing to be done" line, where its ``onsuccess`` is not called (snakemake/workflow.py returns
    before it)."""
    logger.addHandler(_After(logger, message, text))

