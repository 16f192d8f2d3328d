"""Snakemake adapter for eagle3build.train.build_vocab_map."""

from eagle3build.job import setup
from eagle3build.train.build_vocab_map import build_for_decisions

setup(snakemake)
s = snakemake.params.settings  # eagle3build.contract.StageSettings
build_for_decisions(
    tokens_path=snakemake.input.tokens,
    decisions_path=snakemake.input.decisions,
    draft_vocab_size=s["vocab.draft_vocab_size"],
    out_d2t=snakemake.output.d2t,
    out_t2d=snakemake.output.t2d,
    out_json=snakemake.output.info,
    num_samples=s["capture.num_train_samples"],
)
