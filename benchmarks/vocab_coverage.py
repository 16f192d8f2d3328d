"""How much of what the target actually emits a draft vocabulary of each size can propose.

A draft head proposes only tokens of its draft vocab (d2t), so a target token outside it is a
rejection at that position whatever the head learned: with lossless greedy decoding, accepted
tokens <= (share of the target's served output tokens inside the draft vocab) x output tokens. The draft
vocab is built exactly as the ``build_vocab_map`` stage builds it (speculators'
``build_vocab_mappings_from_distribution`` over the assistant-token counts of the run's first
``--num-samples`` train samples); the served output is the baseline texts of the project's own
``benchmark.json`` (the target's greedy answers), re-tokenized with the target's tokenizer.

    python benchmarks/vocab_coverage.py --tokens results/R/data/train.safetensors \
        --num-samples 8000 --target resources/targets/smollm2-135m-instruct \
        --benchmark results/R/benchmark.json --sizes 8192 16384 32000 [--json out.json]

Prints, per size: the share of the counted training tokens covered (``vocab.json``'s
``coverage``) and, per prompt set, the share of the baseline's output tokens covered.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def coverage(tokens_path: str, target_dir: str, benchmark_path: str, sizes: list[int],
             num_samples: int | None = None) -> dict:
    """Per draft vocab size (tokens): ``train`` (share of counted assistant tokens) and, per set of
    ``benchmark.json``'s baseline, the share of its output tokens (re-tokenized, no special tokens)
    inside the draft vocab; shares in [0, 1], rounded to 4 places.

    Raises:
        KeyError: the benchmark JSON has no ``baseline.sets.<set>.texts``.
        ValueError: a size exceeds the target vocabulary.
    """
    from collections import Counter

    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
    from transformers import AutoTokenizer

    from eagle3build.draft.vocab_map import coverage as share
    from eagle3build.draft.vocab_map import draft_target_ids
    from eagle3build.train.build_vocab_map import count_assistant_tokens

    freq = count_assistant_tokens(tokens_path, num_samples)
    tok = AutoTokenizer.from_pretrained(target_dir)
    target_vocab = len(tok)
    result = json.loads(Path(benchmark_path).read_text())
    served = {name: [i for text in s["texts"] for i in tok(text, add_special_tokens=False).input_ids]
              for name, s in result["baseline"]["sets"].items()}
    total = sum(freq.values())
    rows = []
    for n in sizes:
        if n > target_vocab:
            raise ValueError(f"draft vocab size {n} exceeds the target vocabulary ({target_vocab})")
        d2t, _ = build_vocab_mappings_from_distribution(freq, n, target_vocab)
        draft = set(draft_target_ids(d2t).tolist())
        row = {"draft_vocab_size": n, "train": round(share(freq, draft), 4)}
        row["sets"] = {name: {"tokens": len(ids), "coverage": round(share(Counter(ids), draft), 4)}
                       for name, ids in served.items() if ids}
        rows.append(row)
    return {"tokens": str(tokens_path), "num_samples": num_samples, "benchmark": str(benchmark_path),
            "distinct_tokens_seen": len(freq), "tokens_counted": total, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", required=True, help="the run's data/train.safetensors")
    ap.add_argument("--num-samples", type=int, default=None, help="capture.num_train_samples (default: all)")
    ap.add_argument("--target", required=True, help="the target's HF directory (its tokenizer)")
    ap.add_argument("--benchmark", required=True, help="a benchmark.json with baseline texts")
    ap.add_argument("--sizes", type=int, nargs="+", default=[8192, 16384, 32000])
    ap.add_argument("--json", default=None, help="also write the result here")
    a = ap.parse_args(argv)
    out = coverage(a.tokens, a.target, a.benchmark, a.sizes, a.num_samples)
    for r in out["rows"]:
        sets = ", ".join(f"{k} {v['coverage']:.2%} of {v['tokens']}" for k, v in r["sets"].items())
        print(f"draft vocab {r['draft_vocab_size']}: train {r['train']:.2%}; served {sets}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
