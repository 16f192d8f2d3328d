"""The config keys of the jobs' resources: threads, memory, GPUs and run time per stage.

Each ``Key`` as ``key.Key`` documents it; ``spec.KEYS`` holds them all, in config.yaml's order.
"""

from __future__ import annotations

from .key import Key

RESOURCE_KEYS: tuple[Key, ...] = (
    Key("resources.gpus_per_node", {"type": "integer", "minimum": 0}, 0,
        "GPUs on one machine (the compat plan's ceiling)"),
    Key("resources.gpu_model", {"type": ["string", "null"]}, None,
        "the GPU type the GPU jobs ask a cluster executor for, e.g. \"rtx-pro-6000-blackwell\" (null: any)"),
    Key("resources.gpu_memory_gb", {"type": ["number", "null"], "exclusiveMinimum": 0}, None,
        "per GPU, for the compat plan; null = read from the first visible GPU"),
    Key("resources.materialize.threads", {"type": "integer", "minimum": 1}, 2, "threads of a materialize job"),
    Key("resources.materialize.mem_mb", {"type": "integer", "minimum": 1}, 4000, "memory of a materialize job (MB)"),
    Key("resources.materialize.runtime", {"type": "integer", "minimum": 1}, 20,
        "run time of a materialize job (minutes)"),
    Key("resources.cpu.threads", {"type": "integer", "minimum": 1}, 1, "threads of a cpu job"),
    Key("resources.cpu.mem_mb", {"type": "integer", "minimum": 1}, 8000, "memory of a cpu job (MB)"),
    Key("resources.cpu.runtime", {"type": "integer", "minimum": 1}, 60, "run time of a cpu job (minutes)"),
    Key("resources.capture.gpu", {"type": "integer", "minimum": 0}, 0, "GPUs of a capture job (0 = CPU)"),
    Key("resources.capture.threads", {"type": "integer", "minimum": 1}, 2, "threads of a capture job"),
    Key("resources.capture.mem_mb", {"type": "integer", "minimum": 1}, 8000, "memory of a capture job (MB)"),
    Key("resources.capture.runtime", {"type": "integer", "minimum": 1}, 60, "run time of a capture job (minutes)"),
    Key("resources.train.gpu", {"type": "integer", "minimum": 0}, 0, "GPUs of a train job (0 = CPU)"),
    Key("resources.train.threads", {"type": "integer", "minimum": 1}, 2, "threads of a train job"),
    Key("resources.train.mem_mb", {"type": "integer", "minimum": 1}, 8000, "memory of a train job (MB)"),
    Key("resources.train.runtime", {"type": "integer", "minimum": 1}, 120, "run time of a train job (minutes)"),
    Key("resources.serve.gpu", {"type": "integer", "minimum": 0}, 0,
        "GPUs of a serve job (0 = CPU); the serving file's tensor-parallel size"),
    Key("resources.serve.threads", {"type": "integer", "minimum": 1}, 2, "threads of a serve job"),
    Key("resources.serve.mem_mb", {"type": "integer", "minimum": 1}, 12000, "memory of a serve job (MB)"),
    Key("resources.serve.runtime", {"type": "integer", "minimum": 1}, 60, "run time of a serve job (minutes)"),
)
