"""The draft resolved at planning (issue 59 item 2, eagle3build.draft.choice): a config's draft section that cannot
be built stops ``snakemake -n`` in one line naming the keys, before any job; draft.compare_methods beside a layer
their methods are not built with plans, saying in one line which layer each head gets, and trains those heads with
their own layer (so a change of draft.layer retrains none of them)."""
from __future__ import annotations

import re

import pytest
import yaml
from smk import REPO, plan_params, planned_jobs, run

KIMI_SHAPE = REPO / "examples/targets/kimi-k2.5-shape"  # config.json only: a DeepSeek-V3 text model (MLA)


def _overlay(tmp_path, name: str, **sections) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sections))
    return str(path)


def _refused(tmp_path, name: str, **sections) -> list[str]:
    """The output lines of a refused dry-run of tests/reduced.yaml with ``sections`` over it (non-zero exit, no
    job planned, nothing written in the working directory)."""
    wd = tmp_path / f"wd-{name}"
    p = run(["-n", "--configfile", str(REPO / "tests/reduced.yaml"), _overlay(tmp_path, name, **sections)], wd)
    out = (p.stdout + p.stderr).splitlines()
    assert p.returncode != 0, "\n".join(out)
    assert not any("Job stats" in line for line in out) and len(out) < 10, "\n".join(out)
    assert not (wd / "results").exists()
    return out


BUNDLED = "target.bundled smollm2-135m-instruct"


@pytest.mark.parametrize("name, draft, line", [
    # the bundled llama target: refused at planning, not after the capture in train_draft
    ("mla", {"layer": "mla"},
     f"config: draft.layer: mla cannot be built for {BUNDLED}, which has no multi-head latent attention (no "
     "kv_lora_rank in its config.json); set draft.layer: llama"),
    # P-EAGLE with the MLA layer: not trained as a llama-layer head without a word
    ("peagle-mla", {"method": "peagle", "layer": "mla"},
     "config: draft.method: peagle, draft.layer: mla: the mla layer is built for draft.method eagle3 only, not "
     "peagle; set draft.layer: llama (peagle's own), or draft.method: eagle3"),
    # compare_methods beside the MLA layer on the bundled target: the target refuses the run's own MLA head first
    ("compare-mla", {"layer": "mla", "compare_methods": ["peagle"]},
     f"config: draft.layer: mla cannot be built for {BUNDLED}, which has no multi-head latent attention (no "
     "kv_lora_rank in its config.json); set draft.layer: llama"),
])
def test_a_draft_that_cannot_be_built_stops_the_plan_in_one_line(tmp_path, name, draft, line):
    assert line in _refused(tmp_path, name, draft=draft)


def test_an_mla_target_of_a_path_is_read_at_planning(tmp_path):
    """A target folder's config.json decides at planning: a llama folder is refused by its path; a Kimi-K2.5 one
    (MLA in its text_config) plans the MLA head."""
    llama_shape = REPO / "examples/targets/llama-3.1-8b-instruct-shape"
    out = _refused(tmp_path, "llama-path", draft={"layer": "mla"},
                   target={"path": str(llama_shape), "served_name": "meta-llama/Llama-3.1-8B-Instruct"})
    assert (f"config: draft.layer: mla cannot be built for target.path {llama_shape}, which has no multi-head latent "
            "attention (no kv_lora_rank in its config.json); set draft.layer: llama") in out
    jobs = planned_jobs(["--configfile", str(REPO / "tests/reduced.yaml"),
                         _overlay(tmp_path, "kimi", draft={"layer": "mla"},
                                  target={"path": str(KIMI_SHAPE), "served_name": "moonshotai/Kimi-K2.5"})], tmp_path)
    assert jobs["train_draft"] == 1 and "train_draft_method" not in jobs


def test_compared_heads_beside_the_mla_layer_plan_with_their_own_layer(tmp_path):
    """draft.compare_methods [peagle] beside draft.layer mla on an MLA target: planned (the run's MLA head, P-EAGLE's
    llama head), one line saying which layer each head gets; the P-EAGLE head's train param and job draft name no MLA
    layer, so setting or unsetting draft.layer retrains only the run's own head."""
    over = _overlay(tmp_path, "kimi-compare", draft={"layer": "mla", "compare_methods": ["peagle"]},
                    target={"path": str(KIMI_SHAPE), "served_name": "moonshotai/Kimi-K2.5"})
    p = run(["-n", "--configfile", str(REPO / "tests/reduced.yaml"), over], tmp_path / "wd")
    out = (p.stdout + p.stderr).splitlines()
    assert p.returncode == 0, "\n".join(out[-20:])
    assert ("config: draft.compare_methods ['peagle'] beside draft.layer: mla: the run's eagle3 head gets the mla "
            "layer, peagle's the llama layer (draft.layer mla is built for draft.method eagle3 only); benchmark.json "
            "names each run's draft_layer") in out
    assert re.search(r"^train_draft_method\s+1$", "\n".join(out), re.M)

    # the plan's params (tests/plan_params.py): the run's own train param names the mla layer, P-EAGLE's does not
    merged = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())
    merged.update(yaml.safe_load(open(over).read()))
    cfg = tmp_path / "merged.yaml"
    cfg.write_text(yaml.safe_dump(merged))
    wd = tmp_path / "wd-params"
    wd.mkdir()
    params = plan_params(cfg, wd)

    def train(job):
        (section,) = [v for v in params[job] if isinstance(v, dict) and "lr" in v]
        return section

    own, peagle = train("train_draft[]"), train("train_draft_method[method=peagle]")
    assert own["layer"] == "mla" and "method" not in own
    assert peagle["method"] == "peagle" and "layer" not in peagle
    assert {k: v for k, v in peagle.items() if k != "method"} == {k: v for k, v in own.items() if k != "layer"}
