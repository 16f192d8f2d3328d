rule compat_report:
    input:
        target=TARGET_FILES,
        given_head=HEAD_INPUTS.compat_config,
    output:
        decisions=DECISIONS,
        json=f"{RES}/compat.json",
    log:
        f"{LOGS}/compat_report.log",
    conda:
        "../envs/eagle3build.yaml"
    threads: config["resources"]["cpu"]["threads"]
    resources:
        mem_mb=res("cpu", "mem_mb"),
        runtime=res("cpu", "runtime"),
    params:
        **stage_params("compat_report"),
        target_dir=target_dir,
        results_dir=lambda w, output: os.path.dirname(output.json),
        settings=job_settings_param("compat_report"),
    script:
        "../scripts/run_stage.py"


# compat.md is rendered from compat.json by its own job: a missing compat.md is brought back
# without re-running the report (and, behind it, every job that reads the decisions).
rule compat_markdown:
    input:
        json=f"{RES}/compat.json",
        preflight=preflight_input,
    output:
        md=report(f"{RES}/compat.md", category="1. Compatibility"),
    log:
        f"{LOGS}/compat_markdown.log",
    conda:
        "../envs/eagle3build.yaml"
    params:
        version=stage_params("compat_report")["version"],
        settings=job_settings_param("compat_report"),
    script:
        "../scripts/run_stage.py"


# Before any training: the target's verification-step cost on the serve job's GPUs (one vLLM engine),
# and per k the tau speculation needs to break even and to reach 1.5x.
rule preflight_bound:
    input:
        target=TARGET_FILES,
        decisions=DECISIONS,
    output:
        json=PREFLIGHT,
    log:
        f"{LOGS}/preflight_bound.log",
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
        **stage_params("preflight_bound"),
        target_dir=target_dir,
        draft=draft_param(),
        settings=job_settings_param("preflight_bound"),
    script:
        "../scripts/run_stage.py"
