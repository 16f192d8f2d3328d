"""The config keys of the jobs' resources: threads, memory, GPUs and run time per stage.

Each ``Key`` as ``key.Key`` documents it; ``spec.KEYS`` holds them all, in config.yaml's order.
"""

from __future__ import annotations

from .key import Key


def _job_keys(kind: str, gpu: str | None, threads: int, mem_mb: int, runtime: int) -> list[Key]:
    """The keys of one kind of job, ``resources.<kind>.*``: ``gpu`` (where ``gpu`` is its doc; default 0), ``threads``,
    ``mem_mb`` (MB) and ``runtime`` (minutes) at these defaults."""
    out = [Key(f"resources.{kind}.gpu", {"type": "integer", "minimum": 0}, 0, gpu)] if gpu else []
    return out + [
        Key(f"resources.{kind}.threads", {"type": "integer", "minimum": 1}, threads, f"threads of a {kind} job"),
        Key(f"resources.{kind}.mem_mb", {"type": "integer", "minimum": 1}, mem_mb, f"memory of a {kind} job (MB)"),
        Key(f"resources.{kind}.runtime", {"type": "integer", "minimum": 1}, runtime,
            f"run time of a {kind} job (minutes)"),
    ]


# Each kind of job: its GPUs' doc (None: it takes none), threads, memory (MB) and run time (minutes) by default.
JOB_KINDS = (
    ("materialize", None, 2, 4000, 20),
    ("cpu", None, 1, 8000, 60),
    ("capture", "GPUs of a capture job (0 = CPU)", 2, 8000, 60),
    ("train", "GPUs of a train job (0 = CPU)", 2, 8000, 120),
    ("serve", "GPUs of a serve job (0 = CPU); the serving file's tensor-parallel size", 2, 12000, 60),
)


RESOURCE_KEYS: tuple[Key, ...] = (
    Key("resources.gpus_per_node", {"type": "integer", "minimum": 0}, 0,
        "GPUs on one machine (the compat plan's ceiling)"),
    Key("resources.gpu_model", {"type": ["string", "null"]}, None,
        "the GPU type the GPU jobs ask a cluster executor for, e.g. \"rtx-pro-6000-blackwell\" (null: any)"),
    Key("resources.gpu_memory_gb", {"type": ["number", "null"], "exclusiveMinimum": 0}, None,
        "per GPU, for the compat plan; null = read from the first visible GPU"),
    *(k for kind, gpu, threads, mem_mb, runtime in JOB_KINDS for k in _job_keys(kind, gpu, threads, mem_mb, runtime)),
)
