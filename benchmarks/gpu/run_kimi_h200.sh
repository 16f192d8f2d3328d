#!/usr/bin/env bash
# Issue 37 on a lent H200 (vLLM 0.26.0 carried: docs/gpus.md), steps in order within one device call:
#   bash benchmarks/gpu/run_kimi_h200.sh SECONDS STEP [STEP ...]
# STEP: target (write the Kimi-K2.5-shaped checkpoint, examples/targets/kimi_k25_shaped.py --preset card --seed 0,
# under resources/targets/kimi-k25-card) | dense (the bundled target end to end with its pre-flight bound,
# dense_preflight.yaml) | build (kimi_k25_card.yaml end to end) | head (the same up to the exported head and the
# pre-flight table) | online (kimi_k25_card_online.yaml end to end, in the offline build's run: after `build`
# train_draft, the export and the benchmark replan; about 1,000 s on a fresh machine, the pre-flight included;
# until 2026-12-04 it stopped at train_draft) | bench16 (the benchmark again at 16 requests in flight for each build
# with a head on this machine: only the benchmark replans; after `online` the Kimi run's head is the online one, so
# run bench16 before it) | peagle, dflash (the dense build's head trained as P-EAGLE / DFlash
# from the same shards, method_peagle.yaml / method_dflash.yaml: training, export with the load check, benchmark;
# each head kept under results/heads/) | compare (the run's EAGLE-3 head and those two in one benchmark job,
# compare_heads.yaml) | methods (the same three heads in one build, draft.compare_methods: compare_methods.yaml; one
# benchmark job, no retraining of the run's own head; after `peer` on this machine, the peer's head in it too) | peer (speculators' own training entry point on the dense run's shards, benchmarks/peer_route.py,
# then the benchmark with both heads, compare_peer.yaml) | decodeab (benchmarks/decode_step_ab.py on the dense target, materialized if absent, then on the
# Kimi-shaped one if on this machine: the pre-flight's decode step in the pre-flight's engine and in the benchmark's
# baseline engine, 32 and 96 tokens).
# The steps share
# SECONDS; a step cut by the limit resumes in the next call (--rerun-incomplete). Logs and results go to $OUT.
# Each Snakemake call is sent TERM 25 s before the deadline (KILL 10 s later), so the results are packed before the device call ends
# (2026-12-04: a build given the whole 585 s was killed by the call's own limit and brought back only its log).
set -u
limit=$1; shift
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH NCCL_NVLS_ENABLE=0 \
       TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
