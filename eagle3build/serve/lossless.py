"""The benchmark's lossless check: greedy decoding with a head must emit the baseline's tokens.

In bf16 it need not, bit for bit: verifying k+1 tokens in one forward pass rounds differently from decoding one,
so where the baseline's top two tokens are nearly tied the order can flip. For each prompt whose output differs,
the baseline engine is asked (one more engine, only then) for its top ``NEAR_TIE_TOP`` log-probabilities at the
first differing position, given the prompt and the common prefix (``baseline_top_logprobs``, an eager engine: the
reference). The difference is a numerical near-tie when the head run's token is among them within
``benchmark.near_tie_max_logprob_gap`` nats of the reference's most likely token (``auto``: ``NEAR_TIE_GAP``, by
dtype); a difference at the first output token, which no draft can touch, is counted as the engines' own noise
where the run's token is among them; anything else is a real divergence, and the job fails naming the prompt ids
(``classify_difference``, ``check``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from ..vllm import engine_process

log = logging.getLogger(__name__)

TOP_ENTRY = "eagle3build.vllm.measure:top_logprobs"
NEAR_TIE_TOP = 5  # baseline log-probabilities read at a differing position
# Near-tie threshold (nats) by engine dtype, for ``near_tie_max_logprob_gap: auto``. bf16 keeps 8
# significant bits: a logit of magnitude 16-32 is rounded to 0.125, and the last hidden state of
# two batch shapes differs by ~1 % (capture_backends on an H200: median 0.9 % between kernels), so
# logits ~20 apart by 0.2; 0.25 nats is one such move. float32 differs by ~1e-5 relative: 1e-3.
NEAR_TIE_GAP = {"bfloat16": 0.25, "float16": 0.25, "float32": 1e-3}


class BenchmarkError(RuntimeError):
    """The head changed greedy outputs beyond numerical near-ties (a real divergence)."""


def figures(base: dict, run: dict, prompts: list[dict], differences: list[dict] | None = None) -> dict:
    """The lossless check of one run against the baseline: the ids of ``prompts`` whose greedy token ids differ
    between ``base`` and ``run`` (``token_ids`` in prompt order), and of ``differences`` (``classify_difference``
    results of those prompts) how many are near-ties, how many differ at the first token (the target's own engine
    noise: ``classify_difference``) and how many are real divergences; ``lossless`` is true where none diverges."""
    differing = [p["id"] for p, a, b in zip(prompts, base["token_ids"], run["token_ids"], strict=True) if a != b]
    differences = list(differences or [])
    near = sum(d["kind"] == "near_tie" for d in differences)
    first = sum(d["kind"] == "first_token" for d in differences)
    diverged = len(differences) - near - first
    return {"prompts_differing_from_baseline": len(differing), "differing_prompt_ids": differing,
            "outputs_identical": not differing, "near_ties": near, "first_token_differences": first,
            "divergences": diverged, "lossless": diverged == 0, "differences": differences}


def differences(base: dict, run: dict, prompts: list[dict], set_of: list[str], tops: dict[int, dict[int, list]],
                max_gap: float) -> list[dict]:
    """``classify_difference`` of every prompt (``prompts``, the set of each in ``set_of``) whose output differs
    between ``base`` and ``run``, with its ``prompt_id`` and ``set``; ``tops``: ``baseline_top_logprobs``."""
    return [dict(classify_difference(base["token_ids"][i], run["token_ids"][i], tops.get(i), max_gap),
                 prompt_id=p["id"], set=set_of[i])
            for i, p in enumerate(prompts) if base["token_ids"][i] != run["token_ids"][i]]


def check(runs: list[dict], out_json: str | os.PathLike, max_gap: float, label: Callable[[dict], str]) -> None:
    """Log each first-token difference of ``runs`` (benchmark.json runs with ``differences``), and fail on a real
    divergence. ``label``: a run's name in the messages.

    Raises:
        BenchmarkError: a run's output differs beyond a near-tie (names the run, prompt, position and tokens).
    """
    for r in runs:
        for d in r["differences"]:
            if d["kind"] == "first_token":
                log.warning("%s prompt %s (%s): the first output token differs (baseline %s, with the head %s): it "
                            "comes from the target's prefill before any draft, so the two engines computed the target "
                            "differently; not counted against the head", label(r), d["prompt_id"],
                            d["set"], d["baseline_token"], d["run_token"])
    divergent = [(label(r), d) for r in runs for d in r["differences"] if d["kind"] == "divergence"]
    if divergent:
        for who, d in divergent:
            log.error("%s: real divergence: %s", who, json.dumps(d))
        raise BenchmarkError(
            f"{out_json}: the head changed greedy outputs beyond a near-tie (more than {max_gap} nats below the "
            "target's most likely token, or outside its top " + str(NEAR_TIE_TOP) + "): " + "; ".join(
                f"{who} prompt {d['prompt_id']} ({d['set']}) at output token {d['position']}: baseline "
                f"{d['baseline_token']}, with the head {d['run_token']}" for who, d in divergent))


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first output token where ``a`` and ``b`` differ (the shorter one's length where
    one is a prefix of the other); None where they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def baseline_top_logprobs(tmp: Path, engine: Callable[..., dict], base: dict, runs: list[dict]) -> dict[int, list[list]]:
    """The baseline's ``NEAR_TIE_TOP`` most likely tokens at the first differing position of every
    prompt (index into the prompts) whose output differs in some run; ``{}`` (and no engine
    started) where none differs. One eager engine over all such positions."""
    items, where = [], []
    for i, b in enumerate(base["token_ids"]):
        positions = {first_difference(b, r["token_ids"][i]) for r in runs} - {None}
        for pos in sorted(positions):
            items.append({"prompt_token_ids": base["prompt_token_ids"][i], "prefix": b[:pos]})
            where.append((i, pos))
    if not items:
        return {}
    res = engine_process.run_child(TOP_ENTRY, {"engine": engine(eager=True, seqs=len(items)), "items": items,
                                               "top": NEAR_TIE_TOP}, tmp, "baseline_top_logprobs")
    out: dict[int, dict[int, list]] = {}
    for (i, pos), top in zip(where, res["top"], strict=True):
        out.setdefault(i, {})[pos] = top
    return out


def classify_difference(base_ids: list[int], run_ids: list[int], tops: dict[int, list] | None, max_gap: float) -> dict:
    """Classify one prompt's differing greedy outputs.

    ``base_ids``/``run_ids``: output token ids without and with the head (they differ);
    ``tops``: position -> the reference engine's ``[[token, logprob], ...]`` at the baseline's prefix
    (most likely first; ``baseline_top_logprobs``: an eager engine of the target alone); ``max_gap``: nats.
    At the first differing position ``p``:

    - ``first_token`` where ``p`` is 0 and the run's token is in the reference's top list: the first output
      token comes from the target's prefill before any draft exists (vLLM samples it from the target's
      logits, then drafts), so the head cannot have changed it; the two engines computed the target
      differently (measured on a random-weight MoE target on the H200, where bf16 noise flips expert
      routing). Counted, not a divergence. A first token outside the top list is a divergence: an engine
      that computes the target that wrongly is broken, head or not.
    - ``near_tie`` where the head run's token is in the reference's top list within ``max_gap`` of the
      reference's most likely token: greedy decoding of the target could have picked it. Judged against
      the reference, not the baseline's token, because the baseline engine is itself a bf16 computation
      that can disagree with the reference (the same H200 runs: the baseline's token outside the
      reference's top 5 where the run's token was its first).
    - ``divergence`` otherwise (also where a run stopped early: an end of output is no token to compare).

    Returns ``{"position", "baseline_token", "run_token", "baseline_top_logprobs", "top2_gap" (the
    reference's top-1 minus top-2 log-probability), "gap" (the reference's top-1 minus the run token's
    log-probability; None where the run's token is not in the top list), "baseline_gap" (the same for
    the baseline's token), "kind"}``.

    Raises:
        ValueError: the outputs do not differ.
    """
    pos = first_difference(base_ids, run_ids)
    if pos is None:
        raise ValueError("classify_difference: the outputs do not differ")
    bt = base_ids[pos] if pos < len(base_ids) else None
    rt = run_ids[pos] if pos < len(run_ids) else None
    top = (tops or {}).get(pos) or []
    lp = {int(t): float(v) for t, v in top}
    best = float(top[0][1]) if top else None
    top2 = top[0][1] - top[1][1] if len(top) > 1 else None
    gap = best - lp[rt] if rt in lp else None
    baseline_gap = best - lp[bt] if bt in lp else None
    if bt is None or rt is None:
        kind = "divergence"  # one output ended there
    elif pos == 0 and rt in lp:
        kind = "first_token"
    else:
        kind = "near_tie" if gap is not None and gap <= max_gap else "divergence"
    return {"position": pos, "baseline_token": bt, "run_token": rt, "baseline_top_logprobs": top,
            "top2_gap": top2, "gap": gap, "baseline_gap": baseline_gap, "kind": kind}
