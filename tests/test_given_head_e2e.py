"""A head the user brings, built for real over copies of the reduced build (issue 72 ask 5): its exported head given as
``draft.head`` to a new run over the same target and prompts (README's "Bring your own head" block, run as written)
gives the original run's τ and benchmark outputs; the same weights in the EAGLE repo's EAGLE-3 format, converted by
speculators' converter, give the same τ (served in the same benchmark job, as a compared head); a fine-tune from that
head (``train.init_from``, one epoch) starts at its eval
loss, not at an untrained head's.

The reduced head is the reduced build's (4 training steps): its benchmark τ is 1.0 (no draft accepted), so τ alone
would not tell two heads apart; the tests also compare the drafts, every token-level figure and text, and the head's
tensors byte for byte (the converted head's are the original's: the same drafts, whatever τ)."""
from __future__ import annotations

import glob
import json
import re
import shutil
import subprocess
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file, save_file
from smk import REPO, copy_build, planned_jobs, run

# What a benchmark's token-level figures are (the rest are seconds, rates and ratios of them, which a busy machine
# moves): the same head over the same prompts gives the same values.
TOKEN_FIELDS = ("mean_acceptance_length", "acceptance_rate_per_position", "accepted_per_position", "accepted_tokens",
                "drafts", "draft_tokens", "output_tokens", "texts", "lossless", "outputs_identical",
                "draft_vocab_coverage", "differing_prompt_ids")
NO_TRAINING = {"capture_hidden_states", "build_vocab_map", "train_draft"}


def token_figures(bench: dict) -> dict:
    """benchmark.json's token-level figures: per head and k, overall and per set; the baseline's texts per set."""
    def pick(r: dict) -> dict:
        return {k: r[k] for k in TOKEN_FIELDS if k in r}

    runs = {(r["head"], r["num_speculative_tokens"]): {**pick(r), "sets": {s: pick(v) for s, v in r["sets"].items()}}
            for r in bench["runs"]}
    return {"runs": runs, "baseline": {s: v.get("texts") for s, v in bench["baseline"]["sets"].items()}}


def eagle_format(head: Path, out: Path) -> Path:
    """``head`` (speculators' format, as export writes it) in the EAGLE repo's EAGLE-3 format, as speculators' converter
    reads it (speculators/convert/eagle/eagle3_converter.py): the decoder layer's tensors under ``midlayer.`` (the
    converter maps them to ``layers.0.``), the rest by their names, and a Llama ``config.json`` with the fields the
    converter reads (``LlamaForCausalLMEagle3``; the target's ``vocab_size``, ``draft_vocab_size``, ``rope_theta``,
    ``torch_dtype``; the head flags it takes from the config, ``norm_before_residual`` which this project passes it)."""
    cfg = json.loads((head / "config.json").read_text())
    tl = cfg["transformer_layer_config"]
    state = load_file(str(head / "model.safetensors"))
    out.mkdir(parents=True)
    save_file({(f"midlayer.{k[len('layers.0.'):]}" if k.startswith("layers.0.") else k): v for k, v in state.items()},
              str(out / "model.safetensors"))
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
            "rms_norm_eps", "max_position_embeddings", "vocab_size")
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        **{k: tl[k] for k in keep}, "rope_theta": tl["rope_parameters"]["rope_theta"],
        "draft_vocab_size": cfg["draft_vocab_size"], "torch_dtype": "bfloat16", "tie_word_embeddings": False,
        **{k: cfg[k] for k in ("norm_before_residual", "norm_before_fc", "norm_output", "fc_norm")}}, indent=2))
    return out


