"""The config keys of the jobs' resources: threads, memory, GPUs and run time per stage.

Each ``Key`` as ``config_key.Key`` documents it; ``config_spec.KEYS`` holds them all, in config.yaml's order.
"""

from __future__ import annotations

from .key import Key

RESOURCE_KEYS: tuple[Key, ...] = (
    Key(
        "resources.gpus_per_node",
        {"type": "integer", "minimum": 0},
        0,
        "GPUs on one machine (the compat plan's ceiling)",
        {"compat_report": "runtime"},
    ),
    Key(
        "resources.gpu_model",
        {"type": ["string", "null"]},
        None,
        "the GPU type the GPU jobs ask a cluster executor for, e.g. \"rtx-pro-6000-blackwell\" (null: any)",
        {
            "regenerate_responses": "runtime",
            "capture_hidden_states": "runtime",
            "train_draft": "runtime",
            "export_head": "runtime",
            "benchmark": "runtime",
            "preflight_bound": "runtime",
        },
    ),
    Key(
        "resources.gpu_memory_gb",
        {"type": ["number", "null"], "exclusiveMinimum": 0},
        None,
        "per GPU, for the compat plan; null = read from the first visible GPU",
        {"compat_report": "runtime"},
    ),
    Key(
        "resources.materialize.threads",
        {"type": "integer", "minimum": 1},
        2,
        "threads of a materialize job",
        {"materialize_target": "runtime"},
    ),
    Key(
        "resources.materialize.mem_mb",
        {"type": "integer", "minimum": 1},
        4000,
        "memory of a materialize job (MB)",
        {"materialize_target": "runtime"},
    ),
    Key(
        "resources.materialize.runtime",
        {"type": "integer", "minimum": 1},
        20,
        "run time of a materialize job (minutes)",
        {"materialize_target": "runtime"},
    ),
    Key(
        "resources.cpu.threads",
        {"type": "integer", "minimum": 1},
        1,
        "threads of a cpu job",
        {"compat_report": "runtime", "prepare_data": "runtime", "build_vocab_map": "runtime"},
    ),
    Key(
        "resources.cpu.mem_mb",
        {"type": "integer", "minimum": 1},
        8000,
        "memory of a cpu job (MB)",
        {"compat_report": "runtime", "prepare_data": "runtime", "build_vocab_map": "runtime"},
    ),
    Key(
        "resources.cpu.runtime",
        {"type": "integer", "minimum": 1},
        60,
        "run time of a cpu job (minutes)",
        {"compat_report": "runtime", "prepare_data": "runtime", "build_vocab_map": "runtime"},
    ),
    Key(
        "resources.capture.gpu",
        {"type": "integer", "minimum": 0},
        0,
        "GPUs of a capture job (0 = CPU)",
        {"compat_report": "runtime", "capture_hidden_states": "runtime"},
    ),
    Key(
        "resources.capture.threads",
        {"type": "integer", "minimum": 1},
        2,
        "threads of a capture job",
        {"capture_hidden_states": "runtime"},
    ),
    Key(
        "resources.capture.mem_mb",
        {"type": "integer", "minimum": 1},
        8000,
        "memory of a capture job (MB)",
        {"capture_hidden_states": "runtime"},
    ),
    Key(
        "resources.capture.runtime",
        {"type": "integer", "minimum": 1},
        60,
        "run time of a capture job (minutes)",
        {"capture_hidden_states": "runtime"},
    ),
    Key(
        "resources.train.gpu",
        {"type": "integer", "minimum": 0},
        0,
        "GPUs of a train job (0 = CPU)",
        {"compat_report": "runtime", "train_draft": "runtime"},
    ),
    Key(
        "resources.train.threads",
        {"type": "integer", "minimum": 1},
        2,
        "threads of a train job",
        {"train_draft": "runtime"},
    ),
    Key(
        "resources.train.mem_mb",
        {"type": "integer", "minimum": 1},
        8000,
        "memory of a train job (MB)",
        {"train_draft": "runtime"},
    ),
    Key(
        "resources.train.runtime",
        {"type": "integer", "minimum": 1},
        120,
        "run time of a train job (minutes)",
        {"train_draft": "runtime"},
    ),
    Key(
        "resources.serve.gpu",
        {"type": "integer", "minimum": 0},
        0,
        "GPUs of a serve job (0 = CPU)",
        {
            "compat_report": "runtime",
            "regenerate_responses": "runtime",
            "export_head": "runtime",
            "benchmark": "runtime",
            "preflight_bound": "runtime",
        },
    ),
    Key(
        "resources.serve.threads",
        {"type": "integer", "minimum": 1},
        2,
        "threads of a serve job",
        {
            "regenerate_responses": "runtime",
            "export_head": "runtime",
            "benchmark": "runtime",
            "preflight_bound": "runtime",
        },
    ),
    Key(
        "resources.serve.mem_mb",
        {"type": "integer", "minimum": 1},
        12000,
        "memory of a serve job (MB)",
        {
            "regenerate_responses": "runtime",
            "export_head": "runtime",
            "benchmark": "runtime",
            "preflight_bound": "runtime",
        },
    ),
    Key(
        "resources.serve.runtime",
        {"type": "integer", "minimum": 1},
        60,
        "run time of a serve job (minutes)",
        {
            "regenerate_responses": "runtime",
            "export_head": "runtime",
            "benchmark": "runtime",
            "preflight_bound": "runtime",
        },
    ),
)
