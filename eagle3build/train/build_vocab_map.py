"""Stage ``build_vocab_map``: the draft vocabulary (d2t/t2d) from assistant-token frequencies.

The mapping itself is speculators' ``build_vocab_mappings_from_distribution``: the
``draft_vocab_size`` most frequent target tokens (ties by id), sorted;
``d2t[i] = target_id - i`` (int64, [draft]) and ``t2d`` a bool mask over the target
vocabulary ([target]) — the tensors vLLM reads from the head (vllm/model_executor/models/llama_eagle3.py).

The fingerprint (sha256 of the sorted counts and the draft size, 16 hex chars) travels
with the checkpoint and the exported head, so a head can never be exported with a map it
was not trained with (a misaligned draft ``lm_head`` that training accuracy does not show).

The files' format, reading and consistency check are the shared ``vocab_map.py``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping

import numpy as np

from ..draft.vocab_map import coverage, draft_target_ids, write_map
from ..formats.tokens import read_tokens
from ..workflow.contract import StageSettings

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 1


def count_assistant_tokens(tokens_path: str | os.PathLike, num_samples: int | None = None) -> dict[int, int]:
    """Frequencies of target token ids under the loss mask, over the first ``num_samples`` samples."""
    toks = read_tokens(tokens_path)
    n = len(toks) if num_samples is None else min(num_samples, len(toks))
    end = int(toks.offsets[n])
    ids = toks.input_ids[:end][toks.loss_mask[:end].astype(bool)]
    uniq, counts = np.unique(ids, return_counts=True)
    return dict(zip(uniq.tolist(), counts.tolist(), strict=True))


def vocab_fingerprint(freq: dict[int, int], draft_vocab_size: int) -> str:
    """sha256 over the sorted ``(token, count)`` pairs and the draft size; 16 hex chars."""
    h = hashlib.sha256(json.dumps([draft_vocab_size, sorted(freq.items())]).encode())
    return h.hexdigest()[:16]


def run_job(inputs: Mapping[str, str], outputs: Mapping[str, str], settings: StageSettings) -> dict:
    """Rule ``build_vocab_map``'s entry (``eagle3build.workflow.job.run_stage``): ``build`` from ``inputs["tokens"]``
    (its first ``capture.num_train_samples`` samples) a map of ``vocab.draft_vocab_size`` tokens into
    ``outputs`` ``d2t``, ``t2d`` and ``info``, with the target vocabulary size (tokens) read from the compat
    report's ``inputs["decisions"]`` (``artifacts.Decisions``). Returns ``build``'s summary.

    Raises:
        artifacts.ArtifactError: the decisions file is missing or does not match its schema.
        ValueError: ``draft_vocab_size`` exceeds the target vocabulary.
    """
    from ..formats.artifacts import Decisions

    target_vocab_size = Decisions.load(inputs["decisions"]).target_vocab_size
    return build(inputs["tokens"], target_vocab_size, settings["vocab.draft_vocab_size"], outputs["d2t"],
                 outputs["t2d"], outputs["info"], settings["capture.num_train_samples"])


def build(
    tokens_path: str | os.PathLike,
    target_vocab_size: int,
    draft_vocab_size: int,
    out_d2t: str | os.PathLike,
    out_t2d: str | os.PathLike,
    out_json: str | os.PathLike,
    num_samples: int | None = None,
) -> dict:
    """Count, map, and write ``d2t.npy`` (int64 [draft]), ``t2d.npy`` (bool [target]) and ``vocab.json``.

    Raises:
        ValueError: ``draft_vocab_size`` exceeds the target vocabulary.
    """
    import torch
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    if draft_vocab_size > target_vocab_size:
        raise ValueError(f"vocab.draft_vocab_size {draft_vocab_size} exceeds the target vocabulary ({target_vocab_size})")
    freq = count_assistant_tokens(tokens_path, num_samples)
    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab_size, target_vocab_size)
    assert isinstance(d2t, torch.Tensor)
    total = sum(freq.values())
    info = {
        "fingerprint": vocab_fingerprint(freq, draft_vocab_size),
        "draft_vocab_size": draft_vocab_size,
        "target_vocab_size": target_vocab_size,
        "distinct_tokens_seen": len(freq),
        "tokens_counted": total,
        "coverage": coverage(freq, set(draft_target_ids(d2t).tolist())) or 0.0,
        "num_samples": num_samples,
    }
    write_map(d2t, t2d, info, out_d2t, out_t2d, out_json)
    log.info("vocab map: %s", info)
    return info
