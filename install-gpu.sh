#!/usr/bin/env bash
# The CUDA route: create a venv (default .venv-gpu; VENV=... to choose) with the exact pins of
# requirements-gpu.txt under the full lock constraints-gpu.txt (vLLM 0.33.0 with CUDA, torch
# 2.14.0+cu130 from PyPI: kernels for sm_75 ... sm_120, so Hopper H100/H200 and Blackwell RTX PRO
# 6000 / B200), the data packages and the SLURM executor, and the project itself; then check
# that what is installed is exactly the lock. Idempotent like install.sh.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${VENV:-.venv-gpu}
EDITABLE=${EDITABLE:-1}   # 0: a regular (non-editable) install, as in the container image
STAMP=$VENV/.install-stamp
want=$(cat requirements-gpu.txt constraints-gpu.txt requirements-data.txt requirements-executors.txt pyproject.toml install-gpu.sh | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "install-gpu.sh: $VENV is up to date"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q --upgrade pip
pip install -q -r requirements-gpu.txt -c constraints-gpu.txt
pip install -q --no-deps -r requirements-data.txt
pip install -q --no-deps -r requirements-executors.txt
if [ "$EDITABLE" = 1 ]; then
  pip install -q --no-deps --no-build-isolation -e .
else
  pip install -q --no-deps --no-build-isolation .
fi
# Exactly the lock: every pin of constraints-gpu.txt installed at its version.
"$VENV/bin/python" -m eagle3build.workflow.lockcheck constraints-gpu.txt
"$VENV/bin/python" -c "import torch, transformers, speculators, vllm, snakemake, eagle3build; print('install-gpu.sh: ok, torch', torch.__version__, 'cuda', torch.version.cuda, 'archs', ' '.join(torch.cuda.get_arch_list()) or '(no GPU visible)', 'vllm', vllm.__version__)"
echo "$want" > "$STAMP"
