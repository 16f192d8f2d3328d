"""A recorded build: the workflow through `snakemake`, stage by stage, with seconds, tokens/s and MFU per stage.

Runs `snakemake --until <rule>` for each stage in DAG order (materialize, compat report,
prepare_data, capture, vocab, training, export) over one config, timing each call, then
reads what the stages wrote:
- capture: tokens stored (the shards' headers) / seconds; MFU = 2 x target parameters x
  tokens/s / (peak x GPUs), the forward-pass FLOPs (Kaplan et al. 2020, 2N per token);
- training: `metrics.json` (tokens/s over all ranks, `flops_per_token` of
  `train_metrics.draft_flops_per_token`); MFU = tokens/s x FLOPs per token / (peak x ranks).
Peak: a bf16 8192^3 matmul on GPU 0 measured in the same run (fp32 1024^3 on CPU).

`--scaling-steps S` then trains the same shards for S steps on 1 GPU and on `--gpus`
GPUs (the library's own `train` / torchrun `launch`, as the rule does) and reports the DDP
scaling efficiency = tokens/s on N / (N x tokens/s on 1).

The head (without `embed_tokens.weight`, which vLLM and speculators take from the target)
goes to `--out` with the benchmark prompts, so it can be served and measured elsewhere.

    python benchmarks/gpu_build.py --configfile examples/configs/smollm2-full-gpu.yaml --gpus 2 \
        --cores 32 --scaling-steps 400 --out OUT_DIR -- --scheduler greedy
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from benchlab.benchkit import keep_head, load_config

REPO = Path(__file__).resolve().parents[1]
STAGES = ("materialize_target", "compat_report", "prepare_data", "capture_hidden_states", "build_vocab_map",
          "train_draft", "export_head")


def peak_flops() -> tuple[float, str]:
    """Measured matmul FLOP/s: bf16 8192^3 on GPU 0, else fp32 1024^3 on the CPU (mean of 10 after 3 warm-ups)."""
    import torch

    cuda = torch.cuda.is_available()
    n, dt, dev = (8192, torch.bfloat16, "cuda") if cuda else (1024, torch.float32, "cpu")
    a, b = torch.randn(n, n, dtype=dt, device=dev), torch.randn(n, n, dtype=dt, device=dev)
    for _ in range(3):
        a @ b
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    if cuda:
        torch.cuda.synchronize()
    return 2 * n**3 * 10 / (time.perf_counter() - t0), f"{dt} {n}^3 matmul on {dev}"


def snakemake(args: list[str], workdir: Path, exe: list[str]) -> float:
    """Run snakemake (its output to this process's stderr); return wall seconds.

    Raises:
        RuntimeError: snakemake failed.
    """
    t0 = time.perf_counter()
    p = subprocess.run([*exe, "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args], cwd=REPO,
                       stdout=sys.stderr, stderr=sys.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"snakemake {' '.join(args)} failed (exit {p.returncode})")
    return round(time.perf_counter() - t0, 2)


def shard_tokens(res: Path) -> dict[str, int]:
    """Tokens stored per split, from the shards' headers (``input_ids`` length)."""
    from safetensors import safe_open

    out = {}
    for split in ("train", "eval"):
        n = 0
        for f in sorted((res / "hidden_states" / split).glob("shard-*.safetensors")):
            with safe_open(str(f), "pt") as s:
                n += s.get_slice("input_ids").get_shape()[0]
        out[split] = n
    return out


def scaling_run(res: Path, cfg: dict, target_dir: str, nproc: int, steps: int, out_dir: Path) -> dict:
    """Train the built shards for ``steps`` steps on ``nproc`` GPUs; the run's metrics.json figures."""
    from eagle3build.train.train_draft import launch, train

    kw = dict(target_dir=target_dir,
              train_shards=[str(f) for f in sorted((res / "hidden_states/train").glob("*.safetensors"))],
              eval_shards=[str(f) for f in sorted((res / "hidden_states/eval").glob("*.safetensors"))][:1],
              d2t_path=str(res / "vocab/d2t.npy"), t2d_path=str(res / "vocab/t2d.npy"),
              vocab_json=str(res / "vocab/vocab.json"), decisions_json=str(res / "decisions.json"), out_dir=str(out_dir),
              device="cuda", trust_remote_code=cfg["target"]["trust_remote_code"],
              **{**cfg["train"], "max_steps": steps, "checkpoint_every": 0})
    env_before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(nproc))
    try:
        if nproc > 1:
            launch(kw, nproc=nproc)
        else:
            train(**kw)
    finally:
        if env_before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = env_before
    m = json.loads((out_dir / "metrics.json").read_text())
    return {"gpus": nproc, "steps": m["steps"], "seconds": m["seconds"], "tokens_per_s": m["tokens_per_s"],
            "tokens_per_s_per_gpu": round(m["tokens_per_s"] / nproc, 1)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configfile", required=True)
    ap.add_argument("--workdir", default=str(REPO))
    ap.add_argument("--gpus", type=int, default=0, help="GPUs of the machine (snakemake --resources gpu=N)")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--scaling-steps", type=int, default=0, help="train S steps on 1 and on --gpus GPUs (0: skip)")
    ap.add_argument("--out", help="folder for the record (gpu_build.json) and the head without embeddings")
    ap.add_argument("--snakemake", default=f"{sys.executable} -m snakemake", help="command that runs snakemake")
    ap.add_argument("extra", nargs="*", help="more snakemake arguments (after --)")
    a = ap.parse_args(argv)
    a.snakemake = shlex.split(a.snakemake)

    cfg = load_config([a.configfile])
    wd = Path(a.workdir).resolve()
    res = wd / "results" / cfg["run"]
    peak, peak_how = peak_flops()
    common = ["--configfile", str(Path(a.configfile).resolve()), "--cores", str(a.cores), *a.extra]
    if a.gpus:
        common += ["--resources", f"gpu={a.gpus}"]
    record = {"command": " ".join(sys.argv), "config": a.configfile, "gpus": a.gpus,
              "peak_flops": peak, "peak_measured_by": peak_how, "stages": {}}
    import torch

    if torch.cuda.is_available():
        record["gpu_model"] = torch.cuda.get_device_name(0)
    t_all = time.perf_counter()
    record["plan_seconds"] = snakemake(["-n", "--quiet", *common], wd, a.snakemake)
    for stage in STAGES:
        if stage == "materialize_target" and cfg["target"]["path"]:
            continue
        record["stages"][stage] = {"seconds": snakemake(["--until", stage, *common], wd, a.snakemake)}
        print(f"gpu_build: {stage} {record['stages'][stage]['seconds']} s", file=sys.stderr, flush=True)
    record["total_seconds"] = round(time.perf_counter() - t_all, 1)

    compat = json.loads((res / "compat.json").read_text())
    params = compat["target"]["parameters"]
    toks = shard_tokens(res)
    cap = record["stages"]["capture_hidden_states"]
    cards = max(1, a.gpus)
    cap.update(tokens=toks, tokens_per_s=round(sum(toks.values()) / cap["seconds"], 1),
               target_parameters=params, gpus=cards,
               mfu=round(2 * params * sum(toks.values()) / cap["seconds"] / (peak * cards), 4),
               note="wall time of the stage: target loading of every shard job included")
    m = json.loads((res / "checkpoint/metrics.json").read_text())
    world = json.loads((res / "checkpoint/train_meta.json").read_text())["world_size"]
    record["stages"]["train_draft"].update(
        steps=m["steps"], loop_seconds=m["seconds"], tokens_per_s=m["tokens_per_s"], world_size=world,
        tokens_per_s_per_gpu=round(m["tokens_per_s"] / world, 1), flops_per_token=m["flops_per_token"],
        mfu=round(m["tokens_per_s"] * m["flops_per_token"] / (peak * world), 4),
        final_eval=m["final_eval"])
    d = json.loads((res / "data/data_report.json").read_text())
    record["data"] = {k: d[k] for k in ("records_read", "kept", "train_samples", "eval_samples", "tokens",
                                        "supervised_tokens")}

    if a.scaling_steps and a.gpus > 1:
        import tempfile

        target_dir = cfg["target"]["path"] or str(wd / "resources/targets" / cfg["target"]["bundled"])
        runs = []
        for n in (1, a.gpus):
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(scaling_run(res, cfg, target_dir, n, a.scaling_steps, Path(tmp) / "ck"))
            print(f"gpu_build: scaling {runs[-1]}", file=sys.stderr, flush=True)
        record["ddp_scaling"] = {"runs": runs,
                                 "efficiency": round(runs[1]["tokens_per_s"] / (a.gpus * runs[0]["tokens_per_s"]), 3)}

    if a.out:
        out = Path(a.out)
        keep_head(res, out / "head")
        (out / "gpu_build.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return record


if __name__ == "__main__":
    main()
