"""Snakemake adapter for eagle3build.compat_report."""
from eagle3build import compat_report
from eagle3build.job import setup

setup(snakemake)
p = snakemake.params
report = compat_report.build_report(
    target_dir=snakemake.input.target,
    results_dir=p.results_dir,
    backend=p.backend,
    aux_layer_ids=p.aux_layer_ids,
    storage_dtype=p.storage_dtype,
    trust_remote_code=p.trust_remote_code,
    planned_tokens=p.planned_tokens,
    gpu_memory_gb=p.gpu_memory_gb,
    gpus_per_node=p.gpus_per_node,
    job_gpus=p.job_gpus,
)
compat_report.write(report, snakemake.output.json, snakemake.output.md)
