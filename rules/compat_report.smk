rule compat_report:
    input:
        target=TARGET,
    output:
        json=f"{RES}/compat.json",
        md=report(f"{RES}/compat.md", category="1. Compatibility"),
    params:
        results_dir=lambda w, output: os.path.dirname(output.json),
        backend=config["capture"]["backend"],
        aux_layer_ids=config["capture"]["aux_layer_ids"],
        storage_dtype=config["capture"]["storage_dtype"],
        trust_remote_code=config["target"]["trust_remote_code"],
        # Upper bound of captured tokens, for the disk plan. Consumers take compat.json as
        # ancient(): re-planning for more samples does not re-run existing shards.
        planned_tokens=(
            config["capture"]["num_train_samples"] + config["capture"]["num_eval_samples"]
        )
        * config["data"]["max_seq_len"],
        gpu_memory_gb=config["resources"]["gpu_memory_gb"],
        gpus_per_node=config["resources"]["gpus_per_node"],
        job_gpus={
            "capture": config["resources"]["capture"]["gpu"],
            "serve": config["resources"]["serve"]["gpu"],
        },
    log:
        f"{LOGS}/compat_report.log",
    conda:
        "../envs/eagle3build.yaml"
    script:
        "../scripts/compat_report.py"
