"""The CPU bf16 check: a capture in bf16 on a CPU without native bf16 is named in the compat report and the job log."""

import warnings

import pytest

from eagle3build.compat.probes import check_cpu_capture_dtype, run_probe
from eagle3build.config.provenance import cpu_bf16_support

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
ZEN4 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: avx2 avx512f amx_bf16 amx_tile\n"


@pytest.mark.parametrize("text, native, flags", [
    (AVX2_ONLY, False, []), (ZEN4, True, ["avx512_bf16"]), (SAPPHIRE, True, ["amx_bf16"]),
    ("processor\t: 0\nmodel name\t: something\n", None, []),
])
def test_cpu_bf16_support_reads_flags(tmp_path, text, native, flags):
    f = tmp_path / "cpuinfo"
    f.write_text(text)
    assert cpu_bf16_support(f) == {"native_bf16": native, "flags": flags}


def test_cpu_bf16_support_unreadable(tmp_path):
    assert cpu_bf16_support(tmp_path / "absent") == {"native_bf16": None, "flags": []}


def test_probe_warns_only_for_emulated_bf16_on_cpu():
    no = {"native_bf16": False, "flags": []}
    p = run_probe("cpu_capture_dtype", lambda: check_cpu_capture_dtype("bfloat16", 0, no))
    assert p.status == "warn" and p.value == {"compute_dtype": "bfloat16", "device": "cpu", "native_bf16": False,
                                              "flags": []}
    assert len(p.warnings) == 1 and "29x slower" in p.warnings[0] and "capture.compute_dtype: auto" in p.warnings[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these may warn
        assert check_cpu_capture_dtype("float32", 0, no)["device"] == "cpu"
        assert check_cpu_capture_dtype("auto", 0, no)["compute_dtype"] == "auto"
        assert check_cpu_capture_dtype("bfloat16", 1, no)["device"] == "cuda"
        assert check_cpu_capture_dtype("bfloat16", 0, {"native_bf16": True, "flags": ["avx512_bf16"]})
        assert check_cpu_capture_dtype("bfloat16", 0, {"native_bf16": None, "flags": []})
