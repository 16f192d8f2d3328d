"""Snakemake adapter for eagle3build.plot_benchmark."""
import logging

from eagle3build.job import setup
from eagle3build.plot_benchmark import plot

setup(snakemake)
logging.getLogger(__name__).info("plotted %s", plot(snakemake.input[0], snakemake.output[0]))
