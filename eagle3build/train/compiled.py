"""speculators' draft models as a few large graphs: the training forward (loss included) compiled whole, and the graph
breaks speculators forces taken out where asked.

A private module of the train subpackage (it imports no stage module); ``train_draft.setup`` applies it.

speculators compiles each draft model's ``forward`` where CUDA is available (speculators/models/utils.py,
``conditional_torch_compile``: ``torch.compile`` in its default mode, at class definition) and holds breaks inside it:

- ``first_layer``: EAGLE-3's first decoder layer calls ``torch._dynamo.graph_break()`` on torch >= 2.10
  (speculators/models/eagle3/model_definitions.py, ``Eagle3FirstLayerMixin.forward``, line 88: a workaround for
  pytorch #175250, a fused backward kernel over the H100's shared memory), once per TTT step; P-EAGLE's layer is
  EAGLE-3's;
- ``mask_extension``: EAGLE-3's flex-attention block mask is extended for each TTT step by
  ``extend_mask_for_draft_tokens``, ``@torch.compiler.disable`` (speculators/models/eagle3/attention.py, line 37);
  only on the flex-attention path (CUDA); the dense mask of ``sdpa`` (CPU) is extended in the graph;
- DFlash builds its anchors and masks under ``@torch.compiler.disable`` (speculators/models/dflash/core.py,
  ``_build_attention_mask``, line 346): a data-dependent anchor choice, kept; around it the step runs as three
  graphs (dynamo's counters: two breaks, the call into ``_backbone_forward`` and the builder);
- P-EAGLE draws its COD samples with data-dependent sizes (speculators/models/peagle/data.py,
  ``generate_cod_sample_indices``): its graphs cannot have static shapes (``DraftMethod.static_shapes``).

With a graph break inside a layer, dynamo (``nested_graph_breaks`` off) compiles the forward as many fragments: the
loop of TTT steps is cut at each call of the first layer, each resumed in a function of its own. ``compile_model``
instead compiles the model's call whole (forward, loss and, through AOTAutograd, backward), with static shapes where
the method has them (a step is ``total_seq_len`` packed tokens), in a ``torch.compile`` mode that may capture CUDA
graphs (``reduce-overhead``). The breaks named in ``remove`` are taken out of this model instance only, by giving its
forward functions the same code with other globals (``_with_globals``): upstream's code runs as written, nothing is
forked or copied, and other instances and processes keep upstream's behaviour.

Each method's accuracy counts ``masked_select`` the supervised positions (speculators/models/metrics.py): an output
size that depends on the data, so a graph break, a device-to-host sync and no CUDA graph (inductor skips CUDA graphs
for a graph with unbacked sizes). In a compiled model its ``compute_metrics`` reads ``accuracy_single_step`` and
``accuracy_multi_step`` instead: the same counts with static shapes.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch

# torch.compile modes (torch.compile's docstring); "reduce-overhead" and "max-autotune" capture CUDA graphs on CUDA
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")
# the breaks ``compile_model`` can take out (the module docstring)
BREAKS = ("first_layer", "mask_extension")


class CompileError(RuntimeError):
    """speculators' code is not what this module patches (an upgrade moved it): the message names the function."""


@dataclass(frozen=True)
class CompilePlan:
    """How a training run computes its draft model's forward, loss and backward.

    ``mode``: a ``COMPILE_MODES`` mode for the whole call (``compile_model``), or None: not compiled by us, the
    forward speculators' own (``speculators``: its class-level compile, on CUDA only unless ``emulate``; else eager);
    ``speculators``: leave speculators' class-level compile of ``forward`` in place (today's CUDA path);
    ``emulate``: compile ``forward`` as ``conditional_torch_compile`` does on CUDA (default mode) on any device, so a
    CPU can measure that path; ``remove``: the ``BREAKS`` taken out; ``dynamic``: torch.compile's ``dynamic``
    (False: static shapes; None: dynamo's automatic dynamic shapes, for a method without static shapes);
    ``backend``: torch.compile's (``inductor``; a test may trace with ``aot_eager``, whose kernels are eager ones:
    dynamo's graphs and AOTAutograd's backward without inductor's compile time)."""

    mode: str | None = None
    speculators: bool = False
    emulate: bool = False
    remove: frozenset[str] = frozenset()
    dynamic: bool | None = False
    backend: str = "inductor"

    @property
    def cudagraphs(self) -> bool:
        """Whether the mode captures CUDA graphs (on a CUDA device)."""
        return self.mode in CUDAGRAPH_MODES

    def describe(self) -> str:
        """One line for logs and benchmark JSON: ``reduce-overhead, static shapes, breaks removed: first_layer``."""
        if self.mode is None:
            return "speculators' forward compile" + (" (emulated)" if self.emulate else "") if self.speculators \
                else "eager (nothing compiled)"
        return (f"{self.mode}, {'static' if self.dynamic is False else 'automatic dynamic'} shapes, breaks removed: "
                f"{', '.join(sorted(self.remove)) or 'none'}")


