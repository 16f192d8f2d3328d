"""README's "Serve it" commands (issue 67), run as written over the reduced build: the server started from the build's
serve.sh in the background, the health wait, a greedy chat request through the OpenAI route, τ from the server's
Prometheus counters, ``kill %1``. Only the run's folder (``results/reduced``, where the README's default build writes
``results/default``) and the port (``--port``, as the README says its arguments go to the server) differ."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess

import pytest
from smk import REPO


def readme_serve_block() -> str:
    """The first fenced block of README.md's "## Serve it" section (the commands after `make run`).

    Raises:
        AssertionError: the section or its block is gone."""
    text = (REPO / "README.md").read_text()
    section = re.search(r"^## Serve it\n(.*?)(?=^## )", text, re.M | re.S)
    assert section, "README.md: no '## Serve it' section"
    block = re.search(r"^```\n(.*?)^```", section.group(1), re.M | re.S)
    assert block, "README.md '## Serve it': no command block"
    return block.group(1)


@pytest.mark.vllm
def test_the_readmes_serve_commands_run_as_written_and_leave_nothing_running(reduced_build):
    """The block starts the server, waits for /health, gets a greedy answer for the served name, reads the draft and
    acceptance counters (τ = 1 + accepted / drafts, at least 1 and at most k + 1), and ``kill %1`` stops the server:
    no process of it is left and its port is free again."""
    from eagle3build.serve import openai_server

    wd, res = reduced_build
    block = readme_serve_block()
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
    counters = dict(re.findall(r"^vllm:spec_decode_num_(drafts|accepted_tokens)_total\{[^}]*\} (\S+)$", p.stdout,
                               re.M))  # each on a line of its own (the answer ends with the block's echo)
    drafts, accepted = float(counters["drafts"]), float(counters["accepted_tokens"])
    k = served["k"]["num_speculative_tokens"]
    assert drafts > 0 and 1.0 <= 1 + accepted / drafts <= k + 1
    openai_server.check_port(port, "README's serve block")  # free again
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _server_of(pid, wd)]
    assert left == [], left


def _server_of(pid: str, wd) -> bool:
    """Whether process ``pid`` is a vLLM process started in ``wd``."""
    try:
        return os.readlink(f"/proc/{pid}/cwd") == str(wd) and "vllm" in open(f"/proc/{pid}/cmdline").read()
    except OSError:
        return False
