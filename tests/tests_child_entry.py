"""A child-process entry for tests of vllm_engine.run_child (prints a vLLM-like start-up line)."""
import sys


def entry(spec: dict) -> dict:
    print("INFO Model loading took 0.1 GiB and 2.5 seconds", file=sys.stderr)
    return {"y": 2 * spec["x"], "engine_start_s": 4.0}


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
