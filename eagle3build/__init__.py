"""eagle3build: the library behind the Snakemake workflow that trains EAGLE-3 draft heads.

Two layers. One subpackage per group of workflow stages (``compat``, ``data``, ``capture``,
``train``, ``serve``), each holding its stage modules, one per Snakemake rule and named after it
(``compat/compat_report.py`` for rules/compat_report.smk), and the modules only its stages use;
over one floor of shared modules (this folder: ``target``, ``shards``, ``tokens``,
``conversations``, ``hooks``, ``plans``, ``head_format``, ``vocab_map``, ``provenance``,
``staleness``, ...). A stage imports the floor and its own subpackage's private modules, never
another stage nor another subpackage; the floor imports no subpackage (tests/test_layers.py).
No module imports Snakemake: every stage is usable and tested on its own.
"""

__version__ = "0.1.0"