def base_config(path: Path) -> Path:
    """tests/reduced.yaml without its run and train sections: the reduced build's target, data, prompts and benchmark
    (its training settings would not apply beside draft.head, and the plan refuses them)."""
    cfg = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())
    for k in ("run", "train"):
        cfg.pop(k)
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_given_head_gives_the_original_runs_tau_and_outputs_in_both_formats(reduced_build, tmp_path):
    """Over a copy of the reduced build: the same weights in the EAGLE repo's format as ``draft.head`` of a run of its
    own, built up to its head (the compat report and export: speculators' converter writes the original's tensors);
    then README's block (only the head's folder, the reduced build's, and a base config before ``given.yaml`` differ:
    the reduced build's data and benchmark, with the converted head as a compared head, so that one benchmark job
    serves both): the plan has no capture, vocab map or training, the new run's head is the original's bytes, and the
    benchmark's figures, for the head taken as it is and for the converted one, are the original run's token for
    token; compat.md and head_meta.json name each format and route."""
    wd = copy_build(reduced_build[0], tmp_path / "wd")
    original = reduced_build[1]
    head = tmp_path / "heads/reduced"  # the test's own copy: test_e2e.py rebuilds the reduced build in place
    shutil.copytree(original / "head", head)
    base = base_config(tmp_path / "base.yaml")

    eagle = eagle_format(head, tmp_path / "heads/eagle")
    cfg = tmp_path / "eagle.yaml"
    cfg.write_text(yaml.safe_dump({"run": "eagle", "draft": {"head": str(eagle)}}))
    target = ["results/eagle/head/config.json", "--configfile", str(base), str(cfg)]
    assert planned_jobs(target, wd) == {"compat_report": 1, "export_head": 1}
    p = run(target, wd, timeout=1200)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    converted = wd / "results/eagle/head"
    got, exported = load_file(str(converted / "model.safetensors")), load_file(str(head / "model.safetensors"))
    assert got.keys() == exported.keys() and all(torch.equal(got[k], exported[k]) for k in got)
    meta = json.loads((converted / "head_meta.json").read_text())
    assert meta["source"]["format"] == "eagle" and meta["source"]["path"] == str(eagle)
    from eagle3build.compat.compat_render import render_markdown

    md = render_markdown(json.loads((wd / "results/eagle/compat.json").read_text()))  # compat.md, not asked for here
    assert f"given (draft.head): {eagle}, **eagle** format: the EAGLE repo's EAGLE-3 format, converted by " in md

    with_eagle = yaml.safe_load(base.read_text())
    with_eagle["benchmark"]["compare_heads"] = [{"name": "eagle", "path": str(converted)}]
    base.write_text(yaml.safe_dump(with_eagle))
    block = re.search(r"^## Bring your own head\n.*?^```\n(.*?)^```", (REPO / "README.md").read_text(),
                      re.M | re.S).group(1)
    assert "draft: {head: results/default/head}" in block and block.count("--configfile given.yaml") == 2
    script = block.replace("results/default/head", str(head)).replace("--configfile given.yaml",
                                                                       f"--configfile {base} given.yaml")
    p = subprocess.run(["bash", "-c", "set -e\n" + script.replace(".venv/bin/", f"{REPO}/.venv/bin/")
                        .replace("snakemake ", f"snakemake -s {REPO}/Snakefile ")], cwd=wd, capture_output=True,
                       text=True, timeout=2400)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    plan = set(re.findall(r"^(\w+)\s+\d+$", p.stdout.split("Job stats:", 1)[1].split("Reasons:", 1)[0], re.M))
    assert {"compat_report", "prepare_data", "export_head", "benchmark", "serve_config"} <= plan
    assert not NO_TRAINING & plan, plan
    res = wd / "results/given"
    assert (res / "head/model.safetensors").read_bytes() == (head / "model.safetensors").read_bytes()
    assert (res / "head/config.json").read_bytes() == (head / "config.json").read_bytes()
    want = token_figures(json.loads((original / "benchmark.json").read_text()))
    got = token_figures(json.loads((res / "benchmark.json").read_text()))
    assert got["baseline"] == want["baseline"]
    assert got["runs"][("head", 2)] == got["runs"][("eagle", 2)] == want["runs"][("head", 2)]
    assert f"given (draft.head): {head}, **speculators** format: speculators' format, taken as it is" in (
        res / "compat.md").read_text()
    assert not (res / "checkpoint").exists() and not (res / "hidden_states").exists()
    # staleness follows the head's files: a rewritten weight replans export and what follows, not the compat report
    (head / "model.safetensors").write_bytes((head / "model.safetensors").read_bytes())
    assert planned_jobs(["--configfile", str(base), str(wd / "given.yaml")], wd) == {
        "export_head": 1, "benchmark": 1, "plot_benchmark": 1, "serve_config": 1, "all": 1}


