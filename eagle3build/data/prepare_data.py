"""Stage ``prepare_data``: conversation files -> tokenized train/eval splits with an assistant-only loss mask.

Pipeline: ingest (JSON array, JSONL, one JSON document with the records under a key, Parquet;
JSON optionally gzip/bz2/xz/zstd-compressed; a JSON array cut off mid-record keeps every complete
record) -> normalise (roles and turn order, one documented rule per defect, every skip counted
by reason) -> tokenize with the target's own chat template ->
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
text not a string          skip   ``non_string_text`` (nor a list of OpenAI text parts, which are joined)
image/audio/file part      skip   ``non_text_part`` (the part's type named)
lone UTF-16 surrogate      skip   ``bad_unicode`` (``"\\ud800"`` in JSON, or a byte of the file that is not
                                  UTF-8, counted in ``sources[].bad_utf8_bytes``; the field named)
empty / blank text         skip   ``empty_text``
system turn not first      skip   ``system_not_first``
leading assistant turns    fix    dropped (``fixed_leading_assistant``)
consecutive same role      fix    merged with a blank line (``fixed_merged_turns``)
trailing user turn         fix    dropped (``fixed_trailing_user``)
no assistant turn          skip   ``no_assistant_turn``
tool turn without a call   skip   ``tool_result_without_call`` (a tool result no assistant tool call precedes)
bad tool call / tools      skip   ``bad_tool_call`` (no function name), ``bad_tool_json`` (unparseable JSON string)
leading tool turns         fix    dropped with leading assistant turns (``fixed_leading_assistant``)
trailing tool turn         fix    dropped (``fixed_trailing_tool``): a conversation ends on the assistant
repeated conversation      skip   ``duplicate_conversation``: same content as an earlier record (whitespace
                                  collapsed; ``conversations.content_key``), dropped before the split
template cannot locate     skip   ``template_mismatch`` (assistant text not found in the render)
template drops tool calls  skip   ``template_drops_tool_calls``: a called function's name is not in the render
template raises            skip   ``template_error`` (e.g. a template that refuses a system turn; its message is kept)
too few supervised tokens  skip   ``too_few_supervised_tokens`` (after truncation); the detail says where
                                  the answer starts, in tokens, against ``max_seq_len``
=========================  =====  ==========================================================

Roles: human/user -> user; gpt/chatgpt/bing/bard/assistant/model -> assistant; system/developer;
tool/function/ipython/observation -> tool; ShareGPT's function_call -> an assistant tool call.
Tool calls, tool results, the record's ``tools`` and assistant reasoning (``reasoning_content``
or ``reasoning``) are rendered by the target's own chat template (``apply_chat_template(tools=...)``,
reasoning under the field the template reads: ``chat_masking.reasoning_key``; ``data.reasoning:
drop`` leaves it out, for a target served with thinking off). The loss mask covers what the
assistant emits (text, tool calls, reasoning, end-of-turn token), never tool results. The report
counts the turns that carried reasoning, how many the template rendered, and the tool turns.

Splits: by record id (``is_eval``); a record without one is named by its content
(``sha256:...``). A repeated conversation is dropped before the split, so no eval sample is a
train sample; a chat benchmark prompt whose opening turns (system and first user turn) open a
train conversation too is not written (``benchmark_prompts_seen_in_train``). An empty eval split
is refused here, before any capture. A token id at or beyond the target's ``vocab_size`` (a
tokenizer with added tokens the model has no row for) is refused naming the file, the record and
the token. A file that starts with a UTF-8 byte-order mark is read past it (``sources[].byte_order_mark``).

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
from collections import deque
from collections.abc import Iterator

import numpy as np

from .. import prompt_sets
from ..atomic import write_json, write_text
from ..config.settings import config_fields, job
from ..config.spec import key as config_key
from ..draft import methods
from ..formats.conversation_files import DataError, SourceStats, read_records, resolve_source_path
from ..formats.conversations import (
    EXAMPLES_PER_REASON,
    Conversation,
    Counters,
    content_key,
    normalise,
    template_messages,
)
from ..formats.tokens import write_tokens
from .chat_masking import TemplateRaised, answer_start, open_last_turn, reasoning_key, tokenize_batch

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 3  # 2: repeated conversations dropped, content ids for records without one; 3: tokens/2 (ids a tensor)
# Tokenization and chat-template rendering; the regenerated answers replace data.sources when enabled.
STAGE = {
    "inputs": ("target", "regenerated", "sources"), "packages": ("tokenizers", "transformers"), "entry": "prepare",
    "params": {"sources": "sources", "num_aux_layers": "num_aux_layers", "require_eval": "require_eval"},
    "keys": {"run": "files", "target.bundled": "files", "target.path": "files", "target.trust_remote_code": "trigger",
             "target.offline": "runtime", "data.sources": "trigger:sources", "data.regenerate.enabled": "trigger:sources",
             "data.max_seq_len": "trigger", "data.min_supervised_tokens": "trigger", "data.eval_fraction": "trigger",
             "data.seed": "trigger", "data.reasoning": "trigger", "data.prompts_file": "runtime",
             "capture.aux_layer_ids": "trigger:num_aux_layers", "capture.num_eval_samples": "trigger:require_eval",
             "benchmark.sets": "runtime", "resources.cpu.*": "runtime"},
}


# ---------------------------------------------------------------- split + files


def is_eval(sample_id: str, seed: int, eval_fraction: float) -> bool:
    """Deterministic split: a sample is in eval when ``sha256(seed:id)`` maps below ``eval_fraction``.

    Depends only on the sample's own id, so adding data never moves a sample between splits.
    """
    h = int.from_bytes(hashlib.sha256(f"{seed}:{sample_id}".encode()).digest()[:8], "big")
    return h / 2**64 < eval_fraction



TOKENIZE_BATCH = 64  # conversations per tokenizer call

# Batches handed to the pool and not yet consumed, per worker: enough to keep every worker busy while the main process
# consumes one, few enough that memory stays bounded (each holds TOKENIZE_BATCH conversations' ids and masks).
IN_FLIGHT_PER_WORKER = 2

_POOL_TOKENIZER = None  # a worker process's tokenizer (``_init_worker``)


def _init_worker(tok) -> None:
    """A pool worker's start: keep the parent's tokenizer (inherited through fork, not pickled), its Rust core on one
    thread (read when that core first runs, after the fork): the processes are the parallelism."""
    global _POOL_TOKENIZER
    os.environ["RAYON_NUM_THREADS"] = "1"
    _POOL_TOKENIZER = tok


def _tokenize_in_worker(args: tuple) -> list:
    """``chat_masking.tokenize_batch`` in a pool worker, on the worker's tokenizer."""
    return tokenize_batch(_POOL_TOKENIZER, *args)


