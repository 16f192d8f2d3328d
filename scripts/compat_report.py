"""Snakemake adapter for eagle3build.compat.compat_report."""

from eagle3build.compat import compat_report
from eagle3build.job import setup

setup(snakemake)
p = snakemake.params
# The disk and GPU plans read the config itself, not params (compat_report.run_for_config says why).
compat_report.run_for_config(
    config=snakemake.config,
    target_dir=p.target_dir,
    results_dir=p.results_dir,
    storage_dtype=p.storage_dtype,
    trust_remote_code=p.trust_remote_code,
    out_json=snakemake.output.json,
    out_decisions=snakemake.output.decisions,
)
