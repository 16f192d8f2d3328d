"""Snakemake adapter for eagle3build.serve.plot_benchmark."""

from eagle3build.job import setup
from eagle3build.serve.plot_benchmark import plot

setup(snakemake)
plot(snakemake.input[0], snakemake.output[0])
