rule train_draft:
    input:
        decisions=DECISIONS,
        train=states_input("train"),
        eval=states_input("eval"),
        d2t=f"{RES}/vocab/d2t.npy",
        t2d=f"{RES}/vocab/t2d.npy",
        vocab=f"{RES}/vocab/vocab.json",
        target=TARGET_FILES,
    output:
        config=f"{RES}/checkpoint/config.json",
        weights=f"{RES}/checkpoint/model.safetensors",
        meta=f"{RES}/checkpoint/train_meta.json",
        metrics=f"{RES}/checkpoint/metrics.json",
        curves=report(f"{RES}/checkpoint/curves.png", category="3. Training"),
    log:
        f"{LOGS}/train_draft.log",
    benchmark:
        f"{BENCH}/train_draft.tsv"
    conda:
        "../envs/eagle3build.yaml"
    threads: config["resources"]["train"]["threads"]
    resources:
        **gpu_model_res("train"),
        gpu=res("train", "gpu"),
        mem_mb=res("train", "mem_mb"),
        runtime=res("train", "runtime"),
    params:
        **stage_params("train_draft"),
        out_dir=lambda w, output: os.path.dirname(output.config),
        target_dir=target_dir,
        settings=job_settings_param("train_draft"),
    script:
        "../scripts/run_stage.py"
