"""The target and what it supports: stages ``materialize_target`` (the bundled target, dequantised),
``compat_report`` (decisions.json, compat.json) and ``preflight_bound`` (the speed-up bound before any training,
preflight.json), with the report's private modules ``probes`` (and its ``known_good.yaml``), ``compat_render``
(compat.md) and ``quantized`` (a quantized target's routes)."""
