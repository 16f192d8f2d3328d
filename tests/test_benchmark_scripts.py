"""The benchmark scripts under benchmarks/ at tiny size on the CPU: they run and print real figures.
(gpu_build.py is smoke-run over the reduced build in test_e2e.py, capture_backends_cpu.py in
test_vllm_capture.py.)"""
from __future__ import annotations

import json
import subprocess
import sys

from smk import REPO


def _run(script, *args, timeout=600):
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args], capture_output=True, text=True,
                       timeout=timeout, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def test_capture_throughput_tiny(tmp_path):
    """A model passed in without a target directory (the benchmark's case) still gets its disk check."""
    _run("capture_throughput.py", "--device", "cpu", "--layers", "7", "--hidden", "64", "--intermediate", "128",
         "--batch", "2", "--seq", "32", "--batches", "2", "--out", str(tmp_path / "o"), "--json", str(tmp_path / "c.json"))
    r = json.loads((tmp_path / "c.json").read_text())
    assert r["tokens_timed"] == 2 * 2 * 32 and r["aux_layer_ids"] == [2, 3, 4]
    bf16 = r["capture_bfloat16"]
    assert bf16["tokens_per_s"] > 0 and bf16["bytes_per_token"] >= 4 * 64 * 2  # 3 aux + 1 last state, bf16
    assert r["capture_float8_e4m3fn"]["bytes_per_token"] < bf16["bytes_per_token"]


def test_train_throughput_tiny(tmp_path):
    _run("train_throughput.py", "--device", "cpu", "--hidden", "64", "--vocab", "1000", "--draft-vocab", "100",
         "--distinct", "50", "--samples", "4", "--eval-samples", "2", "--seq", "64", "--total-seq-len", "128",
         "--epochs", "1", "--out", str(tmp_path / "o"), "--json", str(tmp_path / "t.json"))
    r = json.loads((tmp_path / "t.json").read_text())
    assert r["flops_per_token"] > 0 and r["ours"]["tokens_per_s"] > 0
    assert 1.0 <= r["ours"]["simulated_acceptance_length"] <= 4.0
