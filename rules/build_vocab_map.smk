rule build_vocab_map:
    input:
        tokens=f"{RES}/data/train.safetensors",
        decisions=DECISIONS,
        init_from=HEAD_INPUTS.init_from,
    output:
        d2t=f"{RES}/vocab/d2t.npy",
        t2d=f"{RES}/vocab/t2d.npy",
        info=f"{RES}/vocab/vocab.json",
    log:
        f"{LOGS}/build_vocab_map.log",
    conda:
        "../envs/eagle3build.yaml"
    threads: config["resources"]["cpu"]["threads"]
    resources:
        mem_mb=res("cpu", "mem_mb"),
        runtime=res("cpu", "runtime"),
    params:
        **stage_params("build_vocab_map"),
        settings=job_settings_param("build_vocab_map"),
    script:
        "../scripts/run_stage.py"
