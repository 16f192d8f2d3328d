"""Stage ``build_vocab_map``: the draft vocabulary (d2t/t2d) from assistant-token frequencies.

The mapping itself is speculators' ``build_vocab_mappings_from_distribution``: the
``draft_vocab_size`` most frequent target tokens (ties by id), sorted;
``d2t[i] = target_id - i`` (int64, [draft]) and ``t2d`` a bool mask over the target
vocabulary ([target]) — the tensors vLLM reads from the head (vllm/model_executor/models/llama_eagle3.py).

The fingerprint (sha256 of the sorted counts and the draft size, 16 hex chars) travels
with the checkpoint and the exported head, so a head can never be exported with a map it
was not trained with (a misaligned draft ``lm_head`` that training accuracy does not show).

The files' format, reading and consistency check are the shared ``vocab_map.py``.

Training from a given head (config ``train.init_from``, ``from_head``): the map is the head's own ``d2t``/``t2d``
(its ``lm_head`` rows are those tokens), its fingerprint that of the tensors, its coverage counted over the same tokens.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

import numpy as np

from ..config.settings import config_fields
from ..draft.vocab_map import coverage, draft_target_ids, write_map
from ..formats.tokens import read_tokens

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


@config_fields({"draft_vocab_size": "vocab.draft_vocab_size", "num_samples": "capture.num_train_samples"})
class VocabSettings:
    """One build_vocab_map job (``build_vocab_map``): the tokens file ``tokens_path`` (prepare_data's train split), the
    target's vocabulary size (tokens; the compat report's ``target.vocab_size``, decisions.json), the map's files
    ``out_d2t``, ``out_t2d`` and ``out_json``; its config fields (below, from their keys' declarations): a map of
    ``draft_vocab_size`` tokens counted over the first ``num_samples`` samples (the ones the shards capture)."""

    tokens_path: str
    target_vocab_size: int
    out_d2t: str
    out_t2d: str
    out_json: str
    init_head: list[str] | str | None = None  # train.init_from's files (config.json first): the map is its own


def from_head(files: list[str] | str, tokens_path: str | os.PathLike, target_vocab_size: int, out_d2t: str | os.PathLike,
              out_t2d: str | os.PathLike, out_json: str | os.PathLike, num_samples: int | None = None) -> dict:
    """The map of the head whose files are ``files`` (``train.init_from``'s: its config.json, then its weight file,
    speculators' or the EAGLE repo's format: both name them ``d2t`` and ``t2d``): its ``d2t`` (int64 [draft]) and
    ``t2d`` (bool [target]) written as ``build`` writes a map, ``vocab.json`` naming the head (``from_head``), the
    fingerprint of the tensors and the coverage of the tokens of ``tokens_path``.

    Raises:
        ValueError: the head has no d2t/t2d, they disagree, or ``t2d`` is not over ``target_vocab_size`` tokens.
    """
    import torch

    from ..draft import given_head, vocab_map

    folder = os.path.dirname(files if isinstance(files, str) else files[0])
    head = given_head.read(folder, "train.init_from")
    if head.weights.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(os.fspath(head.weights))
    else:
        state = torch.load(head.weights, map_location="cpu", weights_only=True)
    if "d2t" not in state or "t2d" not in state:
        raise ValueError(f"train.init_from {folder}: {head.weights.name} has no d2t/t2d")
    d2t, t2d = state["d2t"].to(torch.int64), state["t2d"].to(torch.bool)
    if t2d.shape[0] != target_vocab_size:
        raise ValueError(f"train.init_from {folder}: t2d covers {t2d.shape[0]} tokens, the target's vocabulary "
                         f"{target_vocab_size}")
    vocab_map.check_consistent(d2t, t2d)
    freq = count_assistant_tokens(tokens_path, num_samples)
    digest = hashlib.sha256(d2t.numpy().tobytes() + t2d.numpy().tobytes()).hexdigest()[:16]
    info = {"fingerprint": digest, "draft_vocab_size": int(d2t.shape[0]), "target_vocab_size": target_vocab_size,
            "distinct_tokens_seen": len(freq), "tokens_counted": sum(freq.values()),
            "coverage": coverage(freq, set(draft_target_ids(d2t).tolist())) or 0.0, "num_samples": num_samples,
            "from_head": folder}
    write_map(d2t, t2d, info, out_d2t, out_t2d, out_json)
    log.info("vocab map of the head %s: %s", folder, info)
    return info


def build_vocab_map(s: VocabSettings) -> dict:
    """Rule ``build_vocab_map``'s entry (``eagle3build.workflow.job.run_stage``): ``build`` the map of ``s``. Returns
    ``build``'s summary.

    With ``s.init_head`` (config ``train.init_from``'s files): ``from_head``, the head's own map.

    Raises:
        ValueError: ``draft_vocab_size`` exceeds the target vocabulary; as ``from_head``.
    """
    if s.init_head:
        return from_head(s.init_head, s.tokens_path, s.target_vocab_size, s.out_d2t, s.out_t2d, s.out_json,
                         s.num_samples)
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
