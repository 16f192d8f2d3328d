"""benchmarks/benchlab/step_profile.py: what one training step launches, counted from profiler events (issue 70)."""
from __future__ import annotations

from types import SimpleNamespace

import torch
from benchlab.step_profile import DynamoCounts, count_events


def _ev(name, parent=None):
    return SimpleNamespace(name=name, cpu_parent=parent)


def test_only_outermost_ops_count_and_views_launch_nothing():
    """An op called by another op is no dispatch of its own; views and allocations are dispatched, not kernels;
    inductor's C++ kernels count; compiled graphs are counted forward and backward; a backward under the autograd
    engine's event is outermost (no op above it)."""
    linear = _ev("aten::linear")
    region = _ev("Torch-Compiled Region: 0/0")
    engine = _ev("autograd::engine::evaluate_function: MmBackward0")
    events = [linear, _ev("aten::t", linear), _ev("aten::addmm", linear), _ev("aten::view"), region,
              _ev("graph_0_cpp_fused_add_mul_0", region), _ev("aten::mm", region), _ev("aten::empty_strided", region),
              engine, _ev("aten::mm", engine), _ev("CompiledFunctionBackward"),
              _ev("autograd::engine::evaluate_function: CompiledFunctionBackward"), _ev("cudaLaunchKernel"),
              _ev("cudaGraphLaunch")]
    c = count_events(events)
    assert (c["dispatched_ops"], c["kernel_ops"]) == (6, 4)  # linear, view, cpp kernel, mm, empty_strided, mm
    assert dict(c["kernels"]) == {"aten::linear": 1, "graph_0_cpp_fused_add_mul_0": 1, "aten::mm": 2}
    assert (c["forward_graphs"], c["backward_graphs"], c["kernel_launches"], c["graph_launches"]) == (1, 1, 1, 1)


def test_dynamo_counts_a_break_and_a_recompile():
    """A function with a forced graph break, then called with another shape (static shapes: compiled again)."""
    torch._dynamo.reset()

    def f(x):
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    g = torch.compile(f, backend="eager", dynamic=False)
    d = DynamoCounts().start()
    g(torch.ones(3))
    first = d.read()
    assert first["graph_breaks_traced"] == 1 and first["graphs_compiled"] == 2 and first["recompiles"] == 0
    d = DynamoCounts().start()
    g(torch.ones(3))
    assert d.read() == {"graph_breaks_traced": 0, "graphs_compiled": 0, "recompiles": 0}
    g(torch.ones(5))
    again = d.read()
    assert again["recompiles"] >= 1 and again["graphs_compiled"] == 2
