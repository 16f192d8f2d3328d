"""The target and what it supports: stages ``materialize_target`` (the bundled target, dequantised)
and ``compat_report`` (decisions.json, compat.json), with the report's private modules ``probes``
(and its ``known_good.yaml``) and ``compat_render`` (compat.md)."""
