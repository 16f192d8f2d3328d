"""Snakemake adapter for eagle3build.serve.export_head."""
from eagle3build.job import setup
from eagle3build.serve.export_head import export

setup(snakemake)
p = snakemake.params
s = p.settings  # eagle3build.contract.StageSettings
export(
    checkpoint_dir=p.checkpoint_dir,
    d2t_path=snakemake.input.d2t,
    t2d_path=snakemake.input.t2d,
    vocab_json=snakemake.input.vocab,
    out_dir=p.out_dir,
    served_name=s["target.served_name"],
    target_dir=p.target_dir,
    dtype=s["export.dtype"],
    vllm_load_check=s["export.vllm_load_check"],
    gpus=snakemake.resources.gpu,
    pipeline_parallel_size=s["target.pipeline_parallel_size"],
    trust_remote_code=s["target.trust_remote_code"],
)
