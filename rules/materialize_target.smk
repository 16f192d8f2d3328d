rule materialize_target:
    output:
        # the files, not the folder: rules take the target's files as input (rules/common.smk)
        expand("resources/targets/{{name}}/{file}", file=target_files.MATERIALIZED_FILES),
    log:
        "logs/materialize_target/{name}.log",
    conda:
        "../envs/eagle3build.yaml"
    threads: config["resources"]["materialize"]["threads"]
    resources:
        mem_mb=res("materialize", "mem_mb"),
        runtime=res("materialize", "runtime"),
    params:
        **stage_params("materialize_target"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        settings=job_settings_param("materialize_target"),
    script:
        "../scripts/run_stage.py"
