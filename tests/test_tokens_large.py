"""Issue 38.7: a tokens file of millions of samples: the sample ids live in a tensor, not in the safetensors
header (capped at 100 MB, full at about 1.8 M ids); files of the previous schema still read."""
from __future__ import annotations

import json

import numpy as np
import pytest

from eagle3build.formats import tokens as tk


def test_three_million_one_token_samples(tmp_path):
    n = 3_000_000
    ids = np.arange(n, dtype=np.int32) % 1000
    one = np.ones(1, np.uint8)
    samples = [(f"ultrachat_200k/train_sft/{i:012d}", ids[i:i + 1], one) for i in range(n)]  # ids of 37 chars
    f = tmp_path / "train.safetensors"
    tk.write_tokens(f, samples)
    del samples
    t = tk.read_tokens(f)
    assert len(t) == n and t.sample_ids[-1] == f"ultrachat_200k/train_sft/{n - 1:012d}"
    assert t.sample(n - 1)[0].tolist() == [(n - 1) % 1000] and t.offsets[-1] == n
    header = int.from_bytes(f.read_bytes()[:8], "little")
    assert header < 10_000  # the ids are not in it


def test_previous_schema_still_reads(tmp_path):
    from safetensors.numpy import save_file

    f = tmp_path / "old.safetensors"
    save_file({"input_ids": np.array([5, 6, 7], np.int32), "loss_mask": np.array([0, 1, 1], np.uint8),
               "offsets": np.array([0, 1, 3], np.int64)}, str(f),
              metadata={"schema": "eagle3build.tokens/1", "sample_ids": json.dumps(["a", "b"])})
    t = tk.read_tokens(f)
    assert t.sample_ids == ["a", "b"] and t.sample(1)[0].tolist() == [6, 7]


def test_ids_that_do_not_match_the_offsets_are_named(tmp_path):
    from safetensors.numpy import save_file

    f = tmp_path / "bad.safetensors"
    save_file({"input_ids": np.array([5], np.int32), "loss_mask": np.array([1], np.uint8),
               "offsets": np.array([0, 1], np.int64),
               "sample_ids": np.frombuffer(json.dumps(["a", "b"]).encode(), np.uint8)}, str(f),
              metadata={"schema": tk.TOKENS_SCHEMA})
    with pytest.raises(tk.DataError, match="2 sample ids for 1 samples") as e:
        tk.read_tokens(f)
    assert str(f) in str(e.value)


def test_writing_holds_no_copy_of_the_file(tmp_path):
    """A 100 MB tokens file (2e7 tokens) is written with less than its size in extra memory (the writer
    held the whole file as bytes and a spliced copy of it: 3.3x its size), and with the same bytes as
    before (its header sorted in place)."""
    import subprocess
    import sys

    code = f"""
import resource, numpy as np
from eagle3build.formats import tokens as tk
n, t = 20_000, 1_000
ids = np.arange(n * t, dtype=np.int32)
mask = np.ones(n * t, np.uint8)
samples = [(f"s{{i}}", ids[i * t:(i + 1) * t], mask[i * t:(i + 1) * t]) for i in range(n)]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tk.write_tokens({str(tmp_path / "t.safetensors")!r}, samples)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""
    extra = int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    size = (tmp_path / "t.safetensors").stat().st_size
    assert size > 100_000_000 and extra < size
    t = tk.read_tokens(tmp_path / "t.safetensors")
    assert len(t) == 20_000 and t.sample(19_999)[0][-1] == 20_000 * 1_000 - 1 and t.sample_ids[7] == "s7"
