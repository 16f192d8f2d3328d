"""The training step as a few large graphs (issue 70): eagle3build/train/compiled.py compiles speculators' draft model's
call whole, takes its forced graph breaks out of one instance, counts accuracy with static shapes; the trainer picks
the optimizer, the loss and the compile plan by device (train.compile, train.compile_breaks, train.loss_implementation).
On the tiny target's shards (tests/conftest.py: tiny_target, tiny_shards), on the CPU."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from eagle3build.draft.choice import resolve
from eagle3build.draft.head_model import build_model
from eagle3build.train import compiled, fused_loss
from eagle3build.train import train_draft as td
from eagle3build.train.train_data import Batches, BatchLayout
from eagle3build.train.trainer import TrainConfig, forward, loss_implementation

TINY_AUX = [1, 3, 4]


def test_static_accuracy_counts_what_speculators_counts():
    """accuracy_single_step and accuracy_multi_step give speculators' own counts bit for bit (and leave prev_correct
    as upstream does), without masked_select."""
    from speculators.models.metrics import compute_accuracy_multi_step, compute_accuracy_single_step

    g = torch.Generator().manual_seed(0)
    for n in (1, 7, 300):
        pred, target = torch.randint(0, 4, (1, n), generator=g), torch.randint(0, 4, (1, n), generator=g)
        for mask in (None, torch.randint(0, 2, (1, n), generator=g), torch.zeros(1, n, dtype=torch.long)):
            prev = torch.rand(1, n, generator=g) < 0.7
            p1, p2 = prev.clone(), prev.clone()
            theirs = compute_accuracy_single_step(pred, target, mask, p1)
            ours = compiled.accuracy_single_step(pred, target, mask, p2)
            assert [t.dtype for t in ours] == [t.dtype for t in theirs] == [torch.float32] * 4
            assert torch.equal(torch.stack(ours), torch.stack(theirs)) and torch.equal(p1, p2), (n, mask)
            if mask is None:
                continue
            pos = torch.arange(n).unsqueeze(0) % 4
            theirs = compute_accuracy_multi_step(pred, target, mask.float(), pos, 4)
            ours = compiled.accuracy_multi_step(pred, target, mask.float(), pos, 4)
            assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True)), (n, mask)


@pytest.mark.parametrize("setting,breaks,device,static,kw,want", [
    ("auto", "auto", "cpu", True, {}, compiled.CompilePlan()),
    ("auto", "auto", "cuda", True, {}, compiled.CompilePlan(mode="reduce-overhead")),
    ("auto", "auto", "cuda:1", False, {}, compiled.CompilePlan(mode="default", dynamic=None)),
    ("auto", "remove", "cuda", True, {"distributed": True},
     compiled.CompilePlan(mode="default", remove=frozenset(compiled.BREAKS))),
    ("max-autotune", "first_layer", "cuda", True, {"rows_per_step": 2},
     compiled.CompilePlan(mode="max-autotune-no-cudagraphs", remove=frozenset({"first_layer"}))),
    ("default", "auto", "cpu", True, {}, compiled.CompilePlan(mode="default", remove=frozenset(compiled.BREAKS))),
    ("speculators", "auto", "cuda", True, {}, compiled.CompilePlan(speculators=True)),
    ("auto", "auto", "cuda", True, {"online": True}, compiled.CompilePlan(speculators=True)),
    ("auto", "auto", "cpu", True, {"online": True}, compiled.CompilePlan()),
    ("off", "keep", "cuda", True, {}, compiled.CompilePlan()),
])
def test_the_plan_by_setting_and_device(setting, breaks, device, static, kw, want):
    assert compiled.resolve_plan(setting, breaks, device, static, **kw) == want


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match=r"train.compile 'fast' is not one of \['auto', 'off', 'speculators', 'def"):
        compiled.resolve_plan("fast", "auto", "cpu")
    with pytest.raises(ValueError, match=r"train.compile_breaks 'some' is not one of"):
        compiled.resolve_plan("default", "some", "cpu")
    with pytest.raises(ValueError, match="'fused' needs CUDA"):
        loss_implementation("fused", "cpu")
    assert [loss_implementation("auto", d) for d in ("cpu", "cuda", "cuda:3")] == ["eager", "fused", "fused"]


def test_the_optimizer_by_device():
    """AdamW is fused on CUDA (one kernel per step) and foreach elsewhere (one op per update for all parameters)."""
    model = torch.nn.Linear(4, 4)
    cfg = TrainConfig()
    _, cpu, _ = td._optimizer(model, cfg, 10, "cpu")
    _, cuda, _ = td._optimizer(model, cfg, 10, "cuda")  # fused AdamW takes CPU tensors too: built, not stepped
    assert (cpu.defaults["foreach"], cpu.defaults["fused"]) == (True, False)
    assert (cuda.defaults["foreach"], cuda.defaults["fused"]) == (False, True)


def test_a_state_resumes_under_another_compile_setting():
    """train.compile and train.compile_breaks change how a step is computed, not what: they are no part of the
    settings a saved state must match (the state key), as checkpoint_every is not."""
    a, b = TrainConfig(), TrainConfig(compile="max-autotune", compile_breaks="keep", checkpoint_every=7)
    assert a.settings() == b.settings() and "compile" not in a.settings()
    assert TrainConfig(loss_implementation="auto").settings() != a.settings()


def _model(tiny_shards, tiny_target, ttt_steps=3, method="eagle3"):
    d, _, _ = tiny_shards
    from eagle3build.draft import vocab_map

    d2t, t2d, _ = vocab_map.load(d / "d2t.npy", d / "t2d.npy", d / "vocab.json")
    draft = resolve({"method": method})
    torch.manual_seed(0)
    model = build_model(str(tiny_target), TINY_AUX, d2t, t2d, ttt_steps, "eagle3.1", "cpu", trust_remote_code=False,
                        draft=draft)
    b = Batches([str(d / "train-shard.safetensors")], BatchLayout(128, 64, 3, torch.float32, 0, noise_std=0.0,
                                                                   shift=draft.method.shifted))
    return model, b.to_device(b.load(b.epoch(0)[0][0]), "cpu"), draft.trainer_kwargs(ttt_steps, 0.8, "eager")


def test_the_breaks_are_taken_out_of_one_instance_only(tiny_shards, tiny_target):
    """The first layer's forward of a prepared model reads a torch whose graph_break is a no-op; the class's function,
    another model and torch itself keep upstream's."""
    from speculators.models.eagle3.model_definitions import Eagle3FirstLayerMixin

    model, _, _ = _model(tiny_shards, tiny_target)
    other, _, _ = _model(tiny_shards, tiny_target)
    done = compiled.prepare_forward(model, frozenset(compiled.BREAKS))
    assert any("Eagle3FirstLayerMixin.forward's graph_break" in x for x in done)
    assert any("accuracy without masked_select" in x for x in done)
    patched = model.layers[0].forward.__func__
    assert patched.__code__ is compiled._unwrapped(Eagle3FirstLayerMixin.forward).__code__  # upstream's code
    assert patched.__globals__["torch"]._dynamo.graph_break is compiled._no_graph_break
    assert patched.__globals__["torch"].cat is torch.cat
    assert torch._dynamo.graph_break is not compiled._no_graph_break
    assert "forward" not in vars(other.layers[0]) and "forward" not in vars(other)
    assert compiled._unwrapped(Eagle3FirstLayerMixin.forward).__globals__["torch"] is torch
    with pytest.raises(compiled.CompileError, match=r"no longer reads \['nothing_of_that_name'\]: speculators changed"):
        compiled._with_globals(patched, nothing_of_that_name=1)


