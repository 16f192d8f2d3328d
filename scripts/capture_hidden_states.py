"""Snakemake adapter for eagle3build.capture_hidden_states."""
import json

from eagle3build.capture_hidden_states import capture_shard
from eagle3build.job import setup

setup(snakemake)
decisions = json.load(open(snakemake.input.decisions))
p = snakemake.params
capture_shard(
    target_dir=p.target_dir,
    tokens_path=snakemake.input.tokens,
    out_path=snakemake.output[0],
    start=p.shard["start"],
    count=p.shard["num_samples"],
    aux_layer_ids=decisions["capture"]["aux_layer_ids"],
    target_fingerprint=decisions["target"]["fingerprint"],
    split=snakemake.wildcards.split,
    backend=decisions["capture"]["backend"],
    device="cuda" if snakemake.resources.gpu > 0 else "cpu",
    compute_dtype=p.compute_dtype,
    storage_dtype=p.storage_dtype,
    tokens_per_batch=p.tokens_per_batch,
    trust_remote_code=p.trust_remote_code,
    # backend vllm: tensor parallel over the job's cards (CUDA_VISIBLE_DEVICES from setup); read from the
    # config, not params, so that a serving setting does not re-run the shards of the hooks backend
    gpus=snakemake.resources.gpu,
    pipeline_parallel_size=snakemake.config["target"]["pipeline_parallel_size"],
)
