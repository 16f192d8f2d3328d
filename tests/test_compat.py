"""compat_report: target inspection on the meta device, aux-id checks, backend decision, probes."""
from __future__ import annotations

import warnings

import pytest

from eagle3build import compat_report as cr
from eagle3build.target import check_aux_layer_ids, default_aux_layer_ids


def test_inspect_tiny_llama(tiny_target):
    t = cr.inspect_target(str(tiny_target))
    assert t["num_layers"] == 6 and t["hidden_size"] == 64 and t["vocab_size"] == 49152
    assert t["decoder_layer_path"] == "model.layers" and t["chat_template"] is True
    assert t["tie_word_embeddings"] is True and t["moe"] is None and not t["text_config_unwrapped"]


def test_default_aux_ids():
    assert default_aux_layer_ids(30) == [2, 15, 27]
    assert default_aux_layer_ids(61) == [2, 30, 58]
    assert default_aux_layer_ids(7) == [2, 3, 4]
    with pytest.raises(ValueError, match="at least 7"):
        default_aux_layer_ids(6)


@pytest.mark.parametrize("ids, msg", [([2, 40], "out of range"), ([3, 3], "unique"), ([5, 2], "sorted"), ([], "empty")])
def test_user_aux_ids_are_checked(ids, msg):
    with pytest.raises(ValueError, match=msg):
        check_aux_layer_ids(ids, 30)


def test_probe_records_warnings_and_errors():
    def warns():
        warnings.warn("old api", DeprecationWarning)
        return 1

    p = cr.run_probe("w", warns)
    assert p.status == "warn" and p.value == 1 and p.warnings == ["DeprecationWarning: old api"]
    p = cr.run_probe("f", lambda: 1 / 0, required=True)
    assert p.status == "fail" and p.error.startswith("ZeroDivisionError") and p.required


def test_backend_decision_on_cpu():
    probes = {"vllm_extract_hidden_states": cr.Probe("x", value={"runnable_here": False, "reason": "needs CUDA; none here"})}
    d = cr.decide_backend("auto", probes)
    assert d["backend"] == "hooks" and any("needs CUDA" in r for r in d["reasons"]) and d["contradiction"] is None
    with pytest.raises(cr.CompatError, match="not implemented"):
        cr.decide_backend("vllm", probes)


def test_hook_capture_smoke_probe_passes():
    assert cr.run_probe("smoke", cr.probe_hook_capture).status == "ok"