def pool_processes(threads: int) -> int:
    """Tokenizing processes for a job of ``threads`` threads: one less than the threads (the main process reads,
    normalises, deduplicates and collects, about 40 % of the stage's time on the bundled ShareGPT file here) where that
    leaves two or more, else 1 (in the main process, whose Rust tokenizer then spreads each batch over the cores itself).
    A pool pays on a host with cores to spare only: on 2 shared cores the 3 processes took 1.5 times the one's
    (record ``prepare-data-workers``, docs/figures-other.md)."""
    return threads - 1 if threads > 2 else 1


class TokenizePool:
    """``chat_masking.tokenize_batch`` of whole batches, ``workers`` at a time: a ``concurrent.futures`` process pool
    (fork: the workers inherit the loaded tokenizer; the parent renders nothing before they start) where ``workers`` >
    1, else in this process. ``submit`` returns a future; results are taken in submission order by the caller, so the
    outputs do not depend on ``workers`` (rendering and tokenizing a conversation reads nothing but the conversation
    and the tokenizer). Why processes: the chat template's rendering, prefix by prefix for the loss mask
    (``chat_masking``), is Python (jinja2) and holds the GIL; it, not the Rust tokenizer, took one core for 58 s over
    10k conversations on a 16-core H100 host (issue 70)."""

    def __init__(self, tok, workers: int):
        import concurrent.futures as cf
        import multiprocessing

        self.tok, self.workers = tok, max(1, int(workers))
        self._cf = cf
        self.pool = (cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"),
                                            initializer=_init_worker, initargs=(tok,)) if self.workers > 1 else None)

    def submit(self, conversations: list[list[dict]], max_seq_len: int, tools: list, tails: list):
        """A future of ``tokenize_batch(tok, conversations, max_seq_len, tools, tails)``."""
        if self.pool is not None:
            return self.pool.submit(_tokenize_in_worker, (conversations, max_seq_len, tools, tails))
        done = self._cf.Future()
        done.set_result(tokenize_batch(self.tok, conversations, max_seq_len, tools, tails))
        return done

    def __enter__(self) -> TokenizePool:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


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


