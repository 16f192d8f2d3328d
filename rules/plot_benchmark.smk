rule plot_benchmark:
    input:
        f"{RES}/benchmark.json",
    output:
        report(
            f"{RES}/report/benchmark.png",
            category="4. Benchmark",
            caption="../report/benchmark.rst",
        ),
    log:
        f"{LOGS}/plot_benchmark.log",
    conda:
        "../envs/eagle3build.yaml"
    params:
        **stage_params("plot_benchmark"),
        settings=job_settings_param("plot_benchmark"),
    script:
        "../scripts/plot_benchmark.py"
