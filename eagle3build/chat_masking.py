"""Chat-template rendering -> token ids and an assistant-only loss mask (shared layer).

Template-agnostic: where the template marks ``{% generation %}`` blocks the mask is
transformers' own ``return_assistant_tokens_mask``; otherwise the conversation is rendered
prefix by prefix and the characters each assistant turn adds are masked (see
``assistant_char_spans``). Used by stage ``prepare_data``.
"""

from __future__ import annotations

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


def assistant_char_spans(tokenizer, messages: list[dict[str, str]], full: str,
                         limit: int | None = None) -> list[tuple[int, int]] | None:
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
        before = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        if limit is not None and len(before) >= limit:
            break
        after = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if after.startswith(before) and full.startswith(after):
            span = (len(before), len(after.rstrip()))
        else:
            span = _span_in_context(tokenizer, messages, i, full, before)
            if span is None:
                return None
        if span[1] > span[0]:
            spans.append(span)
    return spans


def _span_in_context(tokenizer, messages, i, full, before) -> tuple[int, int] | None:
    def render(msgs):
        return tokenizer.apply_chat_template(msgs, tokenize=False)

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
    tokenizer, conversations: list[list[dict[str, str]]], max_seq_len: int
) -> list[tuple[np.ndarray, np.ndarray, bool] | None | TemplateRaised]:
    """``tokenize_with_mask`` for many conversations, plus whether each was truncated.

    The tokenizer runs once over the whole batch (its Rust core uses every core). A
    conversation whose render raises (many templates ``raise_exception`` on a system turn
    or on roles they do not know; jinja2 raises ``TemplateError``, others ``TypeError``
    and the like) yields ``TemplateRaised`` with the template's message instead of
    failing the batch: one record must not lose the others.
    """
    if has_generation_tags(tokenizer):
        out = []
        for messages in conversations:
            try:
                enc = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            except Exception as e:  # noqa: BLE001 -- a template may raise anything; see the docstring
                out.append(TemplateRaised(_template_message(e)))
                continue
            ids = np.asarray(enc["input_ids"], dtype=np.int32)
            mask = np.asarray(enc["assistant_masks"], dtype=np.uint8)
            out.append((ids[:max_seq_len], mask[:max_seq_len], len(ids) > max_seq_len))
        return out
    out: list = [None] * len(conversations)
    fulls: dict[int, str] = {}
    for k, m in enumerate(conversations):
        try:
            fulls[k] = tokenizer.apply_chat_template(m, tokenize=False)
        except Exception as e:  # noqa: BLE001 -- a template may raise anything; see the docstring
            out[k] = TemplateRaised(_template_message(e))
    order = sorted(fulls)
    encoded = _encode_prefixes(tokenizer, [fulls[k] for k in order], max_seq_len) if order else []
    for k, (ids_l, starts_l, truncated) in zip(order, encoded, strict=True):
        messages, full = conversations[k], fulls[k]
        limit = (starts_l[-1] + 1) if len(ids_l) == max_seq_len else None
        try:
            spans = assistant_char_spans(tokenizer, messages, full, limit)
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
        out[k] = (ids, mask, truncated)
    return out


def tokenize_with_mask(tokenizer, messages: list[dict[str, str]], max_seq_len: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Render ``messages`` with the tokenizer's chat template and tokenize.

    Returns ``(input_ids int32 [T], loss_mask uint8 [T])`` with ``T <= max_seq_len``
    (truncated, not dropped). Where the template marks ``{% generation %}`` blocks the
    mask is transformers' own ``return_assistant_tokens_mask``; otherwise
    ``loss_mask[j] == 1`` for tokens that start inside an assistant span (see
    ``assistant_char_spans``). None when the render does not contain an assistant
    turn's text.
    """
    enc = tokenize_batch(tokenizer, [messages], max_seq_len)[0]
    return None if enc is None or isinstance(enc, TemplateRaised) else enc[:2]
