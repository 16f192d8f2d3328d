"""Snakemake adapter for eagle3build.compat.compat_report."""

from eagle3build.compat import compat_report
from eagle3build.job import setup

setup(snakemake)
p = snakemake.params
compat_report.run_for_settings(
    settings=p.settings,  # eagle3build.contract.StageSettings: the disk and GPU plans read runtime-only keys
    target_dir=p.target_dir,
    results_dir=p.results_dir,
    out_json=snakemake.output.json,
    out_decisions=snakemake.output.decisions,
)