def _step(model, batch, call):
    model.zero_grad(set_to_none=True)
    _, loss, metrics = forward(model, batch, call)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, metrics


def test_the_compiled_step_is_the_eager_one_with_no_graph_break(tiny_shards, tiny_target):
    """The model's call compiled whole (dynamo and AOTAutograd; aot_eager's kernels, so that the test takes seconds):
    no graph break in forward, loss and backward at 3 TTT steps, none met again and no recompile on a second batch;
    its loss, metrics and gradients are the eager step's (float32: the same kernels, so to 1e-6 relative)."""
    model, batch, call = _model(tiny_shards, tiny_target)
    ref = _step(model, batch, call)
    torch._dynamo.reset()
    counters.clear()
    compiled.compile_model(model, compiled.CompilePlan(mode="default", remove=frozenset(compiled.BREAKS),
                                                       backend="aot_eager"))
    got = _step(model, batch, call)
    assert sum(counters["graph_break"].values()) == 0 and counters["stats"]["unique_graphs"] == 1
    torch.testing.assert_close(got[0], ref[0], rtol=1e-6, atol=0)
    assert got[1].keys() == ref[1].keys() and len(got[1]) >= 10
    for name in ref[1]:
        torch.testing.assert_close(got[1][name], ref[1][name], rtol=1e-5, atol=1e-7, msg=name)
    assert {k: float(v) for k, v in got[2].items()} == pytest.approx({k: float(v) for k, v in ref[2].items()},
                                                                    rel=1e-6)
    _step(model, {**batch, "hidden_states": batch["hidden_states"] * 1.5}, call)
    assert sum(counters["graph_break"].values()) == 0 and counters["stats"]["unique_graphs"] == 1


