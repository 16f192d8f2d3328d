"""Snakemake adapter for eagle3build.compat.preflight_bound."""
from eagle3build.compat.preflight_bound import preflight
from eagle3build.job import setup

setup(snakemake)
p = snakemake.params
s = p.settings  # eagle3build.contract.StageSettings
preflight(
    target_dir=p.target_dir,
    out_json=snakemake.output[0],
    decisions_json=snakemake.input.decisions,
    max_k=s["preflight.max_k"],
    benchmark_ks=s["benchmark.ks"],
    concurrencies=s["preflight.concurrencies"],
    draft_vocab_size=s["vocab.draft_vocab_size"],
    served_name=s["target.served_name"],
    dtype=s["benchmark.dtype"],
    gpus=snakemake.resources.gpu,
    context_tokens=s["preflight.context_tokens"],
    repeats=s["preflight.repeats"],
    trust_remote_code=s["target.trust_remote_code"],
    pipeline_parallel_size=s["target.pipeline_parallel_size"],
)
