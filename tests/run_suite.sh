#!/usr/bin/env bash
# `make test` (what CI runs): the whole suite as two pytest processes side by side, so that a 2-core machine
# keeps both cores busy while one waits (engine starts, SLURM status checks, snakemake subprocesses):
#   - the reduced build's tests (markers e2e and slurm: tests/conftest.py marks every test that uses the build
#     e2e), one session that builds tests/reduced.yaml once and starts the SLURM cluster;
#   - everything else (units, plans, lint, the vLLM engine tests), whose bundled target is converted in its
#     own session (~30 s);
#   - tests marked build_side run in the first process, to even out the two (on a fresh clone they ended within 20 s).
# Each has its own --basetemp. The exit status is the first failing one's; both logs are printed whole.
# Each process's vLLM engines run on half of the cores (VLLM_CPU_OMP_THREADS_BIND, where vLLM's CPU worker binds its
# OpenMP threads; unless already set): bound to every core, an engine's threads spin against the other process's work.
# Measured here beside a process busy on core 0, a bundled-target engine with a head decoded 128 tokens in 17.2 s
# bound to both cores and in 9.0 s bound to core 1 (27.2 s from import to exit idle, 48.6 s and 28.0 s beside it).
set -u
cd "$(dirname "$0")/.."
PYTEST=${PYTEST:-.venv/bin/pytest}
base=$(mktemp -d "${TMPDIR:-/tmp}/eagle3build-tests.XXXXXX")
read -r build_cores rest_cores < <(python3 -c 'import os
c = sorted(os.sched_getaffinity(0))
h = len(c) // 2
print(*(str(p[0]) if len(p) == 1 else f"{p[0]}-{p[-1]}" if p == list(range(p[0], p[-1] + 1)) else ",".join(map(str, p))
        for p in (c[:h], c[h:]))
      if h else "auto auto")')
build_cores=${VLLM_CPU_OMP_THREADS_BIND:-$build_cores}
rest_cores=${VLLM_CPU_OMP_THREADS_BIND:-$rest_cores}
VLLM_CPU_OMP_THREADS_BIND=$build_cores "$PYTEST" -q -rs --durations=20 -m "e2e or slurm or build_side" \
  --basetemp "$base/build" tests "$@" > "$base/build.log" 2>&1 &
build=$!
VLLM_CPU_OMP_THREADS_BIND=$rest_cores "$PYTEST" -q -rs --durations=20 -m "not e2e and not slurm and not build_side" \
  --basetemp "$base/rest" tests "$@" > "$base/rest.log" 2>&1
rest=$?
wait "$build"
built=$?
echo "== the reduced build's tests (-m 'e2e or slurm or build_side', vLLM on cores $build_cores): exit $built"
cat "$base/build.log"
echo "== the other tests (-m 'not e2e and not slurm and not build_side', vLLM on cores $rest_cores): exit $rest"
cat "$base/rest.log"
[ "$built" -ne 0 ] && exit "$built"
exit "$rest"
