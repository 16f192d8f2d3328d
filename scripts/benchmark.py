"""Snakemake adapter for eagle3build.serve.benchmark."""
from eagle3build.job import setup
from eagle3build.serve.benchmark import benchmark

setup(snakemake)
s = snakemake.params.settings
benchmark(
    target_dir=snakemake.params.target_dir,
    head_dir=snakemake.params.head_dir,
    prompts_path=snakemake.input.prompts,
    out_json=snakemake.output[0],
    ks=s["ks"],
    num_prompts=s["num_prompts"],
    max_tokens=s["max_tokens"],
    dtype=s["dtype"],
    served_name=snakemake.params.served_name,
    max_model_len=s["max_model_len"],
    seed=s["seed"],
    concurrency=s["concurrency"],
    gpus=snakemake.resources.gpu,
    pipeline_parallel_size=snakemake.params.pipeline_parallel_size,
    sets=s["sets"],
    custom_prompts_path=snakemake.input.custom_prompts or None,
    near_tie_max_logprob_gap=s["near_tie_max_logprob_gap"],
    trust_remote_code=snakemake.params.trust_remote_code,
)
