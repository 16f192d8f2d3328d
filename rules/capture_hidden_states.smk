# The decisions as the compat report's output (rules.compat_report): Snakemake then takes the
# producer from the rule instead of searching every rule's outputs for each of the 10,000 jobs.
rule capture_hidden_states:
    input:
        decisions=rules.compat_report.output.decisions,
        tokens=f"{RES}/data/{{split}}.safetensors",
    output:
        f"{RES}/hidden_states/{{split}}/shard-{{shard}}.safetensors",
    log:
        f"{LOGS}/capture_hidden_states/{{split}}-{{shard}}.log",
    benchmark:
        f"{BENCH}/capture_hidden_states/{{split}}-{{shard}}.tsv"
    retries: VLLM_RETRIES if capture_may_use_vllm() else 0
    conda:
        "../envs/eagle3build.yaml"
    threads: config["resources"]["capture"]["threads"]
    resources:
        **gpu_model_res("capture"),
        gpu=res("capture", "gpu"),
        mem_mb=attempt_mem_mb(res("capture", "mem_mb")) if capture_may_use_vllm() else res("capture", "mem_mb"),
        runtime=res("capture", "runtime"),
    params:
        shard=shard_range,
        # rerun triggers only (the job reads them from decisions.json): a changed request replans
        # the shards even before the report has rerun; removing them would rerun every shard once
        aux_layer_ids=REQUESTED["aux_layer_ids"],
        backend=REQUESTED["backend"],
        target_dir=TARGET,
        version=stage_version("capture_hidden_states"),
        storage_dtype=config["capture"]["storage_dtype"],
        tokens_per_batch=config["capture"]["tokens_per_batch"],
        compute_dtype=config["target"]["dtype"],
        trust_remote_code=config["target"]["trust_remote_code"],
    script:
        "../scripts/capture_hidden_states.py"
