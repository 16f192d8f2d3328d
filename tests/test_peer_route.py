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
from benchlab.speculators_data import TOKEN_FREQ, train_data_ratio, write_speculators_data
from conftest import TINY_AUX
from smk import REPO

from eagle3build.formats.shards import ShardMeta, ShardMismatch, ShardReader, write_shard

FP = "fp-tiny"  # the tiny shards' target fingerprint (conftest.tiny_shards)


def test_train_data_ratio_splits_exactly():
    """speculators' split index int(N * r) lands on the train count for every small split."""
    for n_train in range(1, 60):
        for n_eval in range(1, 30):
            assert int((n_train + n_eval) * train_data_ratio(n_train, n_eval)) == n_train
    with pytest.raises(ValueError, match="0 eval"):
        train_data_ratio(5, 0)


def test_speculators_reads_our_shards(tiny_shards, tmp_path):
    """speculators' ArrowDataset (train and val splits) returns each shard sample's states, ids and mask unchanged,
    its CollateFn + shift_batch pack them back to back (shifted by one token); its vocab map from the written token
    frequencies is ours at a draft vocab smaller than the tokens used (the same train samples counted)."""
    from hs_connectors import FileTransfer
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import ArrowDataset, CollateFn
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    from eagle3build.train import build_vocab_map as bv

    d, samples, _ = tiny_shards
    out = tmp_path / "data"
    info = write_speculators_data([d / "train-shard.safetensors"], [d / "eval-shard.safetensors"], out, FP, TINY_AUX)
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
        n0, n1 = len(rows[0]["input_ids"]) - 1, len(rows[1]["input_ids"]) - 1  # shift_batch drops one token each
        assert torch.equal(batch["input_ids"][0, :n0 + n1], torch.cat([rows[0]["input_ids"][1:], rows[1]["input_ids"][1:]]))
        assert torch.equal(batch["hidden_states"][0, n0:n0 + n1], rows[1]["hidden_states"][:-1])
        assert torch.equal(batch["document_ids"][0, n0 + n1 - 1:n0 + n1 + 1], torch.tensor([1, -1]))

    freq = torch.load(out / TOKEN_FREQ, weights_only=True)
    assert sum(freq.values()) == sum(int(m.sum()) for _, _, m in samples[:8])  # train rows, supervised tokens
    assert len(freq) > 32
    bv.build(d / "train.safetensors", 49152, 32, tmp_path / "d2t.npy", tmp_path / "t2d.npy", tmp_path / "v.json")
    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab_size=32, target_vocab_size=49152)
    assert np.array_equal(d2t.numpy(), np.load(tmp_path / "d2t.npy"))
    assert np.array_equal(t2d.numpy(), np.load(tmp_path / "t2d.npy"))


def test_fp8_shards_become_bf16_of_their_dequantised_states(tmp_path):
    """An fp8 shard (docs/shard-format.md) reaches speculators as bf16 of what our own trainer reads from it."""
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset

    torch.manual_seed(0)
    paths = []
    for split, n in (("train", 3), ("eval", 1)):
        meta = ShardMeta(FP, [0, 2], "float8_e4m3fn", 16, [f"{split}{i}" for i in range(n)], split)
        lens = [5 + 3 * i for i in range(n)]
        write_shard(tmp_path / f"{split}.safetensors", meta, [torch.randn(t, 32) for t in lens],
                    [torch.randn(t, 16) for t in lens], [torch.arange(t) + 100 for t in lens],
                    [torch.ones(t, dtype=torch.uint8) for t in lens])
        paths.append(tmp_path / f"{split}.safetensors")
    info = write_speculators_data([paths[0]], [paths[1]], tmp_path / "data", FP, [0, 2])
    ds = ArrowDataset(max_len=64, datapath=tmp_path / "data", transfer=FileTransfer(tmp_path / "data/hidden_states"),
                      on_missing="raise", train_ratio=info["train_data_ratio"], split="train")
    want = ShardReader(paths[0])[2]
    assert want["hidden_states"].dtype == torch.float32
    got = ds[2]
    assert got["hidden_states"].dtype == torch.bfloat16
    assert torch.equal(got["hidden_states"], want["hidden_states"].to(torch.bfloat16))
    assert torch.equal(got["verifier_last_hidden_states"], want["verifier_last_hidden_states"].to(torch.bfloat16))


def test_write_refuses_shards_without_eval_or_of_another_run(tiny_shards, tmp_path):
    """No eval rows, another target's shards or other aux layers: refused, naming the folder or the shard, and
    nothing written."""
    d, _, _ = tiny_shards
    with pytest.raises(ValueError, match=r"data: .*8 train, 0 eval"):
        write_speculators_data([d / "train-shard.safetensors"], [], tmp_path / "data", FP, TINY_AUX)
    with pytest.raises(ShardMismatch, match="train-shard.safetensors: target fingerprint fp-tiny but this run's"):
        write_speculators_data([d / "train-shard.safetensors"], [d / "eval-shard.safetensors"], tmp_path / "data",
                               "fp-other", TINY_AUX)
    with pytest.raises(ShardMismatch, match=r"aux_layer_ids \[1, 3, 4\] but this run uses \[1, 3, 5\]"):
        write_speculators_data([d / "train-shard.safetensors"], [d / "eval-shard.safetensors"], tmp_path / "data",
                               FP, [1, 3, 5])
    assert not (tmp_path / "data").exists()