def test_a_fine_tune_from_a_given_head_starts_at_its_eval_loss(reduced_build, tmp_path):
    """``train.init_from`` the reduced head in the EAGLE repo's format over a copy of the reduced build: the plan reruns
    the vocab map (the head's d2t/t2d, the original map's bytes) and training alone; the eval before the first step is
    the original run's final eval (its exported, bf16-rounded weights) and far from an untrained head's over the same
    eval shards; train_meta.json names where training started."""
    from eagle3build.train import train_draft as td
    from eagle3build.train.trainer import TrainConfig, TrainInputs, evaluate

    wd = copy_build(reduced_build[0], tmp_path / "wd")
    res = wd / "results/reduced"
    eagle = eagle_format(reduced_build[1] / "head", tmp_path / "eagle")
    cfg = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())
    cfg["train"]["init_from"] = str(eagle)
    (tmp_path / "init.yaml").write_text(yaml.safe_dump(cfg))
    target = ["results/reduced/checkpoint/metrics.json", "--configfile", str(tmp_path / "init.yaml")]
    assert planned_jobs(target, wd) == {"build_vocab_map": 1, "train_draft": 1}
    original = json.loads((res / "checkpoint/metrics.json").read_text())["final_eval"]["loss"]
    d2t = (res / "vocab/d2t.npy").read_bytes()
    p = run(target, wd, timeout=1200)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    metrics = json.loads((res / "checkpoint/metrics.json").read_text())
    assert (res / "vocab/d2t.npy").read_bytes() == d2t
    assert json.loads((res / "vocab/vocab.json").read_text())["from_head"] == str(eagle)
    assert json.loads((res / "checkpoint/train_meta.json").read_text())["init_from"] == {
        "path": str(eagle), "format": "eagle"}
    start = metrics["initial_eval"]["loss"]
    tr = yaml.safe_load((REPO / "tests/reduced.yaml").read_text())["train"]
    split = {s: sorted(glob.glob(f"{res}/hidden_states/{s}/*.safetensors")) for s in ("train", "eval")}
    t = td.setup(TrainConfig(**tr), TrainInputs(
        target_dir=str(wd / "resources/targets/smollm2-135m-instruct"), train_shards=split["train"],
        eval_shards=split["eval"], d2t_path=str(res / "vocab/d2t.npy"), t2d_path=str(res / "vocab/t2d.npy"),
        vocab_json=str(res / "vocab/vocab.json"), decisions_json=str(res / "decisions.json"),
        out_dir=str(tmp_path / "unused")), "cpu")
    untrained = evaluate(t.model, t.eval_b, t.device, t.call_kwargs, t.cfg.ttt_steps)["loss"]
    assert abs(start - original) < 0.1 < abs(untrained - original), (start, original, untrained)
    assert abs(untrained - original) > 10 * abs(start - original)
    assert metrics["steps"] > 0 and metrics["final_eval"]["loss"] != start
    # the head's weights rewritten: the vocab map and training replan (and what reads them), never the capture
    (eagle / "model.safetensors").write_bytes((eagle / "model.safetensors").read_bytes())
    assert planned_jobs(target, wd) == {"build_vocab_map": 1, "train_draft": 1}
