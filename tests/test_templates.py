"""The assistant mask on three chat-template families, against hand-checked spans.

The tokenizer is SmolLM2's with each family's template and special tokens added, so
every marker is one token, as in the real models.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

from eagle3build.data.chat_masking import tokenize_with_mask

LLAMA3 = (
    "{{- bos_token }}"
    "{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# Qwen3's behaviour in miniature: reasoning is kept only for assistant turns after the
# last user query; such a turn always opens with a (possibly empty) think block, earlier
# turns are rendered without one.
QWEN3 = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for m in messages %}{%- if m['role'] == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' %}"
    "{%- set content = m['content'] %}{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CHATML_GENERATION = (
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- m['content'] + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

MSGS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
    {"role": "assistant", "content": "Rome."},
]


@pytest.fixture(scope="module")
def base_tokenizer(smol_target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_target)


def with_template(tok, template, specials=()):
    t = copy.deepcopy(tok)
    t.chat_template = template
    if specials:
        t.add_special_tokens({"additional_special_tokens": list(specials)})
    return t


def supervised(tok, ids, mask):
    """The supervised tokens, decoded run by run."""
    runs, cur = [], []
    for i, m in zip(ids.tolist(), mask.tolist(), strict=True):
        if m:
            cur.append(i)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    if cur:
        runs.append(tok.decode(cur))
    return runs


def test_chatml(base_tokenizer):
    ids, mask = tokenize_with_mask(base_tokenizer, MSGS, 10_000)
    assert supervised(base_tokenizer, ids, mask) == ["Paris.<|im_end|>", "Rome.<|im_end|>"]


def test_llama3(base_tokenizer):
    tok = with_template(base_tokenizer, LLAMA3, ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])
    ids, mask = tokenize_with_mask(tok, MSGS, 10_000)
    assert supervised(tok, ids, mask) == ["Paris.<|eot_id|>", "Rome.<|eot_id|>"]
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    # Each supervised run ends on the single <|eot_id|> token; headers are never supervised.
    assert [int(ids[j]) for j in np.flatnonzero(mask)].count(eot) == 2
    assert not mask[ids == tok.convert_tokens_to_ids("<|start_header_id|>")].any()


def test_qwen3_thinking(base_tokenizer):
    tok = with_template(base_tokenizer, QWEN3, ["<think>", "</think>"])
    msgs = copy.deepcopy(MSGS)
    msgs[2]["content"] = "<think>\nThe user asks about France.\n</think>\n\nParis."
    msgs[4]["content"] = "<think>\nItaly now.\n</think>\n\nRome."
    full = tok.apply_chat_template(msgs, tokenize=False)
    assert "The user asks about France" not in full  # history reasoning is stripped by the template
    ids, mask = tokenize_with_mask(tok, msgs, 10_000)
    # History turn: only what the template keeps; last turn: its think block too, since the
    # target emits those tokens itself at serving time.
    assert supervised(tok, ids, mask) == ["Paris.<|im_end|>", "<think>\nItaly now.\n</think>\n\nRome.<|im_end|>"]


def test_generation_tags_equal_transformers_mask(base_tokenizer):
    tok = with_template(base_tokenizer, CHATML_GENERATION)
    ids, mask = tokenize_with_mask(tok, MSGS, 10_000)
    ref = tok.apply_chat_template(MSGS, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert ids.tolist() == list(ref["input_ids"]) and mask.tolist() == list(ref["assistant_masks"])
    # ... and the template-agnostic prefix rendering finds the same tokens on this template.
    plain = with_template(base_tokenizer, CHATML_GENERATION.replace("{% generation %}", "").replace("{% endgeneration %}", ""))
    ids2, mask2 = tokenize_with_mask(plain, MSGS, 10_000)
    assert ids2.tolist() == ids.tolist() and mask2.tolist() == mask.tolist()
    assert supervised(tok, ids, mask) == ["Paris.<|im_end|>", "Rome.<|im_end|>"]
