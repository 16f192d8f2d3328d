"""Snakemake adapter for eagle3build.data.regenerate_responses."""
from eagle3build.data.regenerate_responses import regenerate
from eagle3build.job import setup

setup(snakemake)
p = snakemake.params
s = p.settings  # eagle3build.contract.StageSettings
regenerate(
    sources=s["data.sources"],
    target_dir=p.target_dir,
    out_jsonl=snakemake.output.jsonl,
    out_report=snakemake.output.report,
    max_seq_len=s["data.max_seq_len"],
    max_tokens=s["data.regenerate.max_tokens"],
    unfinished=s["data.regenerate.unfinished"],
    temperature=s["data.regenerate.temperature"],
    top_p=s["data.regenerate.top_p"],
    checkpoint_every=s["data.regenerate.checkpoint_every"],
    served_name=s["target.served_name"],
    dtype=s["benchmark.dtype"],
    seed=s["data.seed"],
    gpus=snakemake.resources.gpu,
    pipeline_parallel_size=s["target.pipeline_parallel_size"],
    backend=s["data.regenerate.backend"],
    batch_size=s["data.regenerate.batch_size"],
    trust_remote_code=s["target.trust_remote_code"],
)
