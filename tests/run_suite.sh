#!/usr/bin/env bash
# `make test` (what CI runs): the whole suite as two pytest processes side by side, so that a 2-core machine
# keeps both cores busy while one waits (engine starts, SLURM status checks, snakemake subprocesses):
#   - the reduced build's tests (markers e2e and slurm: tests/conftest.py marks every test that uses the build
#     e2e), one session that builds tests/reduced.yaml once and starts the SLURM cluster;
#   - everything else (units, plans, lint, the vLLM engine tests), whose bundled target is converted in its
#     own session (~30 s);
#   - tests marked build_side run in the first process: it ended about 3 minutes before the second.
# Each has its own --basetemp. The exit status is the first failing one's; both logs are printed whole.
set -u
cd "$(dirname "$0")/.."
PYTEST=${PYTEST:-.venv/bin/pytest}
base=$(mktemp -d "${TMPDIR:-/tmp}/eagle3build-tests.XXXXXX")
"$PYTEST" -q -rs --durations=20 -m "e2e or slurm or build_side" --basetemp "$base/build" tests "$@" > "$base/build.log" 2>&1 &
build=$!
"$PYTEST" -q -rs --durations=20 -m "not e2e and not slurm and not build_side" --basetemp "$base/rest" tests "$@" > "$base/rest.log" 2>&1
rest=$?
wait "$build"
built=$?
echo "== the reduced build's tests (-m 'e2e or slurm or build_side'): exit $built"
cat "$base/build.log"
echo "== the other tests (-m 'not e2e and not slurm and not build_side'): exit $rest"
cat "$base/rest.log"
[ "$built" -ne 0 ] && exit "$built"
exit "$rest"