def _count_turns(extra: dict, conv: Conversation, tok, ids: np.ndarray, rendered: str | None, rkey: str | None,
                 tail: bool) -> None:
    """Report counts of one kept conversation: turns with reasoning (and how many the template rendered:
    the reasoning's first words appear in the sample's text), tool call and tool result turns."""
    extra["conversations_with_tools"] += bool(conv.tools)
    extra["regenerated_token_turns"] += tail
    for m in conv.messages:
        extra["tool_call_turns"] += bool(m.get("tool_calls"))
        extra["tool_result_turns"] += m["role"] == "tool"
        if m.get("reasoning"):
            extra["reasoning_turns"] += 1
            if rkey is None:
                continue
            if rendered is None:
                rendered = tok.decode(ids.tolist())
            words = " ".join(m["reasoning"].split()[:8])
            extra["reasoning_turns_rendered"] += words in " ".join(rendered.split())


def check_benchmark_prompts(tok, chat: list[dict], sets: list[str], prompts_file: str | os.PathLike | None
                            ) -> tuple[list[dict], dict]:
    """Render every prompt of the benchmark ``sets`` (each set's every first turn, ``PromptSet.load``: a set of the
    eval prompts, ``chat``, about to be written; a set of the prompts file, ``prompts_file``, where it is here; the
    later turns follow the target's answers, which the benchmark makes and checks) with ``tok``'s chat template and
    the generation prompt, as the benchmark's vLLM will. Returns ``(chat prompts the template renders,
    {set: {"prompts", "refused", "examples": [{"id", "detail"}] (the first three)}})``.

    Raises:
        PromptSetError: a set whose every prompt the template refuses; an unreadable ``prompts_file``.
    """
    by_set: dict[str, list[dict]] = {}
    sources = prompt_sets.Sources(user_prompts=prompts_file)
    for name in sets:
        st = prompt_sets.get(name)
        if st.needs == "eval":
            by_set[name] = chat
        elif st.needs == "file" and not (prompts_file and os.path.exists(prompts_file)):
            log.info("benchmark set %s: %s is not here; the benchmark checks its prompts", name, prompts_file)
        else:
            by_set[name] = st.load(sources)
    kept, refused = prompt_sets.drop_refused(
        by_set, lambda m: tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False))
    for name, bad in refused.items():
        for r in bad[:EXAMPLES_PER_REASON]:
            log.warning("benchmark set %s: prompt %s skipped, the target's chat template refuses it (%s)", name, r["id"],
                        r["detail"])
        if bad:
            log.warning("benchmark set %s: %d of %d prompts refused by the chat template", name, len(bad),
                        len(by_set[name]))
    report = {name: {"prompts": len(ps), "refused": len(refused[name]), "examples": refused[name][:EXAMPLES_PER_REASON]}
              for name, ps in by_set.items()}
    return next((kept[n] for n in kept if prompt_sets.get(n).needs == "eval"), chat), report


