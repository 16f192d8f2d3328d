"""Serving the head: stages ``export_head`` (the vLLM-loadable head), ``benchmark`` (speed-up
under vLLM) and ``plot_benchmark`` (its figure), with ``prompt_sets`` (the benchmark's prompts),
private to benchmark."""