def resolve_plan(compile_setting: str, breaks_setting: str, device: str, static_shapes: bool = True, *,
                 distributed: bool = False, rows_per_step: int = 1, online: bool = False) -> CompilePlan:
    """The ``CompilePlan`` of config ``train.compile`` (``compile_setting``) and ``train.compile_breaks``
    (``breaks_setting``) on ``device`` for a method with or without ``static_shapes``, under DDP (``distributed``)
    or not, with ``rows_per_step`` packed rows computed by this process before each optimizer step, beside an
    ``online`` target in the same process or not.

    ``train.compile``: ``auto`` (CUDA: ``reduce-overhead``, CUDA graphs, where the method has static shapes and one
    process runs alone; else ``default``: CUDA graphs record a graph per shape, and DDP under CUDA graphs is untried;
    beside an online target, whose engine compiles and captures graphs of its own in the process, ``speculators``, the
    path such runs were recorded with; elsewhere ``off``: compiling on a few CPU cores costs more than a short run
    saves), ``off`` (eager; speculators' own compile bypassed), ``speculators`` (its class-level compile of the
    forward: compiled on CUDA only, as before issue 70), or a ``COMPILE_MODES`` mode; a CUDA-graph mode becomes its
    mode without CUDA graphs where
    ``rows_per_step`` > 1 (a second row's backward would write over the first row's gradients, which the graphs'
    memory holds). ``train.compile_breaks``: ``auto`` (CUDA: ``keep``, since pytorch #175250, a torch >= 2.10
    regression, may still hold there; elsewhere ``remove``), ``keep``, ``remove`` (all ``BREAKS``) or one break's name.

    Raises:
        ValueError: a setting outside those choices.
    """
    cuda = device.startswith("cuda")
    if compile_setting == "auto" and cuda:
        compile_setting = ("speculators" if online else "reduce-overhead" if static_shapes and not distributed
                           else "default")
    elif compile_setting == "auto":
        compile_setting = "off"
    if breaks_setting == "auto":
        breaks_setting = "keep" if cuda else "remove"
    if breaks_setting == "keep":
        remove: frozenset[str] = frozenset()
    elif breaks_setting == "remove":
        remove = frozenset(BREAKS)
    elif breaks_setting in BREAKS:
        remove = frozenset({breaks_setting})
    else:
        raise ValueError(f"train.compile_breaks {breaks_setting!r} is not one of {['auto', 'keep', 'remove', *BREAKS]}")
    if compile_setting == "off":
        return CompilePlan()
    if compile_setting == "speculators":
        return CompilePlan(speculators=True)
    if compile_setting not in COMPILE_MODES:
        raise ValueError(f"train.compile {compile_setting!r} is not one of "
                         f"{['auto', 'off', 'speculators', *COMPILE_MODES]}")
    if rows_per_step > 1 and compile_setting in CUDAGRAPH_MODES:
        compile_setting = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}[compile_setting]
    return CompilePlan(mode=compile_setting, remove=remove, dynamic=False if static_shapes else None)


def _unwrapped(fn):
    """``fn`` without torch.compile's or ``torch.compiler.disable``'s wrapper (``_torchdynamo_orig_callable``)."""
    while hasattr(fn, "_torchdynamo_orig_callable"):
        fn = fn._torchdynamo_orig_callable
    return fn


