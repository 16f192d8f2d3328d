"""eagle3build: the library behind the Snakemake workflow that trains EAGLE-3 draft heads and serves them with vLLM.

Two layers (docs/layout.md). Over the floor, one subpackage per group of workflow stages (``compat``, ``data``,
``capture``, ``train``, ``serve``), each holding its stage modules, one per Snakemake rule and named after it
(``compat/compat_report.py`` for rules/compat_report.smk), and the modules only its stages use. The floor, lowest
first: ``atomic`` (atomic file writes), ``formats`` (the file formats and artifacts), ``prompt_sets`` (the
benchmark's prompt sets, one module each), ``target`` (the target loader), ``hooks`` (hook capture), ``draft`` (the
draft head and its method registry), ``config`` (the key table, settings, provenance), ``vllm`` (every engine's
arguments and child process) and ``workflow`` (contracts, planning, staleness, jobs, budgets). A stage imports the
floor and its own subpackage's private modules, never another stage nor another subpackage; a floor unit imports only
the units before it (tests/test_layers.py). No module imports Snakemake: every stage is usable and tested on its own.
"""

__version__ = "0.1.0"
