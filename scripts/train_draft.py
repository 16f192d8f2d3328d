"""Snakemake adapter for eagle3build.train.train_draft."""

from eagle3build.job import setup
from eagle3build.train.train_draft import run_job

setup(snakemake)
i = snakemake.input
s = snakemake.params.settings  # eagle3build.contract.StageSettings
run_job(
    gpus=snakemake.resources.gpu,  # > 1: torchrun, one DDP process per GPU of this job's slots (offline)
    target_dir=snakemake.params.target_dir,
    train_shards=list(i.train),  # capture.mode online: the tokens file of the split
    eval_shards=list(i.eval),
    d2t_path=i.d2t,
    t2d_path=i.t2d,
    vocab_json=i.vocab,
    decisions_json=i.decisions,  # target fingerprint, aux ids, head variant, capture backend
    out_dir=snakemake.params.out_dir,
    trust_remote_code=s["target.trust_remote_code"],
    capture=s["capture"],  # mode and, online, what shapes the states (samples, storage dtype, batch)
    capture_online=s["capture.online"],  # queue depth, the target's share of each GPU
    compute_dtype=s["target.dtype"],
    **s["train"],
)
