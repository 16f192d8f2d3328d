rule materialize_target:
    output:
        # the files, not the folder: rules take the target's files as input (rules/common.smk)
        expand("resources/targets/{{name}}/{file}", file=staleness.MATERIALIZED_FILES),
    params:
        out_dir=lambda w, output: os.path.dirname(output[0]),
        version=stage_version("materialize_target"),
    log:
        "logs/materialize_target/{name}.log",
    threads: config["resources"]["materialize"]["threads"]
    resources:
        mem_mb=res("materialize", "mem_mb"),
        runtime=res("materialize", "runtime"),
    conda:
        "../envs/eagle3build.yaml"
    script:
        "../scripts/materialize_target.py"
