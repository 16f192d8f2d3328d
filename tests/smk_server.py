"""A fork server for tests/smk.py: snakemake's CLI imported once, each run a forked child of this process.

A snakemake start spends ~2.5 s of CPU importing snakemake before it reads the Snakefile; a test session
starts it ~100 times (dry-run plans, partial builds). Here the import is paid once: each request forks a
child that runs ``snakemake.cli.main`` on its arguments in its own session (process group), working
directory and environment, with stdout and stderr in files, as a fresh ``snakemake`` process would.

Requests on stdin, one JSON line each: ``{"args", "cwd", "env", "stdout", "stderr", "timeout"}``; the reply on
stdout, one JSON line: ``{"rc", "timed_out"}`` (a timed-out run's process group is killed). EOF ends it.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback

import snakemake.cli  # the import this server pays once for every run


def _child(req: dict) -> None:
    code = 1
    try:
        os.setsid()
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = ["snakemake", *req["args"]]
        code = snakemake.cli.main(req["args"])
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code if isinstance(code, int) else (0 if code is None else 1))


def serve_one(req: dict) -> dict:
    pid = os.fork()
    if pid == 0:
        _child(req)
    deadline = time.monotonic() + req["timeout"]
    timed_out = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"rc": os.waitstatus_to_exitcode(status), "timed_out": timed_out}
        if not timed_out and time.monotonic() > deadline:
            timed_out = True
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(serve_one(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
