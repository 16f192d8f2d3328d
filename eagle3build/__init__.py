"""eagle3build: the library behind the Snakemake workflow that trains EAGLE-3 draft heads.

Two layers. One module per workflow stage, named after its Snakemake rule
(``materialize_target``, ``compat_report``, ``regenerate_responses``, ``prepare_data``,
``capture_hidden_states``, ``build_vocab_map``, ``train_draft``, ``export_head``,
``benchmark``, ``plot_benchmark``), over one floor of shared modules (every other module:
``target``, ``shards``, ``tokens``, ``conversations``, ``chat_masking``, ``hooks``, ``plans``,
``probes``, ``head_format``, ``vocab_map``, ``provenance``, ...). A stage imports shared modules,
never another stage; a shared module never imports a stage (tests/test_layers.py).
No module imports Snakemake: every stage is usable and tested on its own.
"""

__version__ = "0.1.0"
