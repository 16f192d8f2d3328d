# `make run`: install (exact pins into .venv) and build the default run.
# `make test`: install and run the test suite (unit, plan, end-to-end, lint: tests/test_lint.py).
# `make lint`: snakemake --lint, ruff check, snakefmt --check (pyproject.toml has their settings).
# `make install-gpu`: the CUDA route (vLLM 0.33.0, torch 2.14.0+cu130) into .venv-gpu; docs/gpus.md.
CORES ?= 2

.PHONY: install install-gpu run test lint
install:
	./install.sh

install-gpu:
	./install-gpu.sh

run: install
	.venv/bin/snakemake --cores $(CORES)

test: install
	.venv/bin/pytest -q -rs tests

lint: install
	.venv/bin/snakemake --lint
	.venv/bin/ruff check .
	.venv/bin/snakefmt --check Snakefile rules
