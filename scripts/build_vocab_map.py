"""Snakemake adapter for eagle3build.train.build_vocab_map."""

from eagle3build.job import setup
from eagle3build.train.build_vocab_map import build_for_decisions

setup(snakemake)
build_for_decisions(
    tokens_path=snakemake.input.tokens,
    decisions_path=snakemake.input.decisions,
    draft_vocab_size=snakemake.params.draft_vocab_size,
    out_d2t=snakemake.output.d2t,
    out_t2d=snakemake.output.t2d,
    out_json=snakemake.output.info,
    num_samples=snakemake.params.num_samples,
)
