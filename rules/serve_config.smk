# The serving files: the head behind vLLM's OpenAI-compatible server at the benchmark's choice of k, on the serve
# section's engine layout (eagle3build/serve/serve_config.py). A cheap local job; rule all builds it.
rule serve_config:
    input:
        head=f"{RES}/head/model.safetensors",
        head_config=f"{RES}/head/config.json",
        benchmark=f"{RES}/benchmark.json",
        target=TARGET_FILES,
    output:
        yaml=f"{RES}/serve/serve.yaml",
        env=f"{RES}/serve/serve.env",
        sh=f"{RES}/serve/serve.sh",
        serving=f"{RES}/serve/serving.json",
    log:
        f"{LOGS}/serve_config.log",
    conda:
        "../envs/eagle3build.yaml"
    params:
        **stage_params("serve_config"),
        target_dir=target_dir,
        head_dir=lambda w, input: os.path.dirname(input.head_config),
        out_dir=lambda w, output: os.path.dirname(output.yaml),
        settings=job_settings_param("serve_config"),
    script:
        "../scripts/run_stage.py"
