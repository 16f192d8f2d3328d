"""Hidden states: stage ``capture_hidden_states`` (one shard of the target's hidden states per job).
Its hooks, writer pipeline and vLLM backend are shared with the compat report's probes and live
on the floor (``hooks``, ``shard_pipeline``, ``vllm.capture``)."""
