"""Snakemake adapter for eagle3build.serve.benchmark."""
from eagle3build.job import setup
from eagle3build.serve.benchmark import benchmark

setup(snakemake)
p = snakemake.params
s = p.settings  # eagle3build.contract.StageSettings
benchmark(
    target_dir=p.target_dir,
    head_dir=p.head_dir,
    prompts_path=snakemake.input.prompts,
    out_json=snakemake.output[0],
    ks=s["benchmark.ks"],
    num_prompts=s["benchmark.num_prompts"],
    max_tokens=s["benchmark.max_tokens"],
    dtype=s["benchmark.dtype"],
    served_name=s["target.served_name"],
    max_model_len=s["benchmark.max_model_len"],
    seed=s["benchmark.seed"],
    concurrency=s["benchmark.concurrency"],
    gpus=snakemake.resources.gpu,
    pipeline_parallel_size=s["target.pipeline_parallel_size"],
    sets=s["benchmark.sets"],
    custom_prompts_path=snakemake.input.custom_prompts or None,
    near_tie_max_logprob_gap=s["benchmark.near_tie_max_logprob_gap"],
    trust_remote_code=s["target.trust_remote_code"],
    preflight_path=snakemake.input.preflight or None,
)