G=benchmarks/gpu
deadline=$(( $(date +%s) + limit ))
nvidia-smi --query-gpu=timestamp,memory.used,memory.total,utilization.gpu --format=csv -l 2 > "$OUT/gpu_mem.csv" 2>/dev/null &
smi=$!
mkdir -p "$OUT/r"
# every 20 s, the small results and the logs so far: a call cut from outside still brings them back
( while sleep 20; do tar czf "$OUT/live.tgz.tmp" logs results/*/*.json results/*/*.md results/*/checkpoint/*.json \
    results/*/head/*.json "$OUT/steps.log" 2>/dev/null; mv "$OUT/live.tgz.tmp" "$OUT/live.tgz"; done ) &
live=$!
for step in "$@"; do
  left=$(( deadline - $(date +%s) ))
  [ "$left" -lt 60 ] && { echo "no time left for $step"; break; }
  start=$(date +%s)
  echo "== $step at $(date +%T), $left s left" | tee -a "$OUT/steps.log"
  case $step in
    target)
      [ -d resources/targets/kimi-k25-card ] || timeout "$left" python3 examples/targets/kimi_k25_shaped.py \
          resources/targets/kimi-k25-card --preset card > "$OUT/r/target.log" 2>&1
      echo "target rc $? after $(( $(date +%s) - start )) s: $(du -sh resources/targets/kimi-k25-card)" | tee -a "$OUT/steps.log"
      continue ;;
    dense) cfg="$G/dense_preflight.yaml"; extra=() ;;
    build) cfg="$G/kimi_k25_card.yaml"; extra=() ;;
    online) cfg="$G/kimi_k25_card.yaml $G/kimi_k25_card_online.yaml"; extra=() ;;
    peagle|dflash) cfg="$G/dense_preflight.yaml $G/method_$step.yaml"; extra=() ;;
    compare) cfg="$G/dense_preflight.yaml $G/compare_heads.yaml"; extra=() ;;
    methods) cfg="$G/dense_preflight.yaml $G/compare_methods.yaml"; extra=()  # with the peer's head where `peer` made it
      [ -f results/heads/speculators/head/config.json ] && cfg="$cfg $G/compare_peer.yaml" ;;
    peer)  # speculators' own entry point trains a head from the dense run's shards, then one benchmark serves both
      # the dense run's shards first (its build up to capture), then the peer's head from them, once per machine:
      # a call that resumes a cut benchmark keeps the head it benchmarks (resume with `peer` alone: `dense` first
      # would benchmark the run without compare_heads again); a cut peer_route starts over
      if [ ! -f results/heads/speculators/peer_route.json ]; then
        python3 -m snakemake --unlock --configfile "$G/dense_preflight.yaml" > /dev/null 2>&1
        timeout -k 10 "$(( left - 25 ))" python3 -m snakemake --cores 16 --resources gpu=1 --scheduler greedy \
            --rerun-incomplete --until capture_hidden_states --configfile "$G/dense_preflight.yaml" \
            >> "$OUT/r/snakemake_peer.log" 2>&1
        left=$(( deadline - $(date +%s) ))
        [ "$left" -gt 60 ] && timeout -k 10 "$(( left - 25 ))" python3 benchmarks/peer_route.py \
            --configfile "$G/dense_preflight.yaml" --out results/heads/speculators > "$OUT/r/peer_route.log" 2>&1
        echo "peer_route rc $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/steps.log"
      fi
      cp results/heads/speculators/peer_route.json "$OUT/r/" 2>/dev/null
      cp results/heads/speculators/train.log "$OUT/r/peer_train.log" 2>/dev/null
      cp results/heads/speculators/checkpoints/run.yaml "$OUT/r/peer_run.yaml" 2>/dev/null
      [ -f results/heads/speculators/head/config.json ] || continue
      left=$(( deadline - $(date +%s) )); [ "$left" -lt 60 ] && { echo "no time left for the peer benchmark" | tee -a "$OUT/steps.log"; continue; }
      cfg="$G/dense_preflight.yaml $G/compare_peer.yaml"; extra=() ;;
    bench16)
      for c in "$G/dense_preflight.yaml" "$G/kimi_k25_card.yaml"; do
        r=$(grep -h '^run:' $c | awk '{print $2}')
        [ -f results/$r/head/config.json ] || { echo "bench16 $r: no exported head on this machine, skipped" | tee -a "$OUT/steps.log"; continue; }
        left=$(( deadline - $(date +%s) )); [ "$left" -lt 60 ] && break
        timeout -k 10 "$(( left - 25 ))" python3 -m snakemake --cores 16 --resources gpu=1 --rerun-incomplete results/$r/benchmark.json \
          --configfile $c $G/bench16.yaml >> "$OUT/r/snakemake_bench16.log" 2>&1
        echo "bench16 $r rc $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/steps.log"
        cp results/$r/benchmark.json "$OUT/r/${r}_bench16_benchmark.json" 2>/dev/null
        cp logs/$r/benchmark.log "$OUT/r/${r}_bench16_benchmark.log" 2>/dev/null
      done
      continue ;;
    decodeab)  # the pre-flight's decode step against the benchmark's baseline engine: the dense target (materialized
      # here if absent, about 30 s: it is the one whose pre-flight misses by 23 %), then the Kimi-shaped one if present
      [ -f resources/targets/smollm2-135m-instruct/config.json ] || timeout -k 10 "$(( left - 25 ))" python3 -m snakemake \
          --cores 16 resources/targets/smollm2-135m-instruct/config.json --configfile "$G/dense_preflight.yaml" \
          >> "$OUT/r/snakemake_decodeab.log" 2>&1
      for t in resources/targets/smollm2-135m-instruct resources/targets/kimi-k25-card; do
        [ -f $t/config.json ] || { echo "decodeab $(basename $t): not on this machine, skipped" | tee -a "$OUT/steps.log"; continue; }
        left=$(( deadline - $(date +%s) )); [ "$left" -lt 90 ] && break
        timeout -k 10 "$(( left - 25 ))" python3 benchmarks/decode_step_ab.py $t --gpus 1 \
          --json "$OUT/r/decode_ab_$(basename $t).json" >> "$OUT/r/decode_ab.log" 2>&1
        rc=$?  # before the $(basename) below, which resets $? (call 16 logged rc 0 for a run its timeout killed)
        echo "decodeab $(basename $t) rc $rc after $(( $(date +%s) - start )) s" | tee -a "$OUT/steps.log"
      done
      continue ;;
  head) cfg="$G/kimi_k25_card.yaml"; extra=(results/kimi-k25-card/preflight.json results/kimi-k25-card/compat.md
                                          results/kimi-k25-card/head/config.json) ;;
    *) echo "unknown step $step"; continue ;;
  esac
  run=$(grep -h '^run:' $cfg | tail -1 | awk '{print $2}')
  python3 -m snakemake --unlock --configfile $cfg > /dev/null 2>&1
  left=$(( deadline - $(date +%s) ))
  timeout -k 10 "$(( left - 25 ))" python3 -m snakemake --cores 16 --resources gpu=1 --scheduler greedy --rerun-incomplete --keep-going \
      "${extra[@]}" --configfile $cfg >> "$OUT/r/snakemake_$step.log" 2>&1
  rc=$?
  echo "$step rc $rc after $(( $(date +%s) - start )) s" | tee -a "$OUT/steps.log"
  cp -r logs/$run "$OUT/r/logs_${run}_$step" 2>/dev/null
  files="results/$run/*.json results/$run/*.md results/$run/checkpoint/*.json results/$run/head/*.json
         results/$run/data/data_report.json results/$run/vocab/vocab.json results/$run/benchmarks/*.tsv"
  for f in $files; do
    [ -f "$f" ] && cp "$f" "$OUT/r/${run}_${step}_$(basename "$f")"
  done
  du -sb results/$run/hidden_states/*/* > "$OUT/r/${run}_shard_bytes.txt" 2>/dev/null
  for f in results/$run/methods/*/checkpoint/*.json results/$run/methods/*/head/*.json; do  # draft.compare_methods'
    [ -f "$f" ] && cp "$f" "$OUT/r/${run}_${step}_$(echo "${f#results/$run/methods/}" | tr / _)"
  done
  # the P-EAGLE and DFlash heads kept for `compare` (the next method's training replaces the run's head)
  case $step in peagle|dflash) grep -q "\"speculators_model_type\": *\"$step\"" results/$run/head/config.json 2>/dev/null &&
      rm -rf results/heads/$step && mkdir -p results/heads && cp -r results/$run/head results/heads/$step ;; esac
  grep -h "Finished jobid\|Error in rule" "$OUT/r/snakemake_$step.log" | tail -20
done
kill $smi $live 2>/dev/null
cp "$OUT/gpu_mem.csv" "$OUT/r/" 2>/dev/null
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$OUT/r"
cat "$OUT/steps.log"
