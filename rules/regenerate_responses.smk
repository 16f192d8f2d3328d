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
        **plan.gpu_model_resources(config, "serve"),
        **plan.engine_layout_resources(config, "serve", config["data"]["regenerate"]["backend"] != "transformers"),
        gpu=res("serve", "gpu"),
        mem_mb=attempt_mem_mb(res("serve", "mem_mb")),
        runtime=res("serve", "runtime"),
    params:
        **stage_params("regenerate_responses"),
        target_dir=target_dir,
        settings=job_settings_param("regenerate_responses"),
    script:
        "../scripts/run_stage.py"
