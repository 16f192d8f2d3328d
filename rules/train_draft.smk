rule train_draft:
    input:
        decisions=DECISIONS,
        train=states_input("train"),
        eval=states_input("eval"),
        d2t=f"{RES}/vocab/d2t.npy",
        t2d=f"{RES}/vocab/t2d.npy",
        vocab=f"{RES}/vocab/vocab.json",
        target=TARGET_FILES,
        init_from=HEAD_INPUTS.init_from,
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
        **plan.gpu_model_resources(config, "train"),
        # online: the capture engine beside the trainer, on the job's GPUs
        **plan.engine_layout_resources(config, "train", ONLINE and PLAN.capture_vllm),
        gpu=res("train", "gpu"),
        mem_mb=res("train", "mem_mb"),
        runtime=res("train", "runtime"),
    params:
        **stage_params("train_draft"),
        out_dir=lambda w, output: os.path.dirname(output.config),
        target_dir=target_dir,
        draft=draft_param(),
        settings=job_settings_param("train_draft"),
    script:
        "../scripts/run_stage.py"


# draft.compare_methods: each other method's head trained from the same shards and vocab map, with the same
# settings but its own draft.method, under results/<run>/methods/<method>/ (served by the benchmark beside the
# run's own head). Snakemake compares each method's params as train_draft's.
use rule train_draft as train_draft_method with:
    output:
        config=f"{RES}/methods/{{method}}/checkpoint/config.json",
        weights=f"{RES}/methods/{{method}}/checkpoint/model.safetensors",
        meta=f"{RES}/methods/{{method}}/checkpoint/train_meta.json",
        metrics=f"{RES}/methods/{{method}}/checkpoint/metrics.json",
        curves=report(
            f"{RES}/methods/{{method}}/checkpoint/curves.png",
            category="3. Training",
            subcategory="{method}",
        ),
    log:
        f"{LOGS}/train_draft_{{method}}.log",
    benchmark:
        f"{BENCH}/train_draft_{{method}}.tsv"
    params:
        **method_stage_params("train_draft"),
        draft=draft_param(by_method=True),
        settings=job_settings_param("train_draft", by_method=True),
