"""compat_report: target inspection on the meta device, aux-id checks, backend decision, probes."""
from __future__ import annotations

import warnings

import pytest

from eagle3build.compat import compat_report as cr
from eagle3build.draft.methods import METHODS


def test_inspect_tiny_llama(tiny_target):
    t = cr.inspect_target(str(tiny_target))
    assert t["num_layers"] == 6 and t["hidden_size"] == 64 and t["vocab_size"] == 49152
    assert t["decoder_layer_path"] == "model.layers" and t["chat_template"] is True
    assert t["tie_word_embeddings"] is True and t["moe"] is None and not t["text_config_unwrapped"]


@pytest.mark.parametrize("method", METHODS.values(), ids=lambda m: m.name)
def test_default_aux_ids(method):
    """Each draft method says which aux layers it reads: EAGLE-3's [2, N//2, N-3] from 7 layers on; a shallower
    target gets three distinct layers spread over its stack (issue 67: 6 layers gave [2, 3, 3]), the compat report
    saying which rule chose them; fewer than 3: none. Every registered method reads the same ones: one capture serves
    the methods draft.compare_methods trains."""
    assert method.default_aux_layer_ids(30) == [2, 15, 27]
    assert method.default_aux_layer_ids(61) == [2, 30, 58]
    assert method.default_aux_layer_ids(7) == [2, 3, 4]
    assert {n: method.default_aux_layer_ids(n) for n in (3, 4, 5, 6)} == {3: [0, 1, 2], 4: [1, 2, 3], 5: [1, 2, 3],
                                                                          6: [1, 3, 4]}
    for n in range(3, 40):
        ids = method.default_aux_layer_ids(n)
        assert method.check_aux_layer_ids(ids, n) == ids and len(ids) == method.num_aux_layers("auto") == 3
    assert method.num_aux_layers([1, 2]) == 2
    assert method.aux_layer_ids_rule(30) == "EAGLE-3's default [2, N//2, N-3] for N = 30 layers: [2, 15, 27]"
    assert method.aux_layer_ids_rule(6) == ("a shallow target (6 layers, fewer than 7): EAGLE-3's [2, N//2, N-3] would "
                                            "be [2, 3, 3], so three distinct layers spread over the stack: [1, 3, 4]")
    with pytest.raises(ValueError, match=r"2 decoder layer\(s\): no three distinct aux layers; set "
                                         r"capture.aux_layer_ids to ids in \[0, 1\]"):
        method.default_aux_layer_ids(2)


def test_the_compat_report_records_the_shallow_targets_aux_rule(tiny_target, tmp_path):
    """A 6-layer target builds without a setting: auto takes [1, 3, 4] and the report says why."""
    from eagle3build.compat.compat_render import render_markdown

    rep = cr.build_report(cr.CompatSettings(target_dir=str(tiny_target), results_dir=str(tmp_path / "res"),
                                            backend="hooks"))
    c = rep["capture"]
    assert c["aux_layer_ids"] == [1, 3, 4] and "a shallow target (6 layers" in c["aux_layer_ids_rule"]
    assert "(recommended [1, 3, 4]: a shallow target (6 layers" in render_markdown(rep)


@pytest.mark.parametrize("ids, msg", [([2, 40], "out of range"), ([3, 3], "unique"), ([5, 2], "sorted"), ([], "empty")])
def test_user_aux_ids_are_checked(ids, msg):
    with pytest.raises(ValueError, match=msg):
        METHODS["eagle3"].check_aux_layer_ids(ids, 30)


def test_probe_records_warnings_and_errors():
    def warns():
        warnings.warn("old api", DeprecationWarning)
        return 1

    p = cr.run_probe("w", warns)
    assert p.status == "warn" and p.value == 1 and p.warnings == ["DeprecationWarning: old api"]
    p = cr.run_probe("f", lambda: 1 / 0, required=True)
    assert p.status == "fail" and p.error.startswith("ZeroDivisionError") and p.required


