"""Snakemake adapter for eagle3build.materialize_target."""
from eagle3build.job import setup
from eagle3build.materialize_target import materialize

setup(snakemake)
materialize(snakemake.wildcards.name, snakemake.params.out_dir)
