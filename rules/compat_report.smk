rule compat_report:
    input:
        target=TARGET,
    output:
        json=f"{RES}/compat.json",
        md=report(f"{RES}/compat.md", category="1. Compatibility"),
    params:
        results_dir=lambda w, output: os.path.dirname(output.json),
        backend=config["capture"]["backend"],
        aux_layer_ids=config["capture"]["aux_layer_ids"],
        storage_dtype=config["capture"]["storage_dtype"],
        trust_remote_code=config["target"]["trust_remote_code"],
    log:
        f"{LOGS}/compat_report.log",
    conda:
        "../envs/eagle3build.yaml"
    script:
        "../scripts/compat_report.py"
