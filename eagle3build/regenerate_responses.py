"""Stage ``regenerate_responses`` (opt-in, ``data.regenerate.enabled``): the target answers the conversations itself.

A draft head is served against the target's own greedy outputs, so it learns best from
them (EAGLE-3 paper §4 and speculators' response-regeneration scripts do the same).
Between ingest and tokenization: the conversations of ``data.sources`` are normalised by
``prepare_data``'s rules (same skip counts), then turn by turn every assistant turn is
replaced by the target's greedy answer to the conversation so far (earlier turns already
regenerated), in vLLM batches — one batch per turn position over all conversations. A
conversation stops at the first turn whose prompt reaches ``max_seq_len`` tokens: what
follows would be truncated away by tokenization anyway. The output is a chat-messages
JSONL with the records' ids, so the train/eval split and the benchmark prompts stay the same.

vLLM runs in a child process with the benchmark's CPU environment (``benchmark._run_child``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from .atomic import write_json, write_text
from .prepare_data import Conversation, Counters, DataError, SourceStats, normalise, read_records, resolve_source_path

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 1


def collect(sources: list[dict]) -> tuple[list[Conversation], Counters, list[SourceStats]]:
    """Normalised conversations of ``sources`` (``{"path", "max_samples"}``), at most ``max_samples`` per source.

    Raises:
        DataError: a source cannot be read, or no conversation survives normalisation.
    """
    convs: list[Conversation] = []
    counters = Counters()
    stats_all = []
    for src in sources:
        path = resolve_source_path(src["path"])
        stats = SourceStats(path=str(src["path"]))
        stats_all.append(stats)
        cap = src.get("max_samples")
        for index, rec in read_records(path, stats):
            if cap is not None and stats.kept >= cap:
                break
            conv = normalise(rec, str(path), index, counters)
            if conv is not None:
                stats.kept += 1
                convs.append(conv)
    if not convs:
        raise DataError(f"no conversation to regenerate in {[s['path'] for s in sources]}")
    return convs, counters, stats_all


def regenerate(
    sources: list[dict],
    target_dir: str,
    out_jsonl: str | os.PathLike,
    out_report: str | os.PathLike,
    max_seq_len: int,
    max_tokens: int,
    served_name: str,
    dtype: str = "float32",
    seed: int = 0,
) -> dict:
    """Replace every assistant turn with the target's greedy answer; write ``out_jsonl`` and a report.

    ``max_tokens``: cap of one regenerated answer (tokens). Report: conversations in and
    out, assistant turns regenerated, conversations cut at ``max_seq_len``, answers that hit
    ``max_tokens``, generated tokens and tokens/s, skip counts of normalisation.

    Raises:
        DataError: no conversation in the sources.
        RuntimeError: the vLLM child failed.
    """
    from .benchmark import _run_child, engine_kwargs

    t0 = time.perf_counter()
    convs, counters, stats = collect(sources)
    eng = engine_kwargs(os.path.abspath(target_dir), dtype, served_name, max_seq_len + max_tokens, seed)
    spec = {"engine": eng, "conversations": [c.messages for c in convs], "max_tokens": max_tokens,
            "max_seq_len": max_seq_len}
    with tempfile.TemporaryDirectory(prefix="eagle3-regen-") as tmp:
        res = _run_child(spec, Path(tmp), "regenerate", module="eagle3build.regenerate_responses")
    lines, n_out = [], 0
    for conv, msgs in zip(convs, res["conversations"], strict=True):
        if any(m["role"] == "assistant" for m in msgs):
            lines.append(json.dumps({"id": conv.id, "messages": msgs}, ensure_ascii=False))
            n_out += 1
    report = {
        "sources": [s.__dict__ for s in stats],
        "skipped": dict(counters.skipped),
        "fixed": dict(counters.fixed),
        "conversations_in": len(convs),
        "conversations_out": n_out,
        **{k: res[k] for k in ("turns_regenerated", "conversations_cut_at_max_seq_len", "answers_at_max_tokens",
                               "generated_tokens", "generate_seconds")},
        "generated_tokens_per_s": round(res["generated_tokens"] / max(res["generate_seconds"], 1e-9), 1),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_text(out_jsonl, "\n".join(lines) + "\n")
    write_json(out_report, report)
    log.info("regenerated %d assistant turns of %d conversations (%d tokens, %.0f tokens/s)", report["turns_regenerated"],
             n_out, report["generated_tokens"], report["generated_tokens_per_s"])
    return report


def run_child(spec: dict) -> dict:
    """Inside the child: rounds of ``LLM.chat`` over the conversations' next assistant turns."""
    from vllm import LLM, SamplingParams

    llm = LLM(**spec["engine"])
    tok = llm.get_tokenizer()
    sp = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"])
    limit = spec["max_seq_len"]
    todo = [list(m) for m in spec["conversations"]]
    done: list[list[dict]] = [[] for _ in todo]
    active = list(range(len(todo)))
    turns = cut = at_max = gen_tokens = 0
    gen_s = 0.0
    while active:
        prompts, ids = [], []
        for i in active:
            while todo[i] and todo[i][0]["role"] != "assistant":
                done[i].append(todo[i].pop(0))
            if not todo[i]:
                continue
            todo[i].pop(0)  # the original answer, replaced below
            text = tok.apply_chat_template(done[i], add_generation_prompt=True, tokenize=False)
            n = len(tok.encode(text, add_special_tokens=False))
            if n >= limit:
                cut += 1
                todo[i] = []
                continue
            prompts.append(done[i])
            ids.append(i)
        if not prompts:
            break
        t = time.perf_counter()
        outs = llm.chat(prompts, sp, use_tqdm=False)
        gen_s += time.perf_counter() - t
        for i, o in zip(ids, outs, strict=True):
            c = o.outputs[0]
            done[i].append({"role": "assistant", "content": c.text})
            gen_tokens += len(c.token_ids)
            at_max += c.finish_reason == "length"
            turns += 1
        active = [i for i in ids if todo[i]]
        print(f"regenerate: round done, {turns} turns, {gen_tokens} tokens, {gen_tokens / max(gen_s, 1e-9):.0f} tok/s",
              file=sys.stderr, flush=True)
    # A conversation ends on an assistant turn (prepare_data's rule): drop trailing user turns.
    for d in done:
        while d and d[-1]["role"] != "assistant":
            d.pop()
    return {"conversations": done, "turns_regenerated": turns, "conversations_cut_at_max_seq_len": cut,
            "answers_at_max_tokens": at_max, "generated_tokens": gen_tokens, "generate_seconds": round(gen_s, 2)}


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "run":
        Path(sys.argv[3]).write_text(json.dumps(run_child(json.loads(Path(sys.argv[2]).read_text()))))
    else:
        sys.exit("usage: python -m eagle3build.regenerate_responses run SPEC.json OUT.json")
