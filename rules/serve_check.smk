# The serving files checked through vLLM's OpenAI-compatible server with the openai client, against the benchmark
# (eagle3build/serve/serve_check.py). Not in rule all: a target of its own (it starts a server).
SERVE_SERVER_LOG = f"{LOGS}/serve_check_server.log"


rule serve_check:
    input:
        serve_yaml=f"{RES}/serve/serve.yaml",
        serve_env=f"{RES}/serve/serve.env",
        serving=f"{RES}/serve/serving.json",
        benchmark=f"{RES}/benchmark.json",
        prompts=f"{RES}/data/prompts.jsonl",
        custom_prompts=custom_prompts_input,
        target=TARGET_FILES,
    output:
        json=f"{RES}/serve/serve_check.json",
    log:
        job=f"{LOGS}/serve_check.log",
        server=SERVE_SERVER_LOG,
    conda:
        "../envs/eagle3build.yaml"
    threads: config["resources"]["serve"]["threads"]
    resources:
        **plan.gpu_model_resources(config, "serve"),
        **plan.engine_layout_resources(config, "serve"),
        gpu=res("serve", "gpu"),
        mem_mb=res("serve", "mem_mb"),
        runtime=res("serve", "runtime"),
    params:
        **stage_params("serve_check"),
        serve_dir=lambda w, input: os.path.dirname(input.serve_yaml),
        server_log=lambda w, output: SERVE_SERVER_LOG,
        settings=job_settings_param("serve_check"),
    script:
        "../scripts/run_stage.py"
