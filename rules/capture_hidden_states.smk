rule capture_hidden_states:
    input:
        decisions=DECISIONS,
        tokens=f"{RES}/data/{{split}}.safetensors",
    output:
        f"{RES}/hidden_states/{{split}}/shard-{{shard}}.safetensors",
    params:
        shard=shard_range,
        aux_layer_ids=REQUESTED["aux_layer_ids"],
        backend=REQUESTED["backend"],
        target_dir=TARGET,
        version=stage_version("capture_hidden_states"),
        storage_dtype=config["capture"]["storage_dtype"],
        tokens_per_batch=config["capture"]["tokens_per_batch"],
        compute_dtype=config["target"]["dtype"],
        trust_remote_code=config["target"]["trust_remote_code"],
    log:
        f"{LOGS}/capture_hidden_states/{{split}}-{{shard}}.log",
    benchmark:
        f"{BENCH}/capture_hidden_states/{{split}}-{{shard}}.tsv"
    threads: config["resources"]["capture"]["threads"]
    resources:
        gpu=res("capture", "gpu"),
        mem_mb=res("capture", "mem_mb"),
        runtime=res("capture", "runtime"),
    conda:
        "../envs/eagle3build.yaml"
    script:
        "../scripts/capture_hidden_states.py"
