#!/usr/bin/env bash
# `make test` (what CI runs) and `make check` (`tests/run_suite.sh check`): pytest as two processes side by side, so
# that a 2-core machine keeps both cores busy while one waits (engine starts, SLURM status checks, snakemake
# subprocesses). Extra arguments go to both pytest calls.
#   make test:
#   - the reduced build's tests (markers e2e and slurm: tests/conftest.py marks every test that uses the build
#     e2e), one session that builds tests/reduced.yaml once and starts the SLURM cluster;
#   - everything else (units, plans, lint, the vLLM engine tests), whose bundled target is converted in its
#     own session (~30 s);
#   - tests marked build_side run in the first process, to even out the two (here, 2026-12-07, a slower 2-core machine
#     than CI's: 1215 s and 1212 s before the Kimi record went to make rehearse and three build_side tests back).
#   make check (CHECK_MARKERS, from the Makefile): the test files test_a* to test_n* in one process, the others in the
#   other (each about half of the ~170 s the checks take in one process; measured here 2026-12-06).
# Each has its own --basetemp (removed once both pass, unless KEEP_TEST_FILES is set). The exit status is the first
# failing one's; both logs are printed whole.
# Each process's vLLM engines run on half of the cores (VLLM_CPU_OMP_THREADS_BIND, where vLLM's CPU worker binds its
# OpenMP threads; unless already set): bound to every core, an engine's threads spin against the other process's work.
# Measured here beside a process busy on core 0, a bundled-target engine with a head decoded 128 tokens in 17.2 s
# bound to both cores and in 9.0 s bound to core 1 (27.2 s from import to exit idle, 48.6 s and 28.0 s beside it).
# OpenMP threads that wait sleep instead of spinning (OMP_WAIT_POLICY=PASSIVE, unless set): torch's two threads in
# one process otherwise spin for a core the other process holds. tests/test_regenerate.py took 57.4 s beside an engine
# decoding on core 0 and 40.0 s with PASSIVE (30.2 s and 32.4 s alone; measured here 2026-12-06).
set -u
cd "$(dirname "$0")/.."
PYTEST=${PYTEST:-.venv/bin/pytest}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
mode=test
if [ "${1:-}" = check ]; then
  mode=check
  shift
fi
# A machine where an earlier make test installed and configured the test cluster (tests/slurm/start_cluster.sh) but
# whose controller is down: every snakemake start then waits 10 s (the SLURM executor plugin runs `scontrol show
# config`, timeout 10 s, on import, whatever the executor; ~40 starts a process in make check). make check took
# 310 s so here, 2026-12-07; the daemons start again in ~3 s (the script finds SLURM installed and only starts them).
if [ -f /etc/slurm/slurm.conf ] && command -v slurmd >/dev/null && [ "$(id -u)" = 0 ]; then
  bash tests/slurm/start_cluster.sh >/dev/null 2>&1 \
    || echo "tests/run_suite.sh: the configured SLURM test cluster did not start (snakemake starts wait 10 s each)"
fi
base=$(mktemp -d "${TMPDIR:-/tmp}/eagle3build-tests.XXXXXX")
read -r build_cores rest_cores < <(python3 -c 'import os
c = sorted(os.sched_getaffinity(0))
h = len(c) // 2
print(*(str(p[0]) if len(p) == 1 else f"{p[0]}-{p[-1]}" if p == list(range(p[0], p[-1] + 1)) else ",".join(map(str, p))
        for p in (c[:h], c[h:]))
      if h else "auto auto")')
build_cores=${VLLM_CPU_OMP_THREADS_BIND:-$build_cores}
rest_cores=${VLLM_CPU_OMP_THREADS_BIND:-$rest_cores}
if [ "$mode" = check ]; then
  markers=${CHECK_MARKERS:?CHECK_MARKERS: the markers of make check (Makefile)}
  first=(-m "$markers" tests/test_[a-n]*.py)
  second=(-m "$markers" tests/test_[o-z]*.py)
  names=("test_a* to test_n*" "test_o* to test_z*")
else
  first=(-m "(e2e or slurm or build_side) and not lease" tests)
  second=(-m "not e2e and not slurm and not build_side and not lease" tests)
  names=("the reduced build's tests (-m '(e2e or slurm or build_side) and not lease')" "the other tests (-m 'not e2e and not slurm and not build_side and not lease')")
fi
# Both logs are printed whole when both processes end (make test: ~13 min on CI's machine, ~19 here): meanwhile `tail -f` them to follow.
echo "tests/run_suite.sh $mode: ${names[0]} -> $base/first.log; ${names[1]} -> $base/second.log"
VLLM_CPU_OMP_THREADS_BIND=$build_cores "$PYTEST" -q -rs --durations=20 --basetemp "$base/first" "${first[@]}" "$@" \
  > "$base/first.log" 2>&1 &
pid=$!
VLLM_CPU_OMP_THREADS_BIND=$rest_cores "$PYTEST" -q -rs --durations=20 --basetemp "$base/second" "${second[@]}" "$@" \
  > "$base/second.log" 2>&1
second_rc=$?
wait "$pid"
first_rc=$?
echo "== ${names[0]}, vLLM on cores $build_cores: exit $first_rc"
cat "$base/first.log"
echo "== ${names[1]}, vLLM on cores $rest_cores: exit $second_rc"
cat "$base/second.log"
# The builds and engines' files under the two --basetemp folders (~2 GB after make check, ~8 GB after make test) go
# once both passed; only the logs stay. A failure keeps them for inspection (the folder is named above).
if [ "$first_rc" -eq 0 ] && [ "$second_rc" -eq 0 ] && [ -z "${KEEP_TEST_FILES:-}" ]; then
  rm -rf "$base/first" "$base/second"
else
  echo "tests/run_suite.sh: the tests' files are kept in $base (delete it when done)"
fi
[ "$first_rc" -ne 0 ] && exit "$first_rc"
exit "$second_rc"
