rule materialize_target:
    output:
        directory("resources/targets/{name}"),
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
