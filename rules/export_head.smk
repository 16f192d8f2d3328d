# draft.head: the given head's files in place of the checkpoint and vocab map (HEAD_INPUTS.trained: nothing then), taken as they
# are or converted by speculators' converter (eagle3build/serve/export_head.py, export_given).
rule export_head:
    input:
        checkpoint=HEAD_INPUTS.trained(f"{RES}/checkpoint/model.safetensors"),
        d2t=HEAD_INPUTS.trained(f"{RES}/vocab/d2t.npy"),
        t2d=HEAD_INPUTS.trained(f"{RES}/vocab/t2d.npy"),
        vocab=HEAD_INPUTS.trained(f"{RES}/vocab/vocab.json"),
        target=TARGET_FILES,
        given=HEAD_INPUTS.given,
        decisions=HEAD_INPUTS.given_decisions,
    output:
        config=f"{RES}/head/config.json",
        weights=f"{RES}/head/model.safetensors",
        meta=f"{RES}/head/head_meta.json",
    log:
        f"{LOGS}/export_head.log",
    retries: VLLM_RETRIES if PLAN.export_vllm else 0
    conda:
        "../envs/eagle3build.yaml"
    # The vLLM load check serves the target like the benchmark does; without it, a CPU job (plan.export_resources).
    threads: PLAN.export_resources["threads"]
    resources:
        **plan.gpu_model_resources(config, "serve" if PLAN.export_vllm else None),
        **plan.engine_layout_resources(config, "serve", PLAN.export_vllm),
        gpu=PLAN.export_resources["gpu"],
        mem_mb=attempt_mem_mb(PLAN.export_resources["mem_mb"]),
        runtime=PLAN.export_resources["runtime"],
    params:
        **stage_params("export_head"),
        checkpoint_dir=lambda w, input: os.path.dirname(input.checkpoint) if input.checkpoint else None,
        out_dir=lambda w, output: os.path.dirname(output.config),
        target_dir=target_dir,
        benchmarked_by=benchmarked_by,
        settings=job_settings_param("export_head"),
    script:
        "../scripts/run_stage.py"


# draft.compare_methods: each other method's checkpoint exported (and load-checked) as the run's own is.
use rule export_head as export_head_method with:
    input:
        checkpoint=f"{RES}/methods/{{method}}/checkpoint/model.safetensors",
        d2t=f"{RES}/vocab/d2t.npy",
        t2d=f"{RES}/vocab/t2d.npy",
        vocab=f"{RES}/vocab/vocab.json",
        target=TARGET_FILES,
        given=[],
        decisions=[],
    output:
        config=f"{RES}/methods/{{method}}/head/config.json",
        weights=f"{RES}/methods/{{method}}/head/model.safetensors",
        meta=f"{RES}/methods/{{method}}/head/head_meta.json",
    log:
        f"{LOGS}/export_head_{{method}}.log",
