"""Snakemake adapter for eagle3build.train.train_draft."""

from eagle3build.job import setup
from eagle3build.train.train_draft import run_job

setup(snakemake)
i = snakemake.input
s = snakemake.params.settings  # eagle3build.contract.StageSettings
run_job(
    gpus=snakemake.resources.gpu,  # > 1: torchrun, one DDP process per GPU of this job's slots
    target_dir=snakemake.params.target_dir,
    train_shards=list(i.train),
    eval_shards=list(i.eval),
    d2t_path=i.d2t,
    t2d_path=i.t2d,
    vocab_json=i.vocab,
    decisions_json=i.decisions,  # target fingerprint, aux ids, head variant
    out_dir=snakemake.params.out_dir,
    trust_remote_code=s["target.trust_remote_code"],
    **s["train"],
)
