# `make run`: install (exact pins into .venv) and build the default run.
# `make test`: install and run the test suite (unit, plan, end-to-end).
CORES ?= 2

.PHONY: install run test lint
install:
	./install.sh

run: install
	.venv/bin/snakemake --cores $(CORES)

test: install
	.venv/bin/pytest -q -rs tests

lint: install
	.venv/bin/snakemake --lint
