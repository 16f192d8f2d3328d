"""Quantize a dense Hugging Face target the way deployed checkpoints are: compressed-tensors, which vLLM loads natively.

    python examples/targets/quantize_target.py SRC OUT --scheme w4a16 --group-size 64   # INT4 weights, 16-bit activations
    python examples/targets/quantize_target.py SRC OUT --scheme fp8                     # FP8 weights and activations
    python examples/targets/quantize_target.py SRC OUT --scheme kimi-int4               # Kimi-K2.5's: routed experts only

The schemes are compressed-tensors' presets (compressed_tensors/quantization/quant_scheme.py): ``w4a16`` is ``W4A16``
(symmetric INT4 weights in groups, ``pack-quantized``), ``fp8`` is ``FP8_DYNAMIC`` (FP8 E4M3 weights per output
channel, activations quantized per token at run time, ``float-quantized``), both on every ``Linear`` but ``lm_head``;
``kimi-int4`` is ``W4A16`` in groups of 32 with the ignore list of moonshotai/Kimi-K2-Thinking's and Kimi-K2.5's
config.json: the routed experts in INT4; attention, shared experts, the dense MLP and embeddings left in bf16, as
Kimi-K2.5 ships. Round-to-nearest, no calibration data (neither preset needs it), done by compressed-tensors itself:
eagle3build.formats.quantization ``quantize`` says how. llmcompressor (0.14) is not used: it pins transformers <= 5.17
and compressed-tensors 0.19, which this environment's vLLM (0.32: transformers 5.19, compressed-tensors 0.17) excludes.

compressed-tensors refuses a group that does not divide a layer's input width: SmolLM2-135M's 576 is not a multiple
of 128 (the field's usual W4A16 group), so its W4A16 is made with ``--group-size 64`` (576 = 9 x 64, 1536 = 24 x 64).
Prints what it wrote as one JSON line.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eagle3build.formats.quantization import SCHEMES, quantize  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="a dense Hugging Face checkpoint directory")
    ap.add_argument("out", help="the directory to write (must not exist)")
    ap.add_argument("--scheme", choices=sorted(SCHEMES), required=True)
    ap.add_argument("--group-size", type=int, default=None, help="INT4 group size (default: the scheme's)")
    a = ap.parse_args(argv)
    try:
        print(json.dumps(quantize(a.src, a.out, a.scheme, a.group_size)))
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        sys.exit(f"quantize_target: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
