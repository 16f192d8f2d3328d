"""What answers a prompt during ``regenerate_responses``: ``Answer`` (one generated answer), ``check_sampling`` (the
decoding settings' bounds) and ``TransformersGenerator`` (transformers' ``generate``, the backend where vLLM is not
used; the vLLM backend is the stage's engine child, ``regenerate_responses.run_child``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..config.settings import declared


def check_sampling(temperature: float, top_p: float) -> None:
    """Check ``data.regenerate.temperature`` (>= 0, finite; 0 = greedy) and ``top_p`` (in (0, 1]).

    Raises:
        ValueError: either is out of range (or not a number); the message names the key.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
            math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"data.regenerate.temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"data.regenerate.top_p must be in (0, 1], got {top_p!r}")


@dataclass
class Answer:
    """One generated answer: its text (special tokens removed), tokens generated (the end-of-turn
    token included when there is one), whether the target ended it itself (False: cut at
    max_tokens), and the generated token ids (int, ``tokens`` of them)."""

    text: str
    tokens: int
    finished: bool
    token_ids: list[int] = field(default_factory=list)


class TransformersGenerator:
    """Chat answers from ``model.generate``, batched with left padding: greedy (``temperature`` 0)
    or sampled at ``temperature`` from the nucleus of probability ``top_p`` (no top-k cut, as vLLM's
    defaults; transformers would otherwise keep its default top_k of 50).

    Prompts are rendered with the tokenizer's chat template (generation prompt on) and
    tokenized without added special tokens, as vLLM's ``LLM.chat`` does. Within a call,
    prompts are sorted by length and cut into batches of ``batch_size`` (less padding); the
    answers come back in input order. Generation stops at the model's
    ``generation_config.eos_token_id`` (all of them where it is a list); an answer without one
    within ``max_tokens`` is unfinished.

    Sampling draws from torch's default generators, seeded here with ``seed`` (``torch.manual_seed``,
    every device): the same seed, model, prompts and ``batch_size`` give the same answers on CPU,
    call after call of a fresh generator (a batch's rows share the generator, so an answer also
    depends on the batch it is in). Greedy decoding does not touch the generators.

    Raises:
        ValueError: ``temperature`` or ``top_p`` out of range (``check_sampling``); the target has no
            end-of-sequence token.
    """

    def __init__(self, model, tokenizer, max_tokens: int, batch_size: int,
                 temperature: float = declared("data.regenerate.temperature"),
                 top_p: float = declared("data.regenerate.top_p"), seed: int = declared("data.seed")):
        check_sampling(temperature, top_p)
        self.model, self.tok, self.max_tokens, self.batch_size = model, tokenizer, max_tokens, batch_size
        self.temperature, self.top_p = temperature, top_p
        self.tok.padding_side = "left"
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos = {eos} if isinstance(eos, int) else set(eos or [])
        if not self.eos:
            raise ValueError("the target has no eos_token_id (generation_config or tokenizer): answers would never end")
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos)
        if temperature > 0:
            import torch

            torch.manual_seed(seed)

    def render(self, msgs: list[dict]) -> str:
        return self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)

    def prompt_tokens(self, msgs: list[dict]) -> int:
        return len(self.tok(self.render(msgs), add_special_tokens=False)["input_ids"])

    def __call__(self, prompts: list[list[dict]]) -> list[Answer]:
        import torch

        texts = [self.render(m) for m in prompts]
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
        out: list[Answer | None] = [None] * len(texts)
        device = next(self.model.parameters()).device
        decode = ({"do_sample": False} if self.temperature == 0
                  else {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p, "top_k": 0})
        for b in range(0, len(order), self.batch_size):
            idx = order[b:b + self.batch_size]
            enc = self.tok([texts[i] for i in idx], add_special_tokens=False, padding=True, return_tensors="pt").to(device)
            with torch.inference_mode():
                gen = self.model.generate(**enc, max_new_tokens=self.max_tokens, **decode,
                                          eos_token_id=sorted(self.eos), pad_token_id=self.pad)
            new = gen[:, enc["input_ids"].shape[1]:].tolist()
            for i, row in zip(idx, new, strict=True):
                end = next((j for j, t in enumerate(row) if t in self.eos), None)
                kept = row if end is None else row[:end]
                out[i] = Answer(self.tok.decode(kept, skip_special_tokens=True), len(kept) + (end is not None),
                                end is not None, row if end is None else row[:end + 1])
        return out
