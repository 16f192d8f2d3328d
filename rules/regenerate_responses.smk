rule regenerate_responses:
    input:
        target=TARGET_FILES,
        sources=local_data_files(),
    output:
        jsonl=REGENERATED,
        report=report(f"{RES}/data/regenerate_report.json", category="2. Data"),
    log:
        f"{LOGS}/regenerate_responses.log",
    benchmark:
        f"{BENCH}/regenerate_responses.tsv"
    retries: VLLM_RETRIES if config["data"]["regenerate"]["backend"] != "transformers" else 0
    conda:
        "../envs/eagle3build.yaml"
    threads: config["resources"]["serve"]["threads"]
    resources:
        **gpu_model_res("serve"),
        gpu=res("serve", "gpu"),
        mem_mb=attempt_mem_mb(res("serve", "mem_mb")),
        runtime=res("serve", "runtime"),
    params:
        target_dir=target_dir,
        version=stage_version("regenerate_responses"),
        sources=canonical(config["data"]["sources"]),
        max_seq_len=config["data"]["max_seq_len"],
        max_tokens=config["data"]["regenerate"]["max_tokens"],
        served_name=config["target"]["served_name"],
        dtype=config["benchmark"]["dtype"],
        seed=config["data"]["seed"],
        pipeline_parallel_size=config["target"]["pipeline_parallel_size"],
        backend=config["data"]["regenerate"]["backend"],
        batch_size=config["data"]["regenerate"]["batch_size"],
        trust_remote_code=config["target"]["trust_remote_code"],
    script:
        "../scripts/regenerate_responses.py"