def _peer_route():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import peer_route
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return peer_route


def test_last_checkpoint_is_the_last_epoch(tmp_path):
    """speculators' checkpoint folder (checkpointer.py): epochs 0.. as folders, epochN_end and checkpoint_best as
    links; the last epoch is served, a missing one or an interrupted run is refused."""
    pr = _peer_route()
    save = tmp_path / "ck"
    for e in ("0", "1"):
        (save / e).mkdir(parents=True)
        for f in pr.HEAD_FILES:
            (save / e / f).write_text("x")
    (save / "epoch1_end").symlink_to("1")
    (save / "checkpoint_best").symlink_to("0")
    assert pr.last_checkpoint(save, 2, None, False) == save / "1"
    assert pr.last_checkpoint(save, 5, 100, False) == save / "1"  # max_steps: the highest epoch saved
    with pytest.raises(FileNotFoundError, match=r"ck/2: no config.json and model.safetensors \(epochs saved: \[0, 1\]\)"):
        pr.last_checkpoint(save, 3, None, False)
    (save / "interrupted").mkdir()
    with pytest.raises(RuntimeError, match="interrupted"):
        pr.last_checkpoint(save, 2, None, False)


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
    # a relative target.path is the workdir's (tmp_path), as for snakemake
    shutil.copytree(tiny_target, tmp_path / "tgt")
    overlay.write_text(yaml.safe_dump({"run": "tiny", "target": {"path": "tgt"},
                                       "vocab": {"draft_vocab_size": 32},
                                       "train": {"epochs": 1, "ttt_steps": 2, "total_seq_len": 256, "lr": 0.002,
                                                 "weight_decay": 0.01, "warmup_ratio": 0.1, "seed": 7}}))
    cmd = [sys.executable, str(REPO / "benchmarks/peer_route.py"), "--configfile", str(overlay), "--workdir",
           str(tmp_path), "--out", str(tmp_path / "peer"), "--num-workers", "0", "--dry-run"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:] + (tmp_path / "peer/train.log").read_text()[-3000:]
    rec = json.loads((tmp_path / "peer/peer_route.json").read_text())
    assert rec["data"]["num_train"] == 8 and rec["data"]["num_eval"] == 2
    # the run's settings as speculators resolved them (its run.yaml)
    y = rec["speculators_run_yaml"]["train"]
    assert y["verifier"]["verifier_name_or_path"] == str((tmp_path / "tgt").resolve())
    assert y["draft"]["target_layer_ids"] == TINY_AUX and y["draft"]["draft_vocab_size"] == 32
    assert y["draft"]["full_attention_indices"] == [0]
    assert y["data"]["total_seq_len"] == 256 and y["data"]["train_data_ratio"] == 0.85
    assert (y["loss"]["ttt_steps"], y["optimizer"]["lr"], y["optimizer"]["weight_decay"], y["seed"]) == (2, 0.002, 0.01, 7)
    assert (y["scheduler"]["scheduler_type"], y["scheduler"]["scheduler_warmup_ratio"]) == ("cosine", 0.1)
    assert y["trainer"]["epochs"] == 1 and y["trainer"]["no_resume_from_checkpoint"] is True
    assert y["generation"]["on_missing"] == "raise"
    assert y["loss"]["loss_implementation"] == "eager"  # the run's (config.yaml), not speculators' default "fused"
    head = json.loads((tmp_path / "peer/head/config.json").read_text())
    assert head["speculators_model_type"] == "eagle3" and head["draft_vocab_size"] == 32
    assert head["eagle_aux_hidden_state_layer_ids"] == TINY_AUX
    assert head["transformer_layer_config"]["layer_types"] == ["full_attention"]
    from safetensors.torch import load_file

    from eagle3build.train import build_vocab_map as bv

    bv.build(d / "train.safetensors", 49152, 32, tmp_path / "d2t.npy", tmp_path / "t2d.npy", tmp_path / "v.json")
    w = load_file(tmp_path / "peer/head/model.safetensors")
    assert np.array_equal(w["d2t"].numpy(), np.load(tmp_path / "d2t.npy"))

    shutil.rmtree(res / "hidden_states/eval")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode != 0 and "hidden_states/eval: no shard-*.safetensors" in p.stderr


def test_compare_peer_overlay_names_the_head_peer_route_writes():
    """benchmarks/gpu/compare_peer.yaml serves the head that record.py's `peer` record has peer_route.py write (its
    --out, then /head): a wrong path would stop the device call's plan on a missing input."""
    sys.path.insert(0, str(REPO / "benchmarks/gpu"))
    import record

    heads = yaml.safe_load((REPO / "benchmarks/gpu/compare_peer.yaml").read_text())["benchmark"]["compare_heads"]
    assert heads == [{"name": "speculators", "path": f"{record.PEER_DIR}/head"}]
    assert "benchmarks/gpu/compare_peer.yaml" in record.RECORDS["peer"].configfiles
