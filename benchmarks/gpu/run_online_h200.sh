#!/usr/bin/env bash
# Issue 25's GPU figure on a lent H200 (vLLM 0.26.0 carried: docs/gpus.md): the h200_online.yaml build up to
# train_draft (online training), then what it wrote to disk. Logs and results go to $OUT.
#   bash benchmarks/gpu/run_online_h200.sh SECONDS
set -u
limit=$1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH NCCL_NVLS_ENABLE=0 \
       TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
start=$(date +%s)
timeout "$limit" python3 -m snakemake --cores 16 --resources gpu=1 --scheduler greedy --rerun-incomplete \
    --configfile benchmarks/gpu/h200_online.yaml --until train_draft > "$OUT/snakemake_online.log" 2>&1
echo "rc $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/snakemake_online.log"
{ echo "# du -b per folder of results/h200-online"; du -b --max-depth=2 results/h200-online; \
  echo "# files"; find results/h200-online -type f -printf "%s %p\n" | sort -k2; } > "$OUT/disk.txt" 2>&1
mkdir -p "$OUT/r" && cp -r logs/h200-online "$OUT/r/logs" 2>/dev/null
cp results/h200-online/checkpoint/metrics.json results/h200-online/checkpoint/train_meta.json \
   results/h200-online/compat.json "$OUT/r/" 2>/dev/null
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$OUT/r"
tail -3 "$OUT/snakemake_online.log"
