"""eagle3build: the library behind the Snakemake workflow that trains EAGLE-3 draft heads.

One module per workflow stage (``materialize_target``, ``compat_report``, ``prepare_data``,
``capture_hidden_states``, ``build_vocab_map``, ``train_draft``, ``export_head``,
``benchmark``) plus shared pieces (``target``, ``shards``, ``atomic``, ``logs``).
No module imports Snakemake: every stage is usable and tested on its own.
"""

__version__ = "0.1.0"
