"""Chat-template rendering -> token ids and an assistant-only loss mask (private to the data subpackage).

Template-agnostic: the conversation is rendered prefix by prefix and the characters each
assistant turn adds are masked (see ``assistant_char_spans``): its text, tool calls, reasoning
and end-of-turn token, as the target emits them; tool results and user turns are context.
Where the template also marks ``{% generation %}`` blocks, transformers' own
``return_assistant_tokens_mask`` is computed too and the union taken: such templates often put
the end-of-turn token after ``{% endgeneration %}``, which the serving engine still sees the
target emit. Used by stage ``prepare_data``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np


def open_last_turn(ids: np.ndarray, mask: np.ndarray, special_ids: set[int]) -> np.ndarray:
    """The loss mask without the end-of-turn token(s) of the last supervised turn.

    For a conversation whose last assistant answer was cut at a generation cap
    (``max_tokens``): the template still closes the turn, but the target never emitted that
    end-of-turn token there, so it must not be trained as the answer's end. Clears the
    trailing run of special tokens (``tokenizer.all_special_ids``: ``<|im_end|>``,
    ``<|eot_id|>``, ``</s>``, ...) at the end of the last masked run; the answer's own text
    has none (it is decoded without special tokens). ``ids`` int32 [T], ``mask`` uint8 [T]
    -> a new uint8 [T] mask. A turn truncated away by ``max_seq_len`` has no end token
    inside and is returned unchanged.
    """
    mask = mask.copy()
    on = np.flatnonzero(mask)
    if on.size == 0:
        return mask
    j = int(on[-1])
    while j >= 0 and mask[j] and int(ids[j]) in special_ids:
        mask[j] = 0
        j -= 1
    return mask


SENTINEL = "\u2063EAGLE3BUILD-TURN\u2063"  # invisible separator: no template rewrites it


def reasoning_key(tokenizer) -> str | None:
    """The message field the chat template reads an assistant's reasoning from:
    ``reasoning_content`` (Qwen3, Kimi-K2, DeepSeek-V3.1 templates), ``thinking`` (gpt-oss) or
    ``reasoning``, by the first the template's source names; None where it names none (reasoning
    given to such a template would not be rendered)."""
    t = tokenizer.chat_template or ""
    if not isinstance(t, str):
        return None
    for key in ("reasoning_content", "thinking", "reasoning"):
        if re.search(rf"(\.{key}\b|\[['\"]{key}['\"]\])", t):
            return key
    return None


def _render(tokenizer, messages, tools=None, **kw) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kw)


def assistant_char_spans(tokenizer, messages: list[dict], full: str,
                         limit: int | None = None, tools: list | None = None) -> list[tuple[int, int]] | None:
    """Character spans of ``full`` (the rendered conversation) that the loss mask covers.

    Template-agnostic, by rendering. For assistant turn ``i`` the span starts where the
    render of ``messages[:i]`` with the generation prompt ends, and ends where the render
    of ``messages[:i+1]`` ends, less trailing whitespace: the assistant text, its
    end-of-turn token, and anything else the template makes the assistant emit (e.g.
    Qwen3's think block).

    Templates that render a turn differently once it is history (Qwen3 drops earlier
    reasoning) break that prefix property. Such a turn is located by rendering the whole
    conversation with its content replaced by a sentinel: the text before the sentinel
    and after it must frame ``full``, and what lies between is the turn as the template
    renders it in context; the end-of-turn text is what follows the sentinel when the
    turn is last. Returns None when a turn cannot be located either way. Turns that start
    at or after character ``limit`` (beyond the truncation) are not located.
    """
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], tools, add_generation_prompt=True)
        if limit is not None and len(before) >= limit:
            break
        after = _render(tokenizer, messages[: i + 1], tools)
        if after.startswith(before) and full.startswith(after):
            span = (len(before), len(after.rstrip()))
        else:
            span = _span_in_context(tokenizer, messages, i, full, before, tools)
            if span is None:
                return None
        if span[1] > span[0]:
            spans.append(span)
    return spans


def _span_in_context(tokenizer, messages, i, full, before, tools=None) -> tuple[int, int] | None:
    def render(msgs):
        return _render(tokenizer, msgs, tools)

    swapped = [dict(x, content=SENTINEL) if j == i else x for j, x in enumerate(messages)]
    framed = render(swapped)
    if framed.count(SENTINEL) != 1:
        return None
    prefix, suffix = framed.split(SENTINEL)
    if not (full.startswith(prefix) and full.endswith(suffix)) or len(prefix) + len(suffix) > len(full):
        return None
    last = render(swapped[: i + 1])
    tail = last[last.index(SENTINEL) + len(SENTINEL):].rstrip() if SENTINEL in last else ""
    if not suffix.startswith(tail):
        tail = ""
    start = len(before) if prefix.startswith(before) else len(prefix)
    return start, len(full) - len(suffix) + len(tail)


GENERATION_TAGS = ("{% generation %}", "{%- generation %}", "{% generation -%}", "{%- generation -%}")


def has_generation_tags(tokenizer) -> bool:
    """Whether the chat template marks assistant output with ``{% generation %}`` blocks."""
    t = tokenizer.chat_template or ""
    return isinstance(t, str) and any(tag in t for tag in GENERATION_TAGS)


# A token of a byte-level BPE vocabulary spans at most a few characters except in long
# runs of one character; tokenizing only the first max_seq_len * 8 characters, and going
# back for more when that yields too few tokens, avoids tokenizing the tail of long
# conversations that truncation throws away (ShareGPT's longest are >50k tokens).
CHARS_PER_TOKEN_BOUND = 8
# Tokens past the cut that must exist before the first max_seq_len are trusted: the cut
# can only change the segmentation of the pre-token it falls in.
CUT_MARGIN = 64


def _encode_prefixes(tokenizer, texts: list[str], max_seq_len: int) -> list[tuple[list[int], list[int], bool]]:
    """``(ids, char_starts, truncated)`` of the first ``max_seq_len`` tokens of each text, tokenized as one batch."""
    limit = max_seq_len * CHARS_PER_TOKEN_BOUND
    todo = list(range(len(texts)))
    out: list = [None] * len(texts)
    while todo:
        enc = tokenizer([texts[i][:limit] for i in todo], add_special_tokens=False, return_offsets_mapping=True)
        again = []
        for k, i in enumerate(todo):
            ids, offs = enc["input_ids"][k], enc["offset_mapping"][k]
            if len(texts[i]) > limit and len(ids) < max_seq_len + CUT_MARGIN:
                again.append(i)  # cut too close: tokenize a longer prefix
                continue
            out[i] = (ids[:max_seq_len], [o[0] for o in offs[:max_seq_len]], len(ids) > max_seq_len)
        todo, limit = again, limit * 4
    return out


@dataclass(frozen=True)
class TemplateRaised:
    """The chat template raised while rendering one conversation; ``message`` is its error text."""

    message: str


def _template_message(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"[:500]


def tokenize_batch(
    tokenizer, conversations: list[list[dict]], max_seq_len: int, tools: list | None = None,
    tails: list[list[int] | None] | None = None,
) -> list[tuple[np.ndarray, np.ndarray, bool] | None | TemplateRaised]:
    """``tokenize_with_mask`` for many conversations, plus whether each was truncated.

    ``tools``: per conversation, its tool schemas or None (``apply_chat_template(tools=...)``).
    ``tails``: per conversation, None or the token ids the target generated for one more
    assistant turn (a regenerated answer): the conversation (ending on a user or tool turn) is
    then rendered with the generation prompt and those ids appended as they are, all supervised
    (the end-of-turn token only where the target emitted it), so that the trained tokens are the
    served ones even where decoding to text would drop special tokens.

    The tokenizer runs once over the whole batch (its Rust core uses every core). A
    conversation whose render raises (many templates ``raise_exception`` on a system turn
    or on roles they do not know; jinja2 raises ``TemplateError``, others ``TypeError``
    and the like) yields ``TemplateRaised`` with the template's message instead of
    failing the batch: one record must not lose the others. Where the template marks
    ``{% generation %}`` blocks, the mask is the union of ours and transformers'
    ``assistant_masks`` (on the same token ids).
    """
    n = len(conversations)
    tools = tools or [None] * n
    tails = tails or [None] * n
    out: list = [None] * n
    fulls: dict[int, str] = {}
    for k, m in enumerate(conversations):
        try:
            fulls[k] = _render(tokenizer, m, tools[k], add_generation_prompt=tails[k] is not None)
        except Exception as e:  # noqa: BLE001 -- a template may raise anything; see the docstring
            out[k] = TemplateRaised(_template_message(e))
    order = sorted(fulls)
    encoded = _encode_prefixes(tokenizer, [fulls[k] for k in order], max_seq_len) if order else []
    marked = has_generation_tags(tokenizer)
    for k, (ids_l, starts_l, truncated) in zip(order, encoded, strict=True):
        messages, full = conversations[k], fulls[k]
        limit = (starts_l[-1] + 1) if len(ids_l) == max_seq_len else None
        try:
            spans = assistant_char_spans(tokenizer, messages, full, limit, tools[k])
        except Exception as e:  # noqa: BLE001 -- a prefix render may raise where the full one did not
            out[k] = TemplateRaised(_template_message(e))
            continue
        if spans is None:
            continue  # stays None: template_mismatch
        ids = np.asarray(ids_l, dtype=np.int32)
        starts = np.asarray(starts_l, dtype=np.int64)
        mask = np.zeros(len(ids), dtype=np.uint8)
        for s, e in spans:
            mask |= ((starts >= s) & (starts < e)).astype(np.uint8)
        if marked and tails[k] is None:
            try:
                theirs = transformers_assistant_mask(tokenizer, messages, tools[k], len(ids))
            except Exception as e:  # noqa: BLE001
                out[k] = TemplateRaised(_template_message(e))
                continue
            if theirs is not None and theirs[0].tolist() == ids.tolist():
                mask |= theirs[1]
        if tails[k] is not None:
            tail = np.asarray(tails[k], dtype=np.int32)[: max(0, max_seq_len - len(ids))]
            truncated = truncated or len(ids) + len(tails[k]) > max_seq_len
            ids = np.concatenate([ids, tail])
            mask = np.concatenate([mask, np.ones(len(tail), np.uint8)])
        out[k] = (ids, mask, truncated)
    return out


# A length no render reaches: tokenize_batch at this max_seq_len keeps a conversation whole.
UNBOUNDED_TOKENS = 1 << 40


def answer_start(tokenizer, messages: list[dict], max_seq_len: int, tools: list | None = None,
                 tail: list[int] | None = None) -> int | None:
    """The index (0-based, in tokens) of the first supervised token of the conversation ``messages``
    rendered whole, that is without the cut at ``max_seq_len`` that ``tokenize_batch`` makes; None where
    it has no supervised token at all or its render fails. ``max_seq_len`` is only the shortcut: where
    the cut render already holds a supervised token, that one's index is the answer. Costs a second
    tokenization of the conversation (used for skipped records only: the data report's detail).
    """
    for limit in (max_seq_len, UNBOUNDED_TOKENS):
        (enc,) = tokenize_batch(tokenizer, [messages], limit, [tools], [tail])
        if not isinstance(enc, tuple):
            return None
        ids, mask, truncated = enc
        hits = np.flatnonzero(mask)
        if hits.size:
            return int(hits[0])
        if not truncated:
            return None
    return None


def transformers_assistant_mask(tokenizer, messages: list[dict], tools: list | None,
                                length: int) -> tuple[np.ndarray, np.ndarray] | None:
    """transformers' ``return_assistant_tokens_mask`` for a template with ``{% generation %}``
    blocks: ``(input_ids int32 [<= length], assistant_masks uint8)``, cut to ``length`` tokens."""
    enc = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int32)[:length]
    return ids, np.asarray(enc["assistant_masks"], dtype=np.uint8)[:length]


def tokenize_with_mask(tokenizer, messages: list[dict], max_seq_len: int,
                       tools: list | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """Render ``messages`` (and ``tools``) with the tokenizer's chat template and tokenize.

    Returns ``(input_ids int32 [T], loss_mask uint8 [T])`` with ``T <= max_seq_len``
    (truncated, not dropped). ``loss_mask[j] == 1`` for tokens that start inside an assistant
    span (see ``assistant_char_spans``), and where the template marks ``{% generation %}``
    blocks also for those transformers' ``return_assistant_tokens_mask`` marks. None when the
    render does not contain an assistant turn's text.
    """
    enc = tokenize_batch(tokenizer, [messages], max_seq_len, [tools])[0]
    return None if enc is None or isinstance(enc, TemplateRaised) else enc[:2]
