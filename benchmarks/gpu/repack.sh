#!/usr/bin/env bash
# After the device tool's packer (pack.sh, outside this project: it packs vLLM 0.26.0, the project's wheels and
# `git archive HEAD` into .carry/part-NN): add the wheels the lent machine lacks for benchmarks/peer_route.py (speculators' training entry
# point imports rich: speculators/train/logger.py), then split again into 52 MiB parts (58 MiB parts plus the carry
# overhead went over the 64 MiB a call carries once the payload grew: 2026-12-04). Run from the project's root:
#     <the packer> && bash benchmarks/gpu/repack.sh
# unpack.sh (copied by pack.sh) installs every wheel under pay/whl, so nothing else changes on the machine.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
ls .carry/part-00 > /dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat .carry/part-* > "$work/pay.tar"
mkdir -p "$work/pay/whl"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$work/pay/whl" \
    rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 Pygments==2.21.0
tar rf "$work/pay.tar" -C "$work" pay/whl
rm .carry/part-*
split -b 52M -d -a 2 "$work/pay.tar" .carry/part-
ls -la .carry
