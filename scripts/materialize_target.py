"""Snakemake adapter for eagle3build.compat.materialize_target."""
from eagle3build.compat.materialize_target import materialize
from eagle3build.job import setup

setup(snakemake)
materialize(snakemake.wildcards.name, snakemake.params.out_dir)
