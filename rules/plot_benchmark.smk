rule plot_benchmark:
    input:
        benchmark=f"{RES}/benchmark.json",
    output:
        png=report(
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
        "../scripts/run_stage.py"
