#!/usr/bin/env bash
# One step of the issue-21 benchmark records on a lent H200 (vLLM 0.26.0 carried: docs/gpus.md).
#   [RECIPE=OVERLAY.yaml] bash benchmarks/gpu/run_h200.sh build|c1|c16 SECONDS [OVERLAY.yaml ...]
# build: the h200-8k head up to export; c1 / c16: its benchmark at concurrency 1 / 16; further
# overlays (e.g. ks13.yaml, ks25.yaml) go last and pick the ks one call serves. UNTIL=RULE stops a
# build earlier than export_head (e.g. capture_hidden_states, so that training starts in a fresh call). RECIPE: an overlay
# of h200_8k.yaml with its own `run:` (e.g. h200_8k_regen.yaml), applied before the step's.
# Logs and results go to $OUT (the device tool's output folder); a step cut by SECONDS resumes
# in the next call (--rerun-incomplete); training resumes from its saved state only with
# resumable.yaml (train.checkpoint_every) among the overlays, named in every call of the row.
set -u
step=$1; limit=$2; shift 2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH NCCL_NVLS_ENABLE=0 \
       TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
cfg="benchmarks/gpu/h200_8k.yaml ${RECIPE:-} benchmarks/gpu/no_load_check.yaml"
run=$(grep -h '^run:' $cfg | tail -1 | awk '{print $2}')
extra=()
case $step in
  build) extra=(--until "${UNTIL:-export_head}") ;;
  c16) cfg="$cfg benchmarks/gpu/c16.yaml" ;;
esac
cfg="$cfg $*"
# A call killed from outside (the device tool's own limit, as when the unpack ate into it) leaves
# Snakemake's lock behind, and the next call would refuse to start: one Snakemake at a time runs
# here, so unlock first.
python3 -m snakemake --unlock --configfile $cfg > /dev/null 2>&1
start=$(date +%s)
timeout "$limit" python3 -m snakemake --cores 16 --resources gpu=1 --scheduler greedy --rerun-incomplete \
    --configfile $cfg "${extra[@]}" > "$OUT/snakemake_$step.log" 2>&1
echo "rc $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/snakemake_$step.log"
mkdir -p "$OUT/r" && cp -r logs/$run "$OUT/r/logs_$step" 2>/dev/null
for f in results/$run/benchmark.json results/$run/checkpoint/metrics.json results/$run/checkpoint/train_meta.json results/$run/head/head_meta.json results/$run/data/regenerate_report.json results/$run/data/data_report.json; do
  [ -f "$f" ] && cp "$f" "$OUT/r/${step}_$(basename "$f")"
done
[ -f results/$run/data/regenerated.jsonl ] && head -n 300 results/$run/data/regenerated.jsonl > "$OUT/r/regenerated_first300.jsonl"
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$OUT/r"
tail -5 "$OUT/snakemake_$step.log"
