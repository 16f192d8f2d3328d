"""Where the pre-flight's decode step and the benchmark's baseline part: the target alone, one request in flight,
timed the pre-flight's way (random token ids after a cached context, ``ignore_eos``; vLLM's per-request
timestamps, (last - first token) / (tokens - 1): ``preflight_bound.measure_in_engine``) in engines sized two ways,
each at several decode lengths:

- as the pre-flight sizes its target engine: ``max_num_seqs`` the largest pre-flight concurrency (16), CUDA graphs
  up to that x (k_max + 1) tokens (96);
- as the benchmark sizes its baseline engine at concurrency 1: ``max_num_seqs`` 1, graphs up to 1 token.

Why: on an H200 (vLLM 0.26.0) the pre-flight's decode step read 2.39 ms (dense SmolLM2-135M) and 2.35 ms
(Kimi-shaped MoE), the benchmark's baseline 1.95 and 1.84, while the speculative step agreed to 0.7 % on the
dense target (benchmarks/gpu/kimi_h200.md, "Calls 11-13"). The engines also differ in decode length (32 tokens
against up to 96): this run separates the two.

    python benchmarks/decode_step_ab.py TARGET_DIR [--gpus 1] [--engines 16:96 1:1] [--lengths 32 96]
        [--context 256] [--repeats 5] [--json out.json]

``--engines``: ``max_num_seqs:graph_tokens`` per engine (one engine start each). Prints, per engine and length,
the decode step (ms) and its ratio to the last engine's step at the longest length.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from eagle3build.compat.preflight_bound import ENTRY  # noqa: E402
from eagle3build.config.provenance import BENCHMARK_PACKAGES, hardware, software_versions  # noqa: E402
from eagle3build.target import load_config, text_config  # noqa: E402
from eagle3build.vllm import engine_process  # noqa: E402
from eagle3build.vllm.engine_args import engine_args  # noqa: E402


def measure(target: str, gpus: int, engines: list[tuple[int, int]], lengths: list[int], context: int,
            repeats: int) -> dict:
    """Decode step (seconds per output token, the median over ``repeats`` requests) of the target alone at one request
    in flight, per engine (``(max_num_seqs, graph_tokens)``: vLLM's ``max_num_seqs`` and the largest CUDA-graph
    batch in tokens, ``engine_args``) and decode length (tokens), after a ``context``-token context
    served from the prefix cache. One engine child per engine. Returns ``{"rows": [{"max_num_seqs",
    "graph_tokens", "decode_tokens", "decode_step_ms", "ratio_to_reference"}], "reference", "engine_start_s"}``;
    the reference is the last engine's step at the longest length.

    Raises:
        engine_process.VLLMUnavailable: no importable vLLM.
        RuntimeError: an engine failed or missed the prefix cache (``measure_in_engine``).
    """
    engine_process.require_vllm(needed_by="benchmarks/decode_step_ab.py")
    vocab = text_config(load_config(target)).vocab_size
    ctx = -(-context // 256) * 256
    max_len = ctx + max(lengths) + 16
    rows, starts = [], {}
    with tempfile.TemporaryDirectory(prefix="decode-ab-") as tmp:
        for seqs, graph in engines:
            eng = engine_args(target, gpus=gpus, served_name=Path(target).name, max_model_len=max_len,
                              seed=0, max_num_seqs=seqs, kv_cache_tokens=3 * seqs * max_len,
                              graph_batch_tokens=graph, enable_prefix_caching=True)
            r = engine_process.run_child(ENTRY, {"engine": eng, "concurrencies": [1], "verify_tokens": [],
                                                 "context_tokens": ctx, "repeats": repeats, "vocab_size": vocab,
                                                 "seed": 0, "decode_lengths": lengths}, tmp, f"ab_{seqs}_{graph}")
            starts[f"{seqs}:{graph}"] = r["engine_start_s"]
            by = r["by_concurrency"]["1"]["decode_step_s_by_length"]
            rows += [{"max_num_seqs": seqs, "graph_tokens": graph, "decode_tokens": t,
                      "decode_step_ms": round(1e3 * by[str(t)], 4)} for t in lengths]
    ref = next(r for r in rows if (r["max_num_seqs"], r["graph_tokens"]) == engines[-1]
               and r["decode_tokens"] == max(lengths))
    for r in rows:
        r["ratio_to_reference"] = round(r["decode_step_ms"] / ref["decode_step_ms"], 4)
    return {"rows": rows, "reference": {k: ref[k] for k in ("max_num_seqs", "graph_tokens", "decode_tokens")},
            "engine_start_s": starts}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", help="the target's checkpoint directory")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs (0: vLLM's CPU backend)")
    ap.add_argument("--engines", nargs="+", default=["16:96", "1:1"], help="max_num_seqs:graph_tokens per engine")
    ap.add_argument("--lengths", nargs="+", type=int, default=[32, 96], help="decode lengths (output tokens)")
    ap.add_argument("--context", type=int, default=256, help="cached context tokens (rounded up to 256)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args(argv)
    engines = [tuple(int(x) for x in e.split(":")) for e in a.engines]
    if min(a.lengths) < 2 or any(len(e) != 2 or min(e) < 1 for e in engines):
        ap.error("--lengths must be >= 2 tokens and --engines SEQS:GRAPH_TOKENS, both >= 1")
    res = measure(a.target, a.gpus, engines, a.lengths, a.context, a.repeats)
    res.update(settings={"target": Path(a.target).name, "gpus": a.gpus, "context_tokens": a.context,
                         "repeats": a.repeats}, versions=software_versions(BENCHMARK_PACKAGES, keep_missing=False),
               hardware=hardware())
    print("max_num_seqs  graph_tokens  decode_tokens  decode_step_ms  ratio")
    for r in res["rows"]:
        print(f"{r['max_num_seqs']:>12}  {r['graph_tokens']:>12}  {r['decode_tokens']:>13}  {r['decode_step_ms']:>14.3f}"
              f"  {r['ratio_to_reference']:.3f}")
    print(f"engine starts (s): {res['engine_start_s']}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
