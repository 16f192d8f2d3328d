"""Serving the head: stages ``export_head`` (the vLLM-loadable head), ``benchmark`` (speed-up
under vLLM) and ``plot_benchmark`` (its figure); private to them: ``lossless`` (the benchmark's lossless check)
and ``k_schedule`` (the k per batch size)."""
