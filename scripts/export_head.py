"""Snakemake adapter for eagle3build.serve.export_head."""
from eagle3build.job import setup
from eagle3build.serve.export_head import export

setup(snakemake)
export(
    checkpoint_dir=snakemake.params.checkpoint_dir,
    d2t_path=snakemake.input.d2t,
    t2d_path=snakemake.input.t2d,
    vocab_json=snakemake.input.vocab,
    out_dir=snakemake.params.out_dir,
    served_name=snakemake.params.served_name,
    target_dir=snakemake.params.target_dir,
    dtype=snakemake.params.dtype,
    vllm_load_check=snakemake.params.vllm_load_check,
    gpus=snakemake.resources.gpu,
    pipeline_parallel_size=snakemake.params.pipeline_parallel_size,
    trust_remote_code=snakemake.params.trust_remote_code,
)
