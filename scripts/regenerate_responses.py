"""Snakemake adapter for eagle3build.data.regenerate_responses."""
from eagle3build.data.regenerate_responses import regenerate
from eagle3build.job import setup

setup(snakemake)
p = snakemake.params
regenerate(
    sources=p.sources,
    target_dir=p.target_dir,
    out_jsonl=snakemake.output.jsonl,
    out_report=snakemake.output.report,
    max_seq_len=p.max_seq_len,
    max_tokens=p.max_tokens,
    served_name=p.served_name,
    dtype=p.dtype,
    seed=p.seed,
    gpus=snakemake.resources.gpu,
    pipeline_parallel_size=p.pipeline_parallel_size,
    backend=p.backend,
    batch_size=p.batch_size,
    trust_remote_code=p.trust_remote_code,
)
