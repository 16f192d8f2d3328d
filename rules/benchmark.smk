rule benchmark:
    input:
        head=f"{RES}/head/model.safetensors",
        head_config=f"{RES}/head/config.json",
        prompts=f"{RES}/data/prompts.jsonl",
        custom_prompts=custom_prompts_input,
        compare_heads=compare_heads_input,
        preflight=preflight_input,
        target=TARGET_FILES,
    output:
        json=report(f"{RES}/benchmark.json", category="4. Benchmark"),
    log:
        f"{LOGS}/benchmark.log",
    retries: VLLM_RETRIES
    conda:
        "../envs/eagle3build.yaml"
    threads: config["resources"]["serve"]["threads"]
    resources:
        **plan.gpu_model_resources(config, "serve"),
        **plan.engine_layout_resources(config, "serve"),
        gpu=res("serve", "gpu"),
        mem_mb=attempt_mem_mb(res("serve", "mem_mb")),
        runtime=res("serve", "runtime"),
    params:
        **stage_params("benchmark"),
        target_dir=target_dir,
        head_dir=lambda w, input: os.path.dirname(input.head),
        method_heads=method_heads_param,
        settings=job_settings_param("benchmark"),
    script:
        "../scripts/run_stage.py"
