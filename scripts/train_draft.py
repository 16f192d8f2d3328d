"""Snakemake adapter for eagle3build.train.train_draft."""

from eagle3build.job import setup
from eagle3build.train.train_draft import online_inputs, run_job

setup(snakemake)
i = snakemake.input
s = snakemake.params.settings  # eagle3build.contract.StageSettings
online = online_inputs(s, i.train, i.eval)  # capture.mode online: the tokens files, else None (shards)
run_job(
    gpus=snakemake.resources.gpu,  # > 1: torchrun, one DDP process per GPU of this job's slots (offline)
    target_dir=snakemake.params.target_dir,
    train_shards=[] if online else list(i.train),
    eval_shards=[] if online else list(i.eval),
    d2t_path=i.d2t,
    t2d_path=i.t2d,
    vocab_json=i.vocab,
    decisions_json=i.decisions,  # target fingerprint, aux ids, head variant, capture backend
    out_dir=snakemake.params.out_dir,
    trust_remote_code=s["target.trust_remote_code"],
    online=online,
    **s["train"],
)
