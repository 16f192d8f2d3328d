"""The file formats every stage shares, the floor's lowest package (it imports only ``eagle3build.atomic``): the
hidden-state shards (``shards``) and their overlapped writes (``shard_pipeline``), the tokens files (``tokens``),
conversation files (``conversation_files``) and normalised conversations (``conversations``), the JSON artifacts with
their schemas (``artifacts``), benchmark.json's runs (``benchmark_runs``), a target folder's files
(``target_files``) and a quantized target's scheme, bytes and making (``quantization``). The packages' order is
tests/test_layers.py's ``FLOOR_ORDER`` (docs/layout.md)."""
