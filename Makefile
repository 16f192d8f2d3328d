# `make run`: install (exact pins into .venv) and build the default run.
# `make test`: install and run the test suite (unit, plan, end-to-end, lint: tests/test_lint.py). What CI runs:
#   tests/run_suite.sh, two pytest processes side by side (the reduced build's tests; the rest).
# `make check`: the fast loop (minutes): the unit, contract, plan and lint tests; no build, no vLLM engine, no
#   cluster, no container (CHECK_MARKERS: the markers of pyproject.toml; tests/conftest.py marks every test that
#   uses the reduced build e2e); tests/run_suite.sh check, two pytest processes side by side (test files a-n; o-z).
# `make rehearse`: the recipe-based GPU records (benchmarks/gpu/record.py recipe-set) rehearsed on this CPU as one
#   sequence, and the Kimi MLA record, before a card lease (tests marked lease; 14.6 min here with the
#   reduced build, 2026-12-07, beside other jobs; not in make test).
# `make lint`: snakemake --lint, ruff check, snakefmt --check (pyproject.toml has their settings).
# `make install-gpu`: the CUDA route (vLLM 0.33.0, torch 2.14.0+cu130) into .venv-gpu; docs/gpus.md.
CORES ?= 2
CHECK_MARKERS = not e2e and not vllm and not slurm and not slow and not lease

.PHONY: install install-gpu run test check lint rehearse
install:
	./install.sh

install-gpu:
	./install-gpu.sh

run: install
	.venv/bin/snakemake --cores $(CORES)

test: install
	tests/run_suite.sh

check: install
	CHECK_MARKERS="$(CHECK_MARKERS)" tests/run_suite.sh check

rehearse: install
	.venv/bin/pytest -q -rs -m lease tests

lint: install
	.venv/bin/snakemake --lint
	.venv/bin/ruff check $$(git ls-files --cached "*.py")
	.venv/bin/snakefmt --check Snakefile rules
