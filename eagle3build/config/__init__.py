"""The configuration, over ``draft`` and ``prompt_sets``: every key's declaration (``key``, the tables ``keys_data``,
``keys_head``, ``keys_resources``; the draft section and the benchmark's sets from the registries), the schema,
defaults and renames made from them (``spec``), the stages' settings objects made from the keys (``settings``), a
config the schema refuses said in one line (``errors``), the versions and hardware written into artifacts
(``provenance``) and the artifact schemas' draft enums from the registry (``artifact_schemas``)."""