class _EagerKernels:
    """speculators' fused module's two entry points, in torch ops (the Triton kernels need a GPU): the plumbing of
    fused_loss's custom ops under test, with the KL's own gradient (softmax(logits) - softmax(targets))."""

    class _OP_KL:  # noqa: N801 - upstream's name
        value = 0

    class _FusedLoss:
        @staticmethod
        def forward(ctx, logits, targets, op):
            lp = torch.log_softmax(logits.float(), -1)
            tp = torch.softmax(targets.float(), -1)
            loss = (tp * (torch.log(tp.clamp_min(1e-30)) - lp)).sum(-1)
            b, t, _ = logits.shape
            ctx.save_for_backward(logits, targets, torch.zeros(fused_loss.N_STATS, b * t))
            return loss

        @staticmethod
        def backward(ctx, grad_output):
            logits, targets, _ = ctx.saved_tensors
            b, t, v = ctx.shape
            g = (torch.softmax(logits.float(), -1) - torch.softmax(targets.float(), -1)) * grad_output.reshape(-1, 1)
            return g.to(logits.dtype).view(b, t, v), None, None


def test_the_fused_loss_is_one_op_of_the_graph(monkeypatch):
    """fused_loss's custom ops (here over torch-op stand-ins of speculators' kernels) compile with no graph break and
    give the eager KL's loss and gradient; compile_safe swaps speculators' fused kl_div only."""
    from speculators.losses import resolve_loss_config
    from speculators.losses.eager import kl_div_loss

    monkeypatch.setattr(fused_loss, "_kernels", lambda: _EagerKernels)
    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(1, 6, 11, generator=g, requires_grad=True), torch.randn(1, 6, 11, generator=g)
    ref = kl_div_loss(logits, targets)
    (ref * torch.arange(6.0)).sum().backward()
    ref_grad, logits.grad = logits.grad, None
    torch._dynamo.reset()
    counters.clear()
    f = torch.compile(lambda x, y: (fused_loss.kl_div_loss(x, y) * torch.arange(6.0)).sum(), backend="aot_eager",
                      fullgraph=True)
    out = f(logits, targets)
    out.backward()
    torch.testing.assert_close(out, (ref * torch.arange(6.0)).sum())
    torch.testing.assert_close(logits.grad, ref_grad)
    assert sum(counters["graph_break"].values()) == 0
    cfg = fused_loss.compile_safe({**resolve_loss_config("kl_div", "fused"), "other": (kl_div_loss, 0.5)})
    assert cfg == {"kl_div": (fused_loss.kl_div_loss, 1.0), "other": (kl_div_loss, 0.5)}


@pytest.mark.slow
@pytest.mark.parametrize("method,max_breaks", [("dflash", 2), ("peagle", 3)])
def test_each_method_compiles_with_inductor(tiny_shards, tiny_target, method, max_breaks):
    """Inductor's kernels on the CPU: the compiled step's loss and gradients within float32 rounding of eager ones
    (reductions fused and reordered: 1e-4 relative), the graph breaks within each method's own (EAGLE-3's step under
    inductor, with none, is test_training_compiled_ends_near_training_eager's and test_train_throughput_tiny's);
    DFlash's anchor and mask builder, compiler.disable'd upstream, met in forward's trace and again in
    _backbone_forward's (the frame it is called from, compiled on its own); P-EAGLE's data-dependent COD sampling."""
    model, batch, call = _model(tiny_shards, tiny_target, method=method)
    torch.manual_seed(1)  # P-EAGLE and DFlash draw their samples and anchors
    ref = _step(model, batch, call)
    torch._dynamo.reset()
    counters.clear()
    static = resolve({"method": method}).method.static_shapes
    compiled.compile_model(model, compiled.resolve_plan("default", "remove", "cpu", static))
    torch.manual_seed(1)
    got = _step(model, batch, call)
    assert sum(counters["graph_break"].values()) <= max_breaks, dict(counters["graph_break"])
    torch.testing.assert_close(got[0], ref[0], rtol=1e-4, atol=1e-6)
    for name in ref[1]:
        torch.testing.assert_close(got[1][name], ref[1][name], rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.slow
def test_training_compiled_ends_near_training_eager(tiny_shards, tiny_target):
    """train.compile default against off over 4 steps of the real loop (setup, train_step, evaluate): the same
    number of steps and a final eval within float rounding."""
    d, _, _ = tiny_shards
    runs = {}
    for setting in ("off", "default"):
        torch._dynamo.reset()
        runs[setting] = td.train(target_dir=str(tiny_target), train_shards=[str(d / "train-shard.safetensors")],
                                 eval_shards=[str(d / "eval-shard.safetensors")], d2t_path=str(d / "d2t.npy"),
                                 t2d_path=str(d / "t2d.npy"), vocab_json=str(d / "vocab.json"),
                                 decisions_json=str(d / "decisions.json"), out_dir=str(d / f"compile-{setting}"),
                                 epochs=1, max_steps=4, lr=3e-3, total_seq_len=128, ttt_steps=3, seed=0, device="cpu",
                                 checkpoint_every=0, compile=setting)
    off, on = runs["off"], runs["default"]
    assert on["steps"] == off["steps"] == 4
    assert [h["loss"] for h in on["train_history"]] == pytest.approx([h["loss"] for h in off["train_history"]],
                                                                      rel=1e-3)
    assert on["final_eval"]["loss"] == pytest.approx(off["final_eval"]["loss"], rel=1e-3)
