# The decisions as the compat report's output (rules.compat_report): Snakemake then takes the
# producer from the rule instead of searching every rule's outputs for each of the 10,000 jobs.
# One job per shard; the job hands its shard to a job host of the run, which loads the target once
# for the run's shards (eagle3build/workflow/host.py): its gpu, threads and mem_mb are the host's
# while it serves the job.
rule capture_hidden_states:
    input:
        decisions=rules.compat_report.output.decisions,
        tokens=f"{RES}/data/{{split}}.safetensors",
    output:
        shard=f"{RES}/hidden_states/{{split}}/shard-{{shard}}.safetensors",
    log:
        f"{LOGS}/capture_hidden_states/{{split}}-{{shard}}.log",
    benchmark:
        f"{BENCH}/capture_hidden_states/{{split}}-{{shard}}.tsv"
    retries: VLLM_RETRIES if PLAN.capture_vllm else 0
    conda:
        "../envs/eagle3build.yaml"
    threads: config["resources"]["capture"]["threads"]
    resources:
        **plan.gpu_model_resources(config, "capture"),
        **plan.engine_layout_resources(config, "capture", PLAN.capture_vllm),
        gpu=res("capture", "gpu"),
        mem_mb=attempt_mem_mb(res("capture", "mem_mb")) if PLAN.capture_vllm else res("capture", "mem_mb"),
        runtime=res("capture", "runtime"),
    params:
        **stage_params("capture_hidden_states"),
        shard=shard_range,
        target_dir=TARGET,
        settings=job_settings_param("capture_hidden_states"),
    script:
        "../scripts/run_stage.py"
