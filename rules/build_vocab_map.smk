rule build_vocab_map:
    input:
        tokens=f"{RES}/data/train.safetensors",
        decisions=DECISIONS,
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
        draft_vocab_size=config["vocab"]["draft_vocab_size"],
        num_samples=config["capture"]["num_train_samples"],
        version=stage_version("build_vocab_map"),
    script:
        "../scripts/build_vocab_map.py"
