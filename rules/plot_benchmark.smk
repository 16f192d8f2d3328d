rule plot_benchmark:
    input:
        f"{RES}/benchmark.json",
    output:
        report(
            f"{RES}/report/benchmark.png",
            category="4. Benchmark",
            caption="../report/benchmark.rst",
        ),
    params:
        version=stage_version("plot_benchmark"),
    log:
        f"{LOGS}/plot_benchmark.log",
    conda:
        "../envs/eagle3build.yaml"
    script:
        "../scripts/plot_benchmark.py"
