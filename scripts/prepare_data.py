"""Snakemake adapter for eagle3build.data.prepare_data."""
from eagle3build.data.prepare_data import prepare
from eagle3build.job import setup

setup(snakemake)
p = snakemake.params
s = p.settings  # eagle3build.contract.StageSettings
out = snakemake.output
prepare(
    sources=p.sources,  # data.sources, or the regenerated answers (rules/common.smk, prepare_sources)
    target_dir=p.target_dir,
    out_train=out.train,
    out_eval=out.eval,
    out_prompts=out.prompts,
    out_report=out.report,
    max_seq_len=s["data.max_seq_len"],
    min_supervised_tokens=s["data.min_supervised_tokens"],
    eval_fraction=s["data.eval_fraction"],
    seed=s["data.seed"],
    num_aux_layers=p.num_aux_layers,  # eagle3build.contract.num_aux_layers(capture.aux_layer_ids)
    trust_remote_code=s["target.trust_remote_code"],
    reasoning=s["data.reasoning"],
    require_eval=p.require_eval,  # eagle3build.contract.require_eval(capture.num_eval_samples)
    benchmark_sets=s["benchmark.sets"],  # every benchmark prompt is checked against the chat template here
    prompts_file=s["data.prompts_file"],
)
