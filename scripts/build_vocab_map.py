"""Snakemake adapter for eagle3build.build_vocab_map."""
import json

from eagle3build.build_vocab_map import build
from eagle3build.job import setup

setup(snakemake)
decisions = json.load(open(snakemake.input.decisions))
build(
    tokens_path=snakemake.input.tokens,
    target_vocab_size=decisions["target"]["vocab_size"],
    draft_vocab_size=snakemake.params.draft_vocab_size,
    out_d2t=snakemake.output.d2t,
    out_t2d=snakemake.output.t2d,
    out_json=snakemake.output.info,
    num_samples=snakemake.params.num_samples,
)
