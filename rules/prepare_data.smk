rule prepare_data:
    input:
        target=TARGET_FILES,
        regenerated=regenerated_input,
        sources=data_source_files,
    output:
        train=f"{RES}/data/train.safetensors",
        eval=f"{RES}/data/eval.safetensors",
        prompts=f"{RES}/data/prompts.jsonl",
        report=report(f"{RES}/data/data_report.json", category="2. Data", caption="../report/data.rst"),
    log:
        f"{LOGS}/prepare_data.log",
    benchmark:
        f"{BENCH}/prepare_data.tsv"
    conda:
        "../envs/eagle3build.yaml"
    threads: config["resources"]["cpu"]["threads"]
    resources:
        mem_mb=res("cpu", "mem_mb"),
        runtime=res("cpu", "runtime"),
    params:
        target_dir=target_dir,
        version=stage_version("prepare_data"),
        sources=data_sources(),
        max_seq_len=config["data"]["max_seq_len"],
        min_supervised_tokens=config["data"]["min_supervised_tokens"],
        eval_fraction=config["data"]["eval_fraction"],
        seed=config["data"]["seed"],
        num_aux_layers=(3 if config["capture"]["aux_layer_ids"] == "auto" else len(config["capture"]["aux_layer_ids"])),
        trust_remote_code=config["target"]["trust_remote_code"],
        reasoning=config["data"]["reasoning"],
        require_eval=config["capture"]["num_eval_samples"] > 0,
    script:
        "../scripts/prepare_data.py"
