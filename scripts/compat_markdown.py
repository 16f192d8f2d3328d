"""Snakemake adapter for eagle3build.compat.compat_report's Markdown summary (rule compat_markdown)."""
from eagle3build.compat import compat_report
from eagle3build.job import setup

setup(snakemake)
compat_report.write_markdown(snakemake.input.json, snakemake.output.md, preflight_json=snakemake.input.preflight or None)