SMOL = {"parameters": 134_515_008, "weight_bytes_per_parameter": 2.0, "moe": None}
MOE = {"parameters": 30_000_000_000, "weight_bytes_per_parameter": 2.0,
       "moe": {"routed_experts": 128, "shared_experts": None, "active_experts": 8}}
DENSE_200B = {"parameters": 200_000_000_000, "weight_bytes_per_parameter": 2.0, "moe": None}


def test_backend_decision_on_cpu():
    ext = cr.Probe("x", value={"runnable_here": False, "reason": "needs CUDA; none here"})
    passed = cr.Probe("vllm_capture_smoke", value={"max_rel_err": 3e-6, "install": {"layer_class": "LlamaDecoderLayer"}})
    failed = cr.Probe("vllm_capture_smoke", status="fail", error="RuntimeError: ... LayoutError: model type 'llama'")
    # Without the probe (not run): hooks, and the reasons say so.
    d = cr.decide_backend("auto", {"vllm_extract_hidden_states": ext}, MOE)
    assert d["backend"] == "hooks" and "vLLM capture probe not run" in d["reasons"] and d["contradiction"] is None
    assert any("needs CUDA" in r for r in d["reasons"])
    # Probe passed: vllm for MoE and large dense targets, hooks for the bundled SmolLM2.
    for target, backend in ((MOE, "vllm"), (DENSE_200B, "vllm"), (SMOL, "hooks")):
        d = cr.decide_backend("auto", {"vllm_capture_smoke": passed}, target)
        assert d["backend"] == d["auto_choice"] == backend, (target, d)
    smoke = {"vllm_capture_smoke": passed}
    assert "MoE target (128 routed experts), 60.0 GB" in cr.decide_backend("auto", smoke, MOE)["reasons"][0]
    assert ("large target: 400.0 GB of weights (200.00B parameters) > 80 GB"
            in cr.decide_backend("auto", smoke, DENSE_200B)["reasons"][0])
    # Probe failed: hooks, the evidence in the reasons; forcing vllm then is a hard error.
    d = cr.decide_backend("auto", {"vllm_capture_smoke": failed}, MOE)
    assert d["backend"] == "hooks" and any("probe failed: RuntimeError: ... LayoutError" in r for r in d["reasons"])
    with pytest.raises(cr.CompatError, match="capture probe failed: RuntimeError"):
        cr.decide_backend("vllm", {"vllm_capture_smoke": failed}, MOE)
    with pytest.raises(cr.CompatError, match="capture probe was not run"):
        cr.decide_backend("vllm", {}, SMOL)
    d = cr.decide_backend("vllm", {"vllm_capture_smoke": passed}, SMOL)
    assert d["backend"] == "vllm" and d["auto_choice"] == "hooks" and "forced to 'vllm'" in d["contradiction"]


def test_smol_report_does_not_start_an_engine(tmp_path, smol_target, monkeypatch):
    """The bundled dense target under auto: the engine probe is not run (no engine start) and the report says why."""
    def no_engine(*a, **k):
        raise AssertionError("the vLLM capture probe must not run for a small dense target under auto")

    monkeypatch.setattr(cr, "probe_vllm_capture", no_engine)
    r = cr.build_report(cr.CompatSettings(target_dir=str(smol_target), results_dir=str(tmp_path / "res")))
    c = r["capture"]
    assert c["backend"] == "hooks" and "vllm_capture_smoke" not in r["probes"]
    assert c["vllm_capture_probe"]["run"] is False
    assert c["vllm_capture_probe"]["why"].startswith(
        "backend auto; dense target of 0.3 GB of weights (0.13B parameters) <= 80 GB")
    assert "vLLM capture probe not run" in cr.render_markdown(r)


def test_hook_capture_smoke_probe_passes():
    assert cr.run_probe("smoke", cr.probe_hook_capture).status == "ok"
