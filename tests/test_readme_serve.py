"""README's "Serve it" commands (issue 67), run as written over the reduced build: the server started from the build's
serve.sh in the background, the health wait, a greedy chat request through the OpenAI route, τ from the server's
Prometheus counters, ``kill %1``. Only the run's folder (``results/reduced``, where the README's default build writes
``results/default``) and the port (``--port``, as the README says its arguments go to the server) differ."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from smk import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from test_loop import readme_serve_block, serve_result  # noqa: E402  (the make-run record runs the same block)


@pytest.mark.vllm
def test_the_readmes_serve_commands_run_as_written_and_leave_nothing_running(reduced_build):
    """The block starts the server, waits for /health, gets a greedy answer for the served name, reads the draft and
    acceptance counters (τ = 1 + accepted / drafts, at least 1 and at most k + 1), and ``kill %1`` stops the server:
    no process of it is left and its port is free again."""
    from eagle3build.serve import openai_server

    wd, res = reduced_build
    block = readme_serve_block((REPO / "README.md").read_text())
    assert "results/default/serve/serve.sh &" in block and "localhost:8000" in block and "kill %1" in block
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    script = (block.replace("results/default/", "results/reduced/")
              .replace("serve/serve.sh &", f"serve/serve.sh --port {port} &")
              .replace("localhost:8000", f"localhost:{port}"))
    p = subprocess.run(["bash", "-c", "set -e\n" + script + "wait\n"], cwd=wd, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode in (0, 143), p.stdout[-3000:] + p.stderr[-3000:]  # wait: the server's SIGTERM status
    answer = json.loads(next(line for line in p.stdout.splitlines() if line.startswith("{")))
    served = json.loads((res / "serve/serving.json").read_text())
    assert answer["model"] == served["served_name"] and answer["choices"][0]["message"]["content"].strip()
    assert answer["usage"]["completion_tokens"] > 0
    # each counter on a line of its own (the answer ends with the block's echo); this head is the reduced build's, at
    # τ 1.0 in its benchmark: the default build's τ > 1 through the same block is the make-run record's readme-serve
    got = serve_result(p.stdout)
    assert got["drafts"] > 0 and 1.0 <= got["tau"] <= served["k"]["num_speculative_tokens"] + 1
    assert 0 < got["completion_tokens"] <= 64  # the block's max_tokens
    openai_server.check_port(port, "README's serve block")  # free again
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _server_of(pid, wd)]
    assert left == [], left


def _server_of(pid: str, wd) -> bool:
    """Whether process ``pid`` is a vLLM process started in ``wd``."""
    try:
        return os.readlink(f"/proc/{pid}/cwd") == str(wd) and "vllm" in open(f"/proc/{pid}/cmdline").read()
    except OSError:
        return False
