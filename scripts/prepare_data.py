"""Snakemake adapter for eagle3build.data.prepare_data."""
from eagle3build.data.prepare_data import prepare
from eagle3build.job import setup

setup(snakemake)
p = snakemake.params
out = snakemake.output
prepare(
    sources=p.sources,
    target_dir=p.target_dir,
    out_train=out.train,
    out_eval=out.eval,
    out_prompts=out.prompts,
    out_report=out.report,
    max_seq_len=p.max_seq_len,
    min_supervised_tokens=p.min_supervised_tokens,
    eval_fraction=p.eval_fraction,
    seed=p.seed,
    num_aux_layers=p.num_aux_layers,
    trust_remote_code=p.trust_remote_code,
    reasoning=p.reasoning,
    require_eval=p.require_eval,
)
