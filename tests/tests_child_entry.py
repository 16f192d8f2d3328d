"""A child-process entry for tests of engine_process.run_child (prints a vLLM-like start-up line)."""
import sys


def entry(spec: dict) -> dict:
    import os

    print("INFO Model loading took 0.1 GiB and 2.5 seconds", file=sys.stderr)
    return {"y": 2 * spec["x"], "engine_start_s": 4.0, "runner_env": os.environ.get("VLLM_USE_V2_MODEL_RUNNER")}


def engine_like(spec: dict) -> dict:
    """Starts a grandchild as vLLM starts its engine core (a process of its own), records both pids, then waits
    forever: a job killed meanwhile must take both with it."""
    import json
    import os
    import subprocess
    import time

    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(spec["pids"] + ".tmp", "w") as f:
        json.dump({"child": os.getpid(), "engine": grandchild.pid}, f)
    os.replace(spec["pids"] + ".tmp", spec["pids"])
    while True:
        time.sleep(1)


def real_engine(spec: dict) -> dict:
    """A real vLLM engine (``measure.start_engine``); once it is up, records this process's pid and those of
    its descendants (the engine core), then waits forever."""
    import json
    import os
    import time
    from pathlib import Path

    from eagle3build.vllm import measure

    llm, _ = measure.start_engine(spec["engine"])

    def descendants(pid):
        out = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            for c in (task / "children").read_text().split():
                out += [int(c), *descendants(int(c))]
        return out

    with open(spec["pids"] + ".tmp", "w") as f:
        json.dump({"child": os.getpid(), "engine": descendants(os.getpid())}, f)
    os.replace(spec["pids"] + ".tmp", spec["pids"])
    while llm is not None:
        time.sleep(1)


def held(spec: dict) -> dict:
    """An engine-like run that ``start_child(hold=True)`` can hold: "starts" (sleeps ``start_s``, or fails where
    ``fail``), waits for its release as ``measure.start_engine`` does, then "works" (sleeps ``work_s``); returns the
    wall-clock times of each phase."""
    import time

    from eagle3build.vllm import measure

    t0 = time.time()
    time.sleep(spec.get("start_s", 0.5))
    if spec.get("fail") and spec.get("hold"):
        raise RuntimeError("no room beside the other engine")
    started = time.time()
    if spec.get("hold"):
        measure._wait_release(spec["hold"])
    work = time.time()
    time.sleep(spec.get("work_s", 0.3))
    return {"t0": t0, "started": started, "work": work, "done": time.time(), "engine_start_s": started - t0,
            "held_s": measure.held_seconds(), "cache": __import__("os").environ.get("VLLM_CACHE_ROOT")}
