"""A child-process entry for tests of vllm_engine.run_child (prints a vLLM-like start-up line)."""
import sys


def entry(spec: dict) -> dict:
    print("INFO Model loading took 0.1 GiB and 2.5 seconds", file=sys.stderr)
    return {"y": 2 * spec["x"], "engine_start_s": 4.0}
