"""What one training step launches (issue 70): ops a step, compiled graphs a step, graph breaks and recompiles.

``profile_steps`` runs a step function under torch's profiler and counts, per step:

- ``dispatched_ops``: the operators the host dispatches, ATen ops that no other op called (from Python, from the
  autograd engine, from an inductor-generated wrapper) and inductor's generated kernels (CPU: ``cpp_fused_*``, named
  in the profile where ``torch._inductor.config.cpp.enable_kernel_profile`` is on; CUDA: the ``triton_*`` launches);
- ``kernel_ops``: of those, the ones that compute (``VIEW_OR_ALLOC``, ops that move no data, left out): what a GPU
  would run as kernels;
- ``compiled_graphs``: calls of compiled graphs, forward (dynamo's ``Torch-Compiled Region``) and backward
  (AOTAutograd's ``CompiledFunctionBackward``); ``graph_breaks`` = forward graphs - 1 where any ran (None for an
  eager step: nothing is compiled);
- on CUDA ``kernel_launches`` (the runtime's ``cudaLaunchKernel``-like calls), ``graph_launches``
  (``cudaGraphLaunch``), the kernels' own milliseconds and the GPU's busy share (kernel time over wall time).

``DynamoCounts`` reads dynamo's own figures around a span of steps: graph breaks as dynamo traced them
(``torch._dynamo.utils.counters["graph_break"]``), graphs compiled, and recompiles (a frame compiled again:
``torch._dynamo.convert_frame.FRAME_COMPILE_COUNTER``, what ``TORCH_LOGS=recompiles`` reports).
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

import torch

# ATen ops that launch no kernel (views, metadata, allocation)
VIEW_OR_ALLOC = frozenset(f"aten::{n}" for n in (
    "view", "reshape", "as_strided", "slice", "select", "unsqueeze", "squeeze", "expand", "t", "transpose", "permute",
    "detach", "detach_", "alias", "_unsafe_view", "unbind", "split", "split_with_sizes", "chunk", "narrow", "empty",
    "empty_strided", "empty_like", "lift_fresh", "_reshape_alias", "resolve_conj", "resolve_neg", "set_", "stride",
    "size", "numel", "dim", "is_same_size", "result_type", "_has_compatible_shallow_copy_type", "expand_as",
    "view_as", "flatten", "unflatten", "movedim",
))
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel")


def _is_op(name: str) -> bool:
    return name.startswith("aten::") or "cpp_fused" in name or name.startswith("triton_")


def count_events(events) -> dict:
    """The counts of the module docstring over profiler ``events`` (``prof.events()``: each with ``name`` and
    ``cpu_parent``), summed over however many steps they hold; ``kernels``: ``kernel_ops`` by name."""
    out: collections.Counter = collections.Counter()
    names: collections.Counter = collections.Counter()
    for e in events:
        name = e.name
        if name.startswith("Torch-Compiled Region"):
            out["forward_graphs"] += 1
        elif name == "CompiledFunctionBackward":
            out["backward_graphs"] += 1
        elif name.startswith(LAUNCHES):
            out["kernel_launches"] += 1
        elif name.startswith("cudaGraphLaunch"):
            out["graph_launches"] += 1
        if not _is_op(name):
            continue
        p = e.cpu_parent
        while p is not None and not _is_op(p.name):
            p = p.cpu_parent
        if p is not None:
            continue  # called by another op: not a dispatch of its own
        out["dispatched_ops"] += 1
        if name not in VIEW_OR_ALLOC:
            out["kernel_ops"] += 1
            names[name] += 1
    return {**out, "kernels": names}


def profile_steps(step, n: int, cuda: bool) -> dict:
    """``n`` calls of ``step`` under torch's profiler: per step ``dispatched_ops``, ``kernel_ops``,
    ``compiled_graphs`` (forward + backward), ``graph_breaks`` (forward graphs - 1; None without one),
    ``profiled_step_ms``; on CUDA also ``kernel_launches``, ``graph_launches``, ``kernel_ms`` and ``gpu_busy_share``;
    ``top_kernel_ops``: the 12 most frequent kernel ops a step."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        t = time.perf_counter()
        for _ in range(n):
            step()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
    c = count_events(prof.events())
    fwd = c.get("forward_graphs", 0) / n
    out = {"dispatched_ops": round(c.get("dispatched_ops", 0) / n, 1), "kernel_ops": round(c.get("kernel_ops", 0) / n, 1),
           "compiled_graphs": round((c.get("forward_graphs", 0) + c.get("backward_graphs", 0)) / n, 1),
           "graph_breaks": round(fwd - 1, 1) if fwd else None, "profiled_step_ms": round(1e3 * wall / n, 2),
           "top_kernel_ops": {k: round(v / n, 1) for k, v in c["kernels"].most_common(12)}}
    if cuda:
        ev = prof.key_averages()
        kernel_us = sum(e.self_device_time_total for e in ev if e.device_type == torch.autograd.DeviceType.CUDA)
        out.update(kernel_launches=round(c.get("kernel_launches", 0) / n, 1),
                   graph_launches=round(c.get("graph_launches", 0) / n, 1), kernel_ms=round(kernel_us / 1e3 / n, 2),
                   gpu_busy_share=round(kernel_us / 1e6 / wall, 3))
    return out


@dataclass
class DynamoCounts:
    """dynamo's figures from ``start()`` to ``read()``: graph breaks traced, graphs compiled, recompiles."""

    breaks: int = 0
    graphs: int = 0
    frames: dict = field(default_factory=dict)

    def start(self) -> DynamoCounts:
        from torch._dynamo.convert_frame import FRAME_COMPILE_COUNTER
        from torch._dynamo.utils import counters

        self.breaks = sum(counters["graph_break"].values())
        self.graphs = counters["stats"]["unique_graphs"]
        self.frames = dict(FRAME_COMPILE_COUNTER)
        return self

    def read(self) -> dict:
        """``{"graph_breaks_traced", "graphs_compiled", "recompiles"}`` since ``start``: breaks dynamo met while
        tracing (each trace of a frame counts its own), graphs it compiled, compiles of a frame after its first."""
        from torch._dynamo.convert_frame import FRAME_COMPILE_COUNTER
        from torch._dynamo.utils import counters

        before = self.frames
        # a frame new since start: its first compile is no recompile
        recompiles = sum(n - before.get(f, 0) - (0 if before.get(f, 0) else 1)
                         for f, n in FRAME_COMPILE_COUNTER.items() if n > before.get(f, 0))
        return {"graph_breaks_traced": sum(counters["graph_break"].values()) - self.breaks,
                "graphs_compiled": counters["stats"]["unique_graphs"] - self.graphs, "recompiles": recompiles}