def _percentile(values: list[int], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def too_few_supervised_detail(supervised: int, minimum: int, max_seq_len: int, start: int | None) -> str:
    """The data report's words for a ``too_few_supervised_tokens`` skip: ``supervised`` answer tokens kept
    (of at least ``minimum``, data.min_supervised_tokens) within ``max_seq_len`` tokens (data.max_seq_len);
    ``start``: the index of the answer's first token in the whole render (``chat_masking.answer_start``),
    None where the conversation was not cut."""
    if start is None:
        return (f"only {supervised} supervised (answer) token{'s' if supervised != 1 else ''}, fewer than "
                f"data.min_supervised_tokens {minimum}")
    if start >= max_seq_len:
        return (f"the supervised answer starts at token {start}, beyond data.max_seq_len {max_seq_len}: "
                "the cut keeps none of it")
    return (f"the supervised answer starts at token {start} and data.max_seq_len is {max_seq_len}: the cut keeps "
            f"{supervised} of its tokens, fewer than data.min_supervised_tokens {minimum}")


@config_fields({
    "max_seq_len": "data.max_seq_len", "min_supervised_tokens": "data.min_supervised_tokens",
    "eval_fraction": "data.eval_fraction", "seed": "data.seed", "reasoning": "data.reasoning",
    "prompts_file": "data.prompts_file", "benchmark_sets": "benchmark.sets",
    "trust_remote_code": "target.trust_remote_code",
})
class PrepareSettings:
    """What one prepare_data job runs (``prepare``): the conversations of ``sources`` (``{"path": str,
    "max_samples": int | None}`` each; ``path`` may be ``bundled:sharegpt``; ``max_samples`` caps the conversations
    *kept* from that file: data.sources, or the regenerated answers, the contract's ``sources`` param) tokenized
    with the target of ``target_dir`` into ``out_train``, ``out_eval`` (tokens files), ``out_prompts`` (the first
    user turn of each eval-split conversation: benchmark set ``chat``, see ``prompt_sets``) and ``out_report``
    (the data report). ``num_aux_layers`` sizes the projected hidden-state bytes (``(num_aux_layers + 1) *
    hidden_size * 2`` bytes per token in bf16); ``require_eval``: an empty eval split is an error (the rule sets it
    when the run captures eval samples, ``capture.num_eval_samples`` > 0, whose shard jobs would fail on it later).
    Both are the contract's params (``workflow.contract.num_aux_layers_param``, ``require_eval_param``), by default
    those of the default config. ``workers``: the job's threads (``resources.threads``; runtime only, so a change
    replans nothing), of which ``pool_processes`` render and tokenize conversations at once: the files and the report
    are the same bytes for any number (``TokenizePool``). The config fields (below) are made from their keys' declarations
    (``config.settings``):
    ``reasoning``: ``keep`` (assistant reasoning rendered where the template reads it) or ``drop``;
    ``benchmark_sets`` (``benchmark.sets``) and ``prompts_file`` (``data.prompts_file``, set ``custom``): every
    prompt of those sets is checked against the target's chat template here (``prepare``).
    """

    sources: list[dict] = job("params.sources")
    target_dir: str | os.PathLike = job("params.target_dir")
    out_train: str | os.PathLike = job("outputs.train")
    out_eval: str | os.PathLike = job("outputs.eval")
    out_prompts: str | os.PathLike = job("outputs.prompts")
    out_report: str | os.PathLike = job("outputs.report")
    num_aux_layers: int = job("params.num_aux_layers",
                              default=methods.num_aux_layers(config_key("capture.aux_layer_ids").default))
    require_eval: bool = job("params.require_eval", default=config_key("capture.num_eval_samples").default > 0)
    workers: int = job("resources.threads?", default=1)


def prepare(s: PrepareSettings) -> dict:
    """Run the whole stage of ``s`` (``PrepareSettings``); returns the data report (also written to
    ``s.out_report``).

    Every prompt of the benchmark sets ``s.benchmark_sets`` (``custom``: ``s.prompts_file``) is rendered with the
    target's chat template and generation prompt before any GPU stage; one it refuses is a counted skip naming
    the prompt (report ``benchmark_prompt_check``; a refused chat prompt is not written), and a set it refuses
    whole stops the stage (``prompt_sets.drop_refused``), as does set ``chat`` left with no prompt at all where
    ``s.benchmark_sets`` names it. A custom file absent here (a job on another machine) is left to the benchmark,
    which checks again.

    Raises:
        DataError: a source file cannot be read at all; no sample survives; the eval split is
            empty while ``s.require_eval``; a token id is at or beyond the
            target's ``vocab_size`` (file, record, token id and text named).
        PromptSetError: a benchmark set whose every prompt the chat template refuses (set, prompt id and the
            template's message named); set ``chat``, named in ``s.benchmark_sets``, left without a prompt (no
            eval-split conversation opening with a user turn that does not open a train conversation too);
            an unreadable ``s.prompts_file`` (file and line named).
        ValueError: ``s.reasoning`` is neither ``keep`` nor ``drop`` (raised when ``s`` is made).
    """
    sources, target_dir, max_seq_len, reasoning = s.sources, s.target_dir, s.max_seq_len, s.reasoning
    min_supervised_tokens, eval_fraction, seed = s.min_supervised_tokens, s.eval_fraction, s.seed
    from transformers import AutoTokenizer

    from ..target import load_config, text_config
    from ..workflow.budgets import hidden_state_bytes_per_token

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(os.fspath(target_dir), trust_remote_code=s.trust_remote_code,
                                        local_files_only=True)
    if not tok.chat_template:
        raise DataError(f"target {target_dir}: tokenizer has no chat template")
    cfg = text_config(load_config(target_dir, s.trust_remote_code))
    hidden, vocab_size = cfg.hidden_size, cfg.vocab_size
    rkey = reasoning_key(tok) if reasoning == "keep" else None

    counters = Counters()
    source_stats: list[SourceStats] = []
    train: list[tuple[str, np.ndarray, np.ndarray]] = []
    evals: list[tuple[str, np.ndarray, np.ndarray]] = []
    prompts: list[tuple[str, dict]] = []  # (opening's content key, prompt)
    train_openings: set[str] = set()
    seen: set[str] = set()
    lengths: list[int] = []
    supervised = 0
    truncated = 0
    unfinished = 0
    extra = {"reasoning_turns": 0, "reasoning_turns_rendered": 0, "tool_call_turns": 0, "tool_result_turns": 0,
             "conversations_with_tools": 0, "regenerated_token_turns": 0}
    special_ids = set(tok.all_special_ids)

    def consume(path, stats: SourceStats, cap, fresh, tails, encs) -> None:
        # one tokenized batch, in order: every conversation's checks, counts and split (stops at the source's cap)
        nonlocal supervised, truncated, unfinished
        for (index, conv), enc, tail in zip(fresh, encs, tails, strict=True):
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
            bad = np.flatnonzero(ids >= vocab_size)
            if bad.size:
                t = int(ids[bad[0]])
                raise DataError(f"{path} record {index}: the target's tokenizer emits token id {t} "
                                f"({tok.convert_ids_to_tokens(t)!r}), but the target's config.json has vocab_size "
                                f"{vocab_size}: the model has no embedding row for it (a token added to the "
                                "tokenizer only?)")
            rendered = None
            calls = [c["function"]["name"] for m in conv.messages for c in m.get("tool_calls", [])]
            if calls and not was_truncated:
                # the call must be in what the assistant is trained to emit, not only named by a user or a result
                trained = tok.decode(ids[mask == 1].tolist())
                missing = [n for n in calls if n not in trained]
                if missing:
                    counters.skip("template_drops_tool_calls", str(path), index,
                                  f"function {missing[0]!r} is called but the template renders no call to it")
                    continue
            if conv.last_turn_unfinished and tail is None:
                mask = open_last_turn(ids, mask, special_ids)
            if int(mask.sum()) < min_supervised_tokens:
                start = answer_start(tok, template_messages(conv.messages[:-1] if tail is not None else conv.messages,
                                                            rkey), max_seq_len, conv.tools, tail) \
                    if was_truncated else None
                counters.skip("too_few_supervised_tokens", str(path), index,
                              too_few_supervised_detail(int(mask.sum()), min_supervised_tokens, max_seq_len, start))
                continue
            unfinished += conv.last_turn_unfinished
            _count_turns(extra, conv, tok, ids, rendered, rkey, tail is not None)
            truncated += was_truncated
            stats.kept += 1
            lengths.append(len(ids))
            supervised += int(mask.sum())
            sid = conv.id
            head = [m for m in conv.messages[:2] if m["role"] in ("system", "user")]
            if head and head[-1]["role"] != "user":
                head = []
            opening = content_key(head) if head else None
            if is_eval(sid, seed, eval_fraction):
                evals.append((sid, ids, mask))
                if head:
                    prompts.append((opening, {"id": sid, "messages": template_messages(head, None)}))
            else:
                train.append((sid, ids, mask))
                if opening:
                    train_openings.add(opening)

    with TokenizePool(tok, pool_processes(s.workers)) as pool:
        for src in sources:
            path = resolve_source_path(src["path"])
            stats = SourceStats(path=str(src["path"]))
            source_stats.append(stats)
            cap = src.get("max_samples")
            # Batches tokenized ahead, consumed in order: a batch is deduplicated and handed to the pool only where it
            # is sure to be used, i.e. where the source's cap cannot be reached before it even if every conversation
            # pending is kept; else the pending ones are consumed first. So what is read, normalised, deduplicated,
            # counted and kept is what one batch at a time gives (the batch after the cap is read, as there).
            pending: deque = deque()  # (fresh, tails, future)
            for batch in _normalised_batches(read_records(path, stats), str(path), counters, TOKENIZE_BATCH):
                while pending and cap is not None and stats.kept + sum(len(p[0]) for p in pending) >= cap:
                    consume(path, stats, cap, pending[0][0], pending[0][1], pending.popleft()[2].result())
                if cap is not None and stats.kept >= cap:
                    break
                fresh = []
                for index, conv in batch:
                    key = content_key(conv.messages, conv.tools)
                    if key in seen:
                        counters.skip("duplicate_conversation", str(path), index,
                                      f"same content as an earlier record ({key})")
                        continue
                    seen.add(key)
                    fresh.append((index, conv))
                tails = [conv.messages[-1].get("token_ids") for _, conv in fresh]
                pending.append((fresh, tails, pool.submit(
                    [template_messages(c.messages[:-1] if t is not None else c.messages, rkey)
                     for (_, c), t in zip(fresh, tails, strict=True)], max_seq_len, [c.tools for _, c in fresh], tails)))
                while len(pending) > IN_FLIGHT_PER_WORKER * pool.workers:
                    consume(path, stats, cap, pending[0][0], pending[0][1], pending.popleft()[2].result())
            while pending:
                consume(path, stats, cap, pending[0][0], pending[0][1], pending.popleft()[2].result())
    paths = [s["path"] for s in sources]
    if not train:
        raise DataError(f"no training sample survived preparation of {paths}; see the skip counts in the log")
    if s.require_eval and not evals:
        raise DataError(f"the eval split of {paths} is empty ({len(train)} train samples at data.eval_fraction "
                        f"{eval_fraction}), but capture.num_eval_samples asks for eval samples: raise data.eval_fraction or add "
                        "data (records are split by id; those without one by their content)")
    if extra["reasoning_turns"] and not extra["reasoning_turns_rendered"]:
        log.warning("%d assistant turns carry reasoning, but %s: it is not trained", extra["reasoning_turns"],
                    "data.reasoning is drop" if reasoning == "drop" else
                    "the target's chat template reads no reasoning field (reasoning_content, thinking, reasoning)")
    seen_in_train = sum(o in train_openings for o, _ in prompts)
    opened = len(prompts)
    prompts = [p for o, p in prompts if o not in train_openings]
    prompts, prompt_check = check_benchmark_prompts(tok, prompts, s.benchmark_sets, s.prompts_file)
    held_out = [n for n in s.benchmark_sets if prompt_sets.get(n).needs == "eval"]
    if held_out and not prompts:  # the benchmark would stop on it after training
        raise prompt_sets.PromptSetError(
            f"benchmark set {held_out[0]!r} would be empty: of the {len(evals)} eval-split conversations of {paths}, "
            f"{opened} open with a user turn and {seen_in_train} of those open a train conversation too "
            f"(benchmark_prompts_seen_in_train); raise data.eval_fraction or add data, or leave {held_out[0]} out of "
            "benchmark.sets")

    write_tokens(s.out_train, train)
    write_tokens(s.out_eval, evals)
    write_text(s.out_prompts, "".join(json.dumps(p) + "\n" for p in prompts))
    total_tokens = sum(lengths)
    bytes_per_token = hidden_state_bytes_per_token(s.num_aux_layers, hidden, "bfloat16")
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
        "duplicates_removed": counters.skipped.get("duplicate_conversation", 0),
        "benchmark_prompts_seen_in_train": seen_in_train,
        "benchmark_prompt_check": prompt_check,
        "truncated_to_max_seq_len": truncated,
        "last_turn_unfinished": unfinished,
        "reasoning": {"template_field": rkey, "setting": reasoning, "turns": extra["reasoning_turns"],
                      "turns_rendered": extra["reasoning_turns_rendered"]},
        "tools": {k: extra[k] for k in ("conversations_with_tools", "tool_call_turns", "tool_result_turns")},
        "regenerated_token_turns": extra["regenerated_token_turns"],
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
            "layers": s.num_aux_layers + 1,
            "hidden_size": hidden,
            "all_kept_samples": bytes_per_token * total_tokens,
        },
        "seconds": round(time.perf_counter() - t0, 2),
    }
    write_json(s.out_report, report)
    log.info(
        "data: read %d records, kept %d (train %d, eval %d), skipped %d %s, fixed %s; "
        "tokens mean %.0f p50 %.0f p95 %.0f max %d; supervised %.1f%%",
        report["records_read"], report["kept"], len(train), len(evals), report["skipped_total"], dict(counters.skipped),
        dict(counters.fixed), report["tokens"]["mean"], report["tokens"]["p50"], report["tokens"]["p95"],
        report["tokens"]["max"], 100 * report["supervised_fraction"],
    )
    return report
