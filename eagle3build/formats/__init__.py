"""The file formats every stage shares, the floor's lowest package (it imports only ``eagle3build.atomic``): the
hidden-state shards and their overlapped writes, the tokens files, conversation files and normalised
conversations, the benchmark's prompt sets, the JSON artifacts with their schemas, benchmark.json's runs, and a
target folder's files. The packages' order is tests/test_layers.py's ``ORDER`` (docs/layout.md)."""
