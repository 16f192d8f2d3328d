"""Snakemake adapter for eagle3build.train_draft."""

from eagle3build.job import setup
from eagle3build.train_draft import launch, train

setup(snakemake)
i = snakemake.input
gpus = snakemake.resources.gpu
kwargs = dict(
    target_dir=snakemake.params.target_dir,
    train_shards=list(i.train),
    eval_shards=list(i.eval),
    d2t_path=i.d2t,
    t2d_path=i.t2d,
    vocab_json=i.vocab,
    compat_json=i.decisions,  # the decisions: target fingerprint, aux ids, head variant
    out_dir=snakemake.params.out_dir,
    device="cuda" if gpus > 0 else "cpu",
    trust_remote_code=snakemake.params.trust_remote_code,
    **snakemake.params.train,
)
if gpus > 1:
    launch(kwargs, nproc=gpus)  # torchrun: one DDP process per GPU of this job's slots
else:
    train(**kwargs)
