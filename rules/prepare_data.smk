rule prepare_data:
    input:
        target=TARGET_FILES,
        regenerated=regenerated_input,
        sources=data_source_files,
    output:
        train=f"{RES}/data/train.safetensors",
        eval=f"{RES}/data/eval.safetensors",
        prompts=f"{RES}/data/prompts.jsonl",
        report=report(f"{RES}/data/data_report.json", category="2. Data", caption="../report/data.rst"),
    log:
        f"{LOGS}/prepare_data.log",
    benchmark:
        f"{BENCH}/prepare_data.tsv"
    conda:
        "../envs/eagle3build.yaml"
    threads: config["resources"]["cpu"]["threads"]
    resources:
        mem_mb=res("cpu", "mem_mb"),
        runtime=res("cpu", "runtime"),
    params:
        **stage_params("prepare_data"),
        target_dir=target_dir,
        settings=job_settings_param("prepare_data"),
    script:
        "../scripts/run_stage.py"
