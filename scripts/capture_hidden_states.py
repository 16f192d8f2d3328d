"""Snakemake adapter for eagle3build.capture.capture_hidden_states."""

from eagle3build.capture.capture_hidden_states import capture_for_decisions
from eagle3build.job import setup

setup(snakemake)
p = snakemake.params
capture_for_decisions(
    decisions_path=snakemake.input.decisions,
    target_dir=p.target_dir,
    tokens_path=snakemake.input.tokens,
    out_path=snakemake.output[0],
    start=p.shard["start"],
    count=p.shard["num_samples"],
    split=snakemake.wildcards.split,
    # backend vllm: tensor parallel over the job's cards (CUDA_VISIBLE_DEVICES from setup)
    gpus=snakemake.resources.gpu,
    compute_dtype=p.compute_dtype,
    storage_dtype=p.storage_dtype,
    tokens_per_batch=p.tokens_per_batch,
    trust_remote_code=p.trust_remote_code,
    # read from the config, not params, so that a serving setting does not re-run the shards of the hooks backend
    pipeline_parallel_size=snakemake.config["target"]["pipeline_parallel_size"],
    # the split's size for the disk check of its missing shards: from the config, not params, so that
    # more samples add shards without replanning the full ones
    split_samples=snakemake.config["capture"][f"num_{snakemake.wildcards.split}_samples"],
    samples_per_shard=snakemake.config["capture"]["samples_per_shard"],
)