def _with_globals(fn, **names):
    """A copy of plain function ``fn`` (same code, defaults and closure) that looks up ``names`` in place of its
    module's globals of those names.

    Raises:
        CompileError: ``fn`` reads none of ``names`` (the code patched is not upstream's any more).
    """
    missing = [n for n in names if n not in fn.__code__.co_names]
    if missing:
        raise CompileError(f"{fn.__module__}.{fn.__qualname__} no longer reads {missing}: speculators changed; "
                           "eagle3build/train/compiled.py patches what it read in speculators 0.9.0")
    new = types.FunctionType(fn.__code__, {**fn.__globals__, **names}, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    return new


def _no_graph_break(msg: str = "") -> None:
    """In place of ``torch._dynamo.graph_break`` for the code ``_torch_without_graph_break`` is handed to."""


def _torch_without_graph_break() -> types.ModuleType:
    """A module namespace with torch's names in which ``torch._dynamo.graph_break`` is ``_no_graph_break``: the
    ``torch`` global of the first layer's forward (module docstring, ``first_layer``); the real ``torch`` is
    untouched."""
    dyn = types.ModuleType("torch._dynamo")
    dyn.__dict__.update(vars(torch._dynamo))
    dyn.graph_break = _no_graph_break
    shim = types.ModuleType("torch")
    shim.__dict__.update(vars(torch))
    shim._dynamo = dyn
    return shim


def accuracy_single_step(pred_ids, target_ids, loss_mask, prev_correct):
    """speculators' ``compute_accuracy_single_step`` (speculators/models/metrics.py) with static shapes: the same four
    0-d fp32 counts ``(full_correct, full_total, cond_correct, cond_total)``, bit for bit (sums of 0/1 below 2**24 are
    exact in any order), with the supervised positions counted by a mask product instead of ``masked_select``, whose
    output size depends on the data (a graph break, a device-to-host sync and no CUDA graph). Written here because
    speculators has no static-shape form of it. ``pred_ids``, ``target_ids``: ``[1, seq_len]`` token ids;
    ``loss_mask``: ``[1, seq_len]`` or None; ``prev_correct``: ``[1, seq_len]`` bool or None, updated in place as
    upstream's (AND with this step's hits)."""
    correct = pred_ids == target_ids
    cond_total = torch.tensor(correct.numel(), dtype=torch.float, device=correct.device)
    if prev_correct is not None:
        cond_total = prev_correct.sum().float()
        correct = torch.logical_and(prev_correct, correct, out=prev_correct)
    if loss_mask is None:
        correct_sum = correct.float().sum()
        full_total = torch.tensor(correct.numel(), dtype=torch.float, device=correct.device)
    else:
        keep = loss_mask.to(torch.bool)
        correct_sum = (correct & keep).float().sum()
        full_total = keep.float().sum()
    return correct_sum, full_total, correct_sum.clone(), cond_total


def accuracy_multi_step(pred_ids, target_ids, loss_mask, pos_idx, num_pos: int):
    """speculators' ``compute_accuracy_multi_step`` (speculators/models/metrics.py) with static shapes:
    ``(correct_per_pos, total_per_pos)``, each ``[num_pos]`` fp32, bit for bit as upstream's (exact integer sums),
    the supervised positions weighted 0/1 instead of ``masked_select``ed (``accuracy_single_step`` says why).
    ``pos_idx``: ``[1, seq_len]`` int64, each position's index in its block (< ``num_pos``)."""
    keep = loss_mask.to(torch.bool).reshape(-1)
    correct = ((pred_ids == target_ids).reshape(-1) & keep).float()
    pos = pos_idx.reshape(-1)
    correct_per_pos = torch.zeros(num_pos, dtype=torch.float, device=correct.device)
    total_per_pos = torch.zeros(num_pos, dtype=torch.float, device=correct.device)
    correct_per_pos.scatter_add_(0, pos, correct)
    total_per_pos.scatter_add_(0, pos, keep.float())
    return correct_per_pos, total_per_pos


def _static_metrics(compute_metrics):
    """speculators' ``compute_metrics`` of a method (its ``metrics.py``) reading ``accuracy_single_step`` and
    ``accuracy_multi_step`` in place of upstream's accuracy functions (those of them it reads)."""
    names = {"compute_accuracy_single_step": accuracy_single_step, "compute_accuracy_multi_step": accuracy_multi_step}
    return _with_globals(compute_metrics, **{k: v for k, v in names.items() if k in compute_metrics.__code__.co_names})


def prepare_forward(model: torch.nn.Module, remove: frozenset[str], static_metrics: bool = True) -> list[str]:
    """Put ``model``'s forward (speculators' draft model: ``Eagle3DraftModel``, its subclass P-EAGLE, or DFlash) in as
    an instance attribute without speculators' class-level compile; with ``static_metrics`` its ``compute_metrics``
    counting accuracy with static shapes (``accuracy_single_step``, ``accuracy_multi_step``); without the ``remove``
    breaks (``BREAKS``; a model without such a break, DFlash, has none to remove). Other instances keep upstream's
    behaviour. Returns what was changed, one ``upstream file: what`` line each.

    Raises:
        CompileError: a function patched no longer reads the names patched (speculators changed).
    """
    from speculators.models.eagle3 import model_definitions

    done: list[str] = []
    forward = _unwrapped(type(model).forward)
    names: dict = {}
    if static_metrics and "compute_metrics" in forward.__code__.co_names:
        names["compute_metrics"] = _static_metrics(forward.__globals__["compute_metrics"])
        done.append(f"{forward.__globals__['compute_metrics'].__module__}.compute_metrics: accuracy without "
                    "masked_select (speculators/models/metrics.py)")
    layers = getattr(model, "layers", [])
    first = layers[0] if len(layers) else None
    if "first_layer" in remove and isinstance(first, model_definitions.Eagle3FirstLayerMixin):
        fn = _with_globals(_unwrapped(model_definitions.Eagle3FirstLayerMixin.forward),
                           torch=_torch_without_graph_break())
        first.forward = types.MethodType(fn, first)
        done.append("speculators/models/eagle3/model_definitions.py: Eagle3FirstLayerMixin.forward's graph_break")
    if "mask_extension" in remove and "extend_mask_for_draft_tokens" in forward.__code__.co_names:
        names["extend_mask_for_draft_tokens"] = _unwrapped(forward.__globals__["extend_mask_for_draft_tokens"])
        done.append("speculators/models/eagle3/attention.py: extend_mask_for_draft_tokens's compiler.disable")
    model.forward = types.MethodType(_with_globals(forward, **names) if names else forward, model)
    return done


def compile_model(model: torch.nn.Module, plan: CompilePlan) -> torch.nn.Module:
    """Set ``model`` (speculators' draft model) up to compute as ``plan`` says, in place, and return it.

    ``plan.mode`` None: the forward speculators' class-level compile made (``speculators``; compiled in default mode
    where ``emulate``, as on CUDA), or eager (``forward`` without speculators' wrapper). Else ``prepare_forward``, then
    ``model.compile`` (``torch.nn.Module.compile``: the module's call, forward and loss, compiled in ``plan.mode``,
    its backward by AOTAutograd at the first backward) with ``plan.dynamic``.
    """
    if plan.mode is None:
        if plan.speculators:
            if plan.emulate:  # speculators/models/utils.py: torch.compile(forward) in default mode, as on CUDA
                model.forward = torch.compile(types.MethodType(_unwrapped(type(model).forward), model))
        else:
            model.forward = types.MethodType(_unwrapped(type(model).forward), model)
        return model
    prepare_forward(model, plan.remove)
    if set(BREAKS) - plan.remove:
        # a break kept in the TTT loop compiles the frames after it once per TTT step (the KV cache grows), more than
        # dynamo's default 8 graphs a frame at 8 steps or more, after which it would run them eagerly
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    if plan.backend == "inductor":
        model.compile(mode=plan.mode, dynamic=plan.dynamic)
    else:  # torch.compile takes a mode for inductor only
        model.compile(backend=plan.backend, dynamic=plan.dynamic)
    return model
