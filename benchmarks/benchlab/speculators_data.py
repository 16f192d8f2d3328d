"""Our hidden-state shards as speculators' own offline training data (the peers' route, issue 40 item 4).

speculators' training entry point (``python -m speculators.train``, speculators/train/cli.py) reads a data
directory of two parts (speculators 0.9.0):

- a Hugging Face ``datasets`` directory (``load_from_disk``; speculators/train/data.py ``ArrowDataset``) with
  the columns ``input_ids`` (int64 [seq]), ``loss_mask`` (int64 [seq], 1 on supervised tokens) and
  ``seq_len`` (tokens), in torch format: what speculators/data_generation/preprocessing.py writes;
- ``hidden_states/hs_{i}.safetensors`` for row ``i`` (hs_connectors/transfer.py ``FileTransfer.get_cached``):
  ``hidden_states`` [seq, A + 1, H] (the A aux layers in id order, then the last layer's output before the
  final norm) and ``token_ids`` int64 [seq], which must equal the row's ``input_ids``.

It splits the rows itself, the first ``int(N * train_data_ratio)`` for training and the rest for validation
(``ArrowDataset``): the train shards' samples go first, then the eval shards', and ``train_data_ratio`` is
chosen so that the split falls exactly between them. The token frequencies behind its vocabulary map
(``token_freq.pt``, speculators/train/vocab_mapping.py ``save_token_frequency_distribution``) are counted over
the train rows only, as our ``build_vocab_map`` counts them, so both routes start from the same data and the same
draft vocabulary.

A shared module: no stage imports it; ``benchmarks/peer_route.py`` does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from eagle3build.atomic import atomic_path
from eagle3build.formats.shards import ShardReader, check_meta

TOKEN_FREQ = "token_freq.pt"


def train_data_ratio(num_train: int, num_eval: int) -> float:
    """speculators' ``--train-data-ratio`` r for which ``int((num_train + num_eval) * r) == num_train``
    (speculators/train/data.py ``ArrowDataset``): halfway between two row counts, so rounding cannot move it.

    Raises:
        ValueError: ``num_train`` < 1 or ``num_eval`` < 1 (speculators needs both splits non-empty).
    """
    if num_train < 1 or num_eval < 1:
        raise ValueError(f"speculators' training needs train and validation rows: {num_train} train, {num_eval} eval")
    return (num_train + 0.5) / (num_train + num_eval)


def write_speculators_data(train_shards: Sequence[str | os.PathLike], eval_shards: Sequence[str | os.PathLike],
                           out_dir: str | os.PathLike, target_fingerprint: str, aux_layer_ids: Sequence[int],
                           dtype: torch.dtype = torch.bfloat16) -> dict:
    """Write the samples of ``train_shards`` then ``eval_shards`` (our shard files, docs/shard-format.md) as
    speculators' offline data directory ``out_dir`` (the module docstring), atomically: a temporary sibling
    renamed into place, so a killed run leaves no directory speculators would read. Every shard must be of
    ``target_fingerprint`` and ``aux_layer_ids`` (the run's compat report: what the head will be told), as our
    trainer requires (``shards.check_meta``).

    Each sample's states go to ``hidden_states/hs_{row}.safetensors``: ``hidden_states`` [seq, A + 1, H] in
    ``dtype`` (speculators' ``--hidden-states-dtype``, bf16 by default: bf16 shards are copied bit for bit, fp8
    shards dequantised first, float32 shards rounded to bf16), ``token_ids`` int64 [seq].

    Returns:
        ``{"num_train", "num_eval", "tokens", "bytes", "seconds", "train_data_ratio", "hidden_size",
        "num_aux_layers", "aux_layer_ids"}``: rows per split, tokens over all rows, bytes written (states,
        dataset and token frequencies), wall seconds, the ratio to pass as ``--train-data-ratio``.

    Raises:
        ValueError: no train or no eval samples (``out_dir`` named).
        shards.ShardMismatch: a shard of another target or other aux layers (the shard and both values named).
    """
    import datasets
    from safetensors.torch import save_file
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    t0 = time.perf_counter()
    readers = [(split, ShardReader(p)) for split, paths in (("train", train_shards), ("eval", eval_shards))
               for p in paths]
    counts = {s: sum(len(r) for sp, r in readers if sp == s) for s in ("train", "eval")}
    try:
        ratio = train_data_ratio(counts["train"], counts["eval"])
    except ValueError as e:
        raise ValueError(f"{out_dir}: {e} in the shards given") from e
    for _, r in readers:
        check_meta(r.path, r.meta, target_fingerprint, list(aux_layer_ids))
    first = readers[0][1]
    hidden = int(first.meta.hidden_size)
    cols: dict[str, list] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    tokens = 0
    with atomic_path(out_dir) as tmp:
        (tmp / "hidden_states").mkdir(parents=True)
        row = 0
        for _, r in readers:
            for i in range(len(r)):
                s = r[i]
                seq = s["input_ids"].shape[0]
                states = torch.cat([s["hidden_states"].reshape(seq, -1, hidden),
                                    s["verifier_last_hidden_states"].reshape(seq, 1, hidden)], dim=1)
                save_file({"hidden_states": states.to(dtype).contiguous(), "token_ids": s["input_ids"].contiguous()},
                          str(tmp / "hidden_states" / f"hs_{row}.safetensors"))
                cols["input_ids"].append(s["input_ids"].tolist())
                cols["loss_mask"].append(s["loss_mask"].to(torch.int64).tolist())
                cols["seq_len"].append(seq)
                tokens += seq
                row += 1
        ds = datasets.Dataset.from_dict(cols)
        ds.set_format(type="torch")
        ds.save_to_disk(str(tmp))
        save_token_frequency_distribution(ds.select(range(counts["train"])), tmp / TOKEN_FREQ)
        size = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file())
    return {"num_train": counts["train"], "num_eval": counts["eval"], "tokens": tokens, "bytes": size,
            "seconds": round(time.perf_counter() - t0, 3), "train_data_ratio": ratio, "hidden_size": hidden,
            "num_aux_layers": len(first.meta.aux_layer_ids), "aux_layer_ids": list(first.meta.aux_layer_ids)}
