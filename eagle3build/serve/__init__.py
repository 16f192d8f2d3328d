"""Serving the head: stages ``export_head`` (the vLLM-loadable head), ``benchmark`` (speed-up
under vLLM), ``plot_benchmark`` (its figure), ``serve_config`` (the serving files, results/R/serve/) and
``serve_check`` (those files served by vLLM's OpenAI-compatible server, checked with the ``openai`` client); private to
them: ``lossless`` (the benchmark's lossless check), ``k_schedule`` (the k per batch size), ``serving_files`` and
``openai_server``."""
