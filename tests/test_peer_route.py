"""The peers' route (issue 40 item 4): our shards as speculators' own training data, read back by speculators' own
dataset, and benchmarks/peer_route.py through speculators' training entry point (``--dry-run`` on a CPU: its
Trainer needs an accelerator)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from conftest import TINY_AUX
from smk import REPO

from eagle3build.shards import ShardReader
from eagle3build.speculators_data import TOKEN_FREQ, train_data_ratio, write_speculators_data


def test_train_data_ratio_splits_exactly():
    """speculators' split index int(N * r) lands on the train count for every small split."""
    for n_train in range(1, 60):
        for n_eval in range(1, 30):
            assert int((n_train + n_eval) * train_data_ratio(n_train, n_eval)) == n_train
    with pytest.raises(ValueError, match="0 eval"):
        train_data_ratio(5, 0)


def test_speculators_reads_our_shards(tiny_shards, tmp_path):
    """speculators' ArrowDataset (train and val splits) returns each shard sample's states, ids and mask unchanged;
    its vocab map from the written token frequencies is ours (the same train samples counted)."""
    from hs_connectors import FileTransfer
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import ArrowDataset, CollateFn
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    d, samples, _ = tiny_shards
    out = tmp_path / "data"
    info = write_speculators_data([d / "train-shard.safetensors"], [d / "eval-shard.safetensors"], out)
    assert (info["num_train"], info["num_eval"], info["aux_layer_ids"]) == (8, 2, TINY_AUX)
    assert info["tokens"] == sum(len(ids) for _, ids, _ in samples)
    assert sorted(p.name for p in (out / "hidden_states").iterdir()) == sorted(f"hs_{i}.safetensors" for i in range(10))

    ours = [ShardReader(d / "train-shard.safetensors")[i] for i in range(8)]
    ours += [ShardReader(d / "eval-shard.safetensors")[i] for i in range(2)]
    for split, rows in (("train", ours[:8]), ("val", ours[8:])):
        ds = ArrowDataset(max_len=4096, datapath=out, transfer=FileTransfer(out / "hidden_states"), on_missing="raise",
                          train_ratio=info["train_data_ratio"], split=split)
        assert len(ds) == len(rows)
        for i, want in enumerate(rows):
            got = ds[i]
            assert got["hidden_states"].shape == (len(want["input_ids"]), 3 * 64)
            assert torch.equal(got["hidden_states"], want["hidden_states"])
            assert torch.equal(got["verifier_last_hidden_states"], want["verifier_last_hidden_states"])
            assert torch.equal(got["input_ids"], want["input_ids"])
            assert torch.equal(got["loss_mask"].bool(), want["loss_mask"])
        batch = CollateFn(512, 64, num_target_layers=3, preprocess=shift_batch)([ds[0], ds[1]])
        assert batch["hidden_states"].shape == (1, 512, 3 * 64) and batch["error_records"] == 0

    freq = torch.load(out / TOKEN_FREQ, weights_only=True)
    assert sum(freq.values()) == sum(int(m.sum()) for _, _, m in samples[:8])  # train rows, supervised tokens
    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab_size=256, target_vocab_size=49152)
    assert np.array_equal(d2t.numpy(), np.load(d / "d2t.npy")) and np.array_equal(t2d.numpy(), np.load(d / "t2d.npy"))


def test_write_refuses_shards_without_eval(tiny_shards, tmp_path):
    d, _, _ = tiny_shards
    with pytest.raises(ValueError, match="8 train, 0 eval"):
        write_speculators_data([d / "train-shard.safetensors"], [], tmp_path / "data")
    assert not (tmp_path / "data").exists()


@pytest.mark.slow
def test_peer_route_dry_run(tiny_shards, tiny_target, tmp_path):
    """benchmarks/peer_route.py over a run's results: speculators' entry point builds the EAGLE-3 head from the
    converted data (its own --dry-run) with the run's aux layers and draft vocabulary, and the head is kept for
    benchmark.compare_heads; a run without shards is refused, naming the folder."""
    d, _, _ = tiny_shards
    res = tmp_path / "results/tiny"
    for split in ("train", "eval"):
        (res / "hidden_states" / split).mkdir(parents=True)
        shutil.copy(d / f"{split}-shard.safetensors", res / "hidden_states" / split / "shard-00000.safetensors")
    shutil.copy(d / "decisions.json", res / "decisions.json")
    overlay = tmp_path / "tiny.yaml"
    overlay.write_text(yaml.safe_dump({"run": "tiny", "target": {"path": str(tiny_target)},
                                       "vocab": {"draft_vocab_size": 256},
                                       "train": {"epochs": 1, "ttt_steps": 2, "total_seq_len": 256}}))
    cmd = [sys.executable, str(REPO / "benchmarks/peer_route.py"), "--configfile", str(overlay), "--workdir",
           str(tmp_path), "--out", str(tmp_path / "peer"), "--num-workers", "0", "--dry-run"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:] + (tmp_path / "peer/train.log").read_text()[-3000:]
    rec = json.loads((tmp_path / "peer/peer_route.json").read_text())
    assert rec["data"]["num_train"] == 8 and rec["data"]["num_eval"] == 2
    assert rec["peer"]["train_s"] > 0 and rec["speculators_command"][:2] == ["-m", "speculators.train"]
    head = json.loads((tmp_path / "peer/head/config.json").read_text())
    assert head["speculators_model_type"] == "eagle3" and head["draft_vocab_size"] == 256
    assert head["eagle_aux_hidden_state_layer_ids"] == TINY_AUX
    from safetensors.torch import load_file

    w = load_file(tmp_path / "peer/head/model.safetensors")
    assert np.array_equal(w["d2t"].numpy(), np.load(d / "d2t.npy"))

    shutil.rmtree(res / "hidden_states/eval")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode != 0 and "hidden_states/eval: no shard-*.safetensors" in p.stderr
