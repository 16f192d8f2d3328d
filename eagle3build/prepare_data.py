"""Stage ``prepare_data``: conversation files -> tokenized train/eval splits with an assistant-only loss mask.

Pipeline: ingest (JSON array or JSONL; a JSON array cut off mid-record keeps every
complete record) -> normalise (roles and turn order, one documented rule per defect,
every skip counted by reason) -> tokenize with the target's own chat template ->
loss mask by rendering the conversation prefix by prefix (works for any template) ->
seeded train/eval split -> files + a data report.

Normalisation rules (each either fixes or skips, and is counted in the report):

=========================  =====  ==========================================================
defect                     rule   detail
=========================  =====  ==========================================================
record is not an object    skip   ``not_an_object``
no turn list               skip   ``missing_key`` (neither ``conversations`` nor ``messages``)
turn lacks role or text    skip   ``missing_key``
unknown role               skip   ``unknown_role``
text not a string          skip   ``non_string_text``
empty / blank text         skip   ``empty_text``
system turn not first      skip   ``system_not_first``
leading assistant turns    fix    dropped (``fixed_leading_assistant``)
consecutive same role      fix    merged with a blank line (``fixed_merged_turns``)
trailing user turn         fix    dropped (``fixed_trailing_user``)
no assistant turn          skip   ``no_assistant_turn``
template cannot locate     skip   ``template_mismatch`` (assistant text not found in the render)
template raises            skip   ``template_error`` (e.g. a template that refuses a system turn; its message is kept)
too few supervised tokens  skip   ``too_few_supervised_tokens`` (after truncation)
=========================  =====  ==========================================================

Roles: human/user -> user; gpt/chatgpt/bing/bard/assistant/model -> assistant; system.

A record with ``"last_turn_unfinished": true`` (written by ``regenerate_responses`` for an
answer cut at its ``max_tokens``) keeps that answer's text in the loss mask but not the
end-of-turn token the chat template closes it with (``open_last_turn``); counted in the
report as ``last_turn_unfinished``.

The stage's parts live in the shared layer: ingest and normalisation in
``conversations.py``, chat-template tokenization and the loss mask in ``chat_masking.py``,
the tokens file format in ``tokens.py``; this module keeps the split, the files and the report.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator

import numpy as np

from .atomic import write_json, write_text
from .chat_masking import TemplateRaised, open_last_turn, tokenize_batch
from .conversations import Conversation, Counters, DataError, SourceStats, normalise, read_records, resolve_source_path
from .tokens import write_tokens

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 1


# ---------------------------------------------------------------- split + files


def is_eval(sample_id: str, seed: int, eval_fraction: float) -> bool:
    """Deterministic split: a sample is in eval when ``sha256(seed:id)`` maps below ``eval_fraction``.

    Depends only on the sample's own id, so adding data never moves a sample between splits.
    """
    h = int.from_bytes(hashlib.sha256(f"{seed}:{sample_id}".encode()).digest()[:8], "big")
    return h / 2**64 < eval_fraction



TOKENIZE_BATCH = 64  # conversations per tokenizer call


def _normalised_batches(records, source: str, counters: Counters, n: int) -> Iterator[list[tuple[int, Conversation]]]:
    """Normalised conversations of ``records`` in lists of up to ``n`` ``(record_index, conversation)``."""
    batch: list[tuple[int, Conversation]] = []
    for index, rec in records:
        conv = normalise(rec, source, index, counters)
        if conv is None:
            continue
        batch.append((index, conv))
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def _percentile(values: list[int], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def prepare(
    sources: list[dict],
    target_dir: str | os.PathLike,
    out_train: str | os.PathLike,
    out_eval: str | os.PathLike,
    out_prompts: str | os.PathLike,
    out_report: str | os.PathLike,
    max_seq_len: int,
    min_supervised_tokens: int,
    eval_fraction: float,
    seed: int,
    num_aux_layers: int = 3,
    trust_remote_code: bool = False,
) -> dict:
    """Run the whole stage; returns the data report (also written to ``out_report``).

    ``sources``: list of ``{"path": str, "max_samples": int | None}``; ``path`` may be
    ``bundled:sharegpt``. ``max_samples`` caps the conversations *kept* from that file.
    ``num_aux_layers`` sizes the projected hidden-state bytes: ``(num_aux_layers + 1) *
    hidden_size * 2`` bytes per token in bf16. ``out_prompts``: the first user turn of each
    eval-split conversation (benchmark set ``chat``, see ``prompt_sets``).

    Raises:
        DataError: a source file cannot be read at all, or no sample survives.
    """
    from transformers import AutoTokenizer

    from .plans import hidden_state_bytes_per_token
    from .target import load_config, text_config

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(os.fspath(target_dir), trust_remote_code=trust_remote_code, local_files_only=True)
    if not tok.chat_template:
        raise DataError(f"target {target_dir}: tokenizer has no chat template")
    hidden = text_config(load_config(target_dir, trust_remote_code)).hidden_size

    counters = Counters()
    source_stats: list[SourceStats] = []
    train: list[tuple[str, np.ndarray, np.ndarray]] = []
    evals: list[tuple[str, np.ndarray, np.ndarray]] = []
    prompts: list[dict] = []
    lengths: list[int] = []
    supervised = 0
    truncated = 0
    unfinished = 0
    special_ids = set(tok.all_special_ids)
    for src in sources:
        path = resolve_source_path(src["path"])
        stats = SourceStats(path=str(src["path"]))
        source_stats.append(stats)
        cap = src.get("max_samples")
        for batch in _normalised_batches(read_records(path, stats), str(path), counters, TOKENIZE_BATCH):
            if cap is not None and stats.kept >= cap:
                break
            encs = tokenize_batch(tok, [c.messages for _, c in batch], max_seq_len)
            for (index, conv), enc in zip(batch, encs, strict=True):
                if cap is not None and stats.kept >= cap:
                    break
                if isinstance(enc, TemplateRaised):
                    counters.skip("template_error", str(path), index, enc.message)
                    continue
                if enc is None:
                    counters.skip("template_mismatch", str(path), index,
                                  "an assistant turn is not found in the template's render")
                    continue
                ids, mask, was_truncated = enc
                if conv.last_turn_unfinished:
                    mask = open_last_turn(ids, mask, special_ids)
                    unfinished += 1
                if int(mask.sum()) < min_supervised_tokens:
                    counters.skip("too_few_supervised_tokens", str(path), index, f"{int(mask.sum())} < {min_supervised_tokens}")
                    continue
                truncated += was_truncated
                stats.kept += 1
                lengths.append(len(ids))
                supervised += int(mask.sum())
                sid = conv.id
                if is_eval(sid, seed, eval_fraction):
                    evals.append((sid, ids, mask))
                    head = [m for m in conv.messages[:2] if m["role"] in ("system", "user")]
                    if head and head[-1]["role"] == "user":
                        prompts.append({"id": sid, "messages": head})
                else:
                    train.append((sid, ids, mask))
    if not train:
        paths = [s["path"] for s in sources]
        raise DataError(f"no training sample survived preparation of {paths}; see the skip counts in the log")

    write_tokens(out_train, train)
    write_tokens(out_eval, evals)
    write_text(out_prompts, "".join(json.dumps(p) + "\n" for p in prompts))
    total_tokens = sum(lengths)
    bytes_per_token = hidden_state_bytes_per_token(num_aux_layers, hidden, "bfloat16")
    report = {
        "sources": [s.__dict__ for s in source_stats],
        "records_read": sum(s.records_read for s in source_stats),
        "kept": len(lengths),
        "train_samples": len(train),
        "eval_samples": len(evals),
        "benchmark_prompts": len(prompts),
        "skipped": dict(counters.skipped),
        "skipped_total": sum(counters.skipped.values()),
        "skip_examples": counters.examples,
        "fixed": dict(counters.fixed),
        "truncated_to_max_seq_len": truncated,
        "last_turn_unfinished": unfinished,
        "max_seq_len": max_seq_len,
        "tokens": {
            "total": total_tokens,
            "mean": total_tokens / len(lengths),
            "p50": _percentile(lengths, 50),
            "p95": _percentile(lengths, 95),
            "max": max(lengths),
        },
        "supervised_tokens": supervised,
        "supervised_fraction": supervised / total_tokens,
        "hidden_state_bytes": {
            "per_token_bf16": bytes_per_token,
            "layers": num_aux_layers + 1,
            "hidden_size": hidden,
            "all_kept_samples": bytes_per_token * total_tokens,
        },
        "seconds": round(time.perf_counter() - t0, 2),
    }
    write_json(out_report, report)
    log.info(
        "data: read %d records, kept %d (train %d, eval %d), skipped %d %s, fixed %s; "
        "tokens mean %.0f p50 %.0f p95 %.0f max %d; supervised %.1f%%",
        report["records_read"], report["kept"], len(train), len(evals), report["skipped_total"], dict(counters.skipped),
        dict(counters.fixed), report["tokens"]["mean"], report["tokens"]["p50"], report["tokens"]["p95"],
        report["tokens"]["max"], 100 * report["supervised_fraction"],
    )
    return report
