"""The vocab map format: ``d2t.npy``, ``t2d.npy`` and ``vocab.json`` (shared layer).

``d2t`` int64 [draft]: ``d2t[i] = target_id - i`` for the i-th draft token; ``t2d`` bool
[target]: True at the target ids the draft vocabulary keeps (speculators'
speculators/train/vocab_mapping.py; the tensors vLLM reads from the head,
vllm/model_executor/models/llama_eagle3.py). ``vocab.json``: the map's fingerprint, sizes
and coverage. Built by stage ``build_vocab_map``; read by ``train_draft`` and ``export_head``.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..atomic import atomic_path, write_json


def write_map(d2t, t2d, info: dict, out_d2t: str | os.PathLike, out_t2d: str | os.PathLike,
              out_json: str | os.PathLike) -> None:
    """Write ``d2t`` (torch int64 [draft]) and ``t2d`` (torch bool [target]) as ``.npy`` files and ``info`` as JSON,
    each atomically."""
    for path, arr in ((out_d2t, d2t.numpy().astype(np.int64)), (out_t2d, t2d.numpy().astype(bool))):
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.save(f, arr)
    write_json(out_json, info)


def load(d2t_path: str | os.PathLike, t2d_path: str | os.PathLike, json_path: str | os.PathLike):
    """Read a map written by ``write_map`` (stage ``build_vocab_map``).

    Returns ``(d2t, t2d, info)``: torch int64 [draft], torch bool [target], the ``vocab.json`` dict.

    Raises:
        ValueError: d2t and t2d disagree (``t2d`` must be True exactly at ``arange + d2t``).
    """
    import torch

    d2t = torch.from_numpy(np.load(d2t_path))
    t2d = torch.from_numpy(np.load(t2d_path))
    info = json.loads(open(json_path).read())
    check_consistent(d2t, t2d)
    return d2t, t2d, info


def draft_target_ids(d2t) -> np.ndarray:
    """The target ids of the draft vocabulary, ``arange(draft) + d2t``: int64 [draft], from ``d2t`` int64 [draft]
    (numpy or CPU torch; speculators/train/vocab_mapping.py, vLLM's llama_eagle3.py map draft ids this way)."""
    d2t = np.asarray(d2t, dtype=np.int64)
    return np.arange(d2t.shape[0], dtype=np.int64) + d2t


def coverage(counts: dict[int, int], draft_ids) -> float | None:
    """Share of the counted tokens (``counts``: target id -> occurrences) whose id is in ``draft_ids`` (a set of
    target ids, e.g. ``set(draft_target_ids(d2t).tolist())``), in [0, 1]; None when nothing was counted."""
    total = sum(counts.values())
    return sum(c for t, c in counts.items() if t in draft_ids) / total if total else None


def check_consistent(d2t, t2d) -> None:
    """``t2d`` must be True exactly at the target ids ``arange(draft) + d2t``, which must be increasing.

    Raises:
        ValueError: naming how many ids disagree.
    """
    import torch

    targets = torch.from_numpy(draft_target_ids(d2t))
    if targets.min() < 0 or targets.max() >= t2d.shape[0]:
        raise ValueError(f"d2t maps outside the target vocabulary [0, {t2d.shape[0]})")
    if not bool((targets[1:] > targets[:-1]).all()):
        raise ValueError("d2t target ids are not strictly increasing")
    expect = torch.zeros(t2d.shape[0], dtype=torch.bool)
    expect[targets] = True
    bad = int((expect != t2d.to(torch.bool)).sum())
    if bad:
        raise ValueError(f"d2t and t2d disagree on {bad} target ids")
