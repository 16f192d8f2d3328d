"""Snakemake adapter for eagle3build.capture.capture_hidden_states."""

from eagle3build.capture.capture_hidden_states import capture_for_decisions
from eagle3build.job import setup

setup(snakemake)
p = snakemake.params
s = p.settings  # eagle3build.contract.StageSettings
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
    compute_dtype=s["target.dtype"],
    storage_dtype=s["capture.storage_dtype"],
    tokens_per_batch=s["capture.tokens_per_batch"],
    trust_remote_code=s["target.trust_remote_code"],
    # runtime-only (no param): a serving setting does not re-run the shards of the hooks backend
    pipeline_parallel_size=s["target.pipeline_parallel_size"],
    # the split's size for the disk check of its missing shards (runtime-only: more samples add
    # shards without replanning the full ones)
    split_samples=s[f"capture.num_{snakemake.wildcards.split}_samples"],
    samples_per_shard=s["capture.samples_per_shard"],
)
