"""Snakemake adapter for eagle3build.compat_report."""
from eagle3build import compat_report
from eagle3build.job import setup

setup(snakemake)
p = snakemake.params
# The disk and GPU plans read the config here, not through params: growing the sample count
# or changing resources must not re-run this report and, behind it, every shard. Each
# capture job re-checks the disk for its own shard before loading the target.
cfg = snakemake.config
cap, res = cfg["capture"], cfg["resources"]
report = compat_report.build_report(
    target_dir=p.target_dir,
    results_dir=p.results_dir,
    # the config's own values: params carry them canonicalised (rules/common.smk, REQUESTED)
    backend=cap["backend"],
    aux_layer_ids=cap["aux_layer_ids"],
    storage_dtype=p.storage_dtype,
    trust_remote_code=p.trust_remote_code,
    # upper bound of captured tokens
    planned_tokens=(cap["num_train_samples"] + cap["num_eval_samples"]) * cfg["data"]["max_seq_len"],
    gpu_memory_gb=res["gpu_memory_gb"],
    gpus_per_node=res["gpus_per_node"],
    job_gpus={"capture": res["capture"]["gpu"], "serve": res["serve"]["gpu"]},
)
compat_report.write(report, snakemake.output.json)
compat_report.write_decisions(report, snakemake.output.decisions)
