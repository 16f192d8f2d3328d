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

import numpy as np

from ..config.settings import config_fields, job
from ..draft.vocab_map import coverage, draft_target_ids, write_map
from ..formats.tokens import read_tokens

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 1
STAGE = {
    "packages": ("speculators", "torch"),  # speculators' build_vocab_mappings_from_distribution runs on torch
    "entry": "build_vocab_map",
    "keys": {"run": "files", "target.offline": "runtime", "capture.num_train_samples": "trigger:num_samples",
             "vocab.draft_vocab_size": "trigger", "resources.cpu.*": "runtime"},
}


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


@config_fields({"draft_vocab_size": "vocab.draft_vocab_size", "num_samples": "capture.num_train_samples"})
class VocabSettings:
    """One build_vocab_map job (``build_vocab_map``): the tokens file ``tokens_path`` (prepare_data's train split), the
    target's vocabulary size (tokens; the compat report's ``target.vocab_size``, decisions.json), the map's files
    ``out_d2t``, ``out_t2d`` and ``out_json``; its config fields (below, from their keys' declarations): a map of
    ``draft_vocab_size`` tokens counted over the first ``num_samples`` samples (the ones the shards capture)."""

    tokens_path: str = job("inputs.tokens")
    target_vocab_size: int = job("decisions.target.vocab_size")
    out_d2t: str = job("outputs.d2t")
    out_t2d: str = job("outputs.t2d")
    out_json: str = job("outputs.info")


def build_vocab_map(s: VocabSettings) -> dict:
    """Rule ``build_vocab_map``'s entry (``eagle3build.workflow.job.run_stage``): ``build`` the map of ``s``. Returns
    ``build``'s summary.

    Raises:
        ValueError: ``draft_vocab_size`` exceeds the target vocabulary.
    """
    return build(s.tokens_path, s.target_vocab_size, s.draft_vocab_size, s.out_d2t, s.out_t2d, s.out_json,
                 s.num_samples)


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
