"""Stage ``regenerate_responses`` (opt-in, ``data.regenerate.enabled``): the target answers the conversations itself.

A draft head is served against the target's own outputs, so it learns best from them
(EAGLE-3 paper §4 and speculators' response-regeneration scripts do the same).
Between ingest and tokenization: the conversations of ``data.sources`` are normalised by
``prepare_data``'s rules (``conversations.normalise``: same skip counts), then turn by turn
every assistant turn is replaced by the target's answer to the conversation so far (earlier turns already
regenerated), in batches — one round per turn position over all conversations
(``regenerate_turns``). A conversation stops at the first turn whose prompt reaches
``max_seq_len`` tokens: what follows would be truncated away by tokenization anyway. The
output is a chat-messages JSONL with the records' ids, so the train/eval split and the
benchmark prompts stay the same.

Each regenerated answer is written twice: as text (special tokens removed, as a serving
engine returns it and a client sends it back as history) and as the token ids the target
generated (``token_ids`` on the message, its end-of-turn token included where it emitted one).
``prepare_data`` trains the last answer of a conversation from those ids (``chat_masking.
tokenize_batch``'s ``tails``): templates whose answers carry special tokens (gpt-oss channel
markers, tool-call tags) lose them in the text, never in the ids. Conversations with tool calls
are written unchanged (counted as ``conversations_with_tools_kept``): a regenerated call would
no longer match the recorded tool results. Reasoning fields of the input are not shown to the
target when it answers.

An answer cut at ``max_tokens`` (no end-of-turn token generated) ends its conversation; the
turns after it are dropped (the rest of the original conversation answers a reply the target
never finished). With ``data.regenerate.unfinished: keep`` it is kept as the last turn and the
record gets ``"last_turn_unfinished": true``, so that ``prepare_data`` trains its text but not
the end-of-turn token the chat template appends (``chat_masking.open_last_turn``); with ``drop``
it is left out too and the conversation ends at the answer before (none left: the conversation
is not written). Greedy decoding of a small target often ends in a repetition loop that only the
cap stops (44 % of SmolLM2-135M's answers at a 512-token cap, most of them loops:
``benchmarks/gpu/h200_regen.md``); ``drop`` keeps those loops out of training. The report counts
the cut answers and how many of them end in a verbatim loop (``ends_in_loop``).

Decoding (``data.regenerate.temperature``, ``top_p``): temperature 0 (the default, the path
measured on the H200) is greedy; temperature > 0 samples each answer from the target's
distribution at that temperature, from the smallest set of tokens whose probability reaches
``top_p`` (nucleus sampling, Holtzman et al. 2020; no top-k cut): that paper's remedy for the
degenerate repetition of greedy decoding (its effect on the loops counted here, and on the head's
acceptance, is not measured in this repository). Peers sample by default (SpecForge's
``scripts/regenerate_train_data.py``: ``--temperature 0.7``). Sampled answers are reproducible
in part only: vLLM samples from its engine's generator, seeded by ``data.seed`` (no per-request
seed, whose per-request generators cost 6x in tokens/s: ``measure.decode_greedy``), so an
answer depends on vLLM's batch schedule and a rerun is not bit-equal; transformers seeds torch's
generator with ``data.seed`` once per job, so the same seed, prompts, ``batch_size`` and
``checkpoint_every`` (they group the prompts into ``generate`` calls) on CPU give the same answers.
A resumed job (``checkpoint_every``) does not restore the generator: its answers after the resume
differ from an uninterrupted run's (greedy ones do not).

Two backends, the same rounds, output format and ids (``data.regenerate.backend``):

- ``vllm``: ``LLM.chat`` in a child process started by ``engine_process.run_child``
  (tensor-parallel over the job's GPUs);
- ``transformers``: ``model.generate`` (greedy or sampled, left padding, ``batch_size`` conversations per
  call, sorted by prompt length) on the target loaded by ``target.load_model`` (layers spread
  over the job's GPUs; CPU without GPUs) — for GPU nodes without a working vLLM.
- ``auto``: vLLM where ``import vllm`` works in this job (the check of the compat report's
  ``vllm`` section, made where the job runs, since a cluster job may land on another node
  than the report), else transformers; the report says which ran and why.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ..atomic import atomic_path, write_json, write_text
from ..config.settings import config_fields, declared, job
from ..config.spec import key as config_key
from ..formats.conversation_files import DataError, SourceStats, read_records, resolve_source_path
from ..formats.conversations import UNFINISHED_KEY, Conversation, Counters, normalise, template_messages
from ..vllm import engine_process, measure
from ..vllm.engine_args import engine_args
from .generators import Answer, TransformersGenerator, check_sampling

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
OUTPUT_VERSION = 3  # 2: token_ids of each regenerated answer; tool conversations kept. 3: data.regenerate.unfinished,
#                    answers_at_max_tokens_looping in the report
STAGE = {
    "inputs": ("target", "sources"), "packages": ("vllm",), "entry": "regenerate",
    "keys": {"run": "files", "target.bundled": "files", "target.path": "files", "target.served_name": "trigger",
             "target.serve_dtype": "trigger:dtype", "target.trust_remote_code": "trigger", "target.offline": "runtime",
             "target.pipeline_parallel_size": "trigger", "data.sources": "trigger", "data.max_seq_len": "trigger",
             "data.seed": "trigger", "data.regenerate.*": "trigger", "data.regenerate.enabled": "files",
             "data.regenerate.checkpoint_every": "runtime", "resources.gpu_model": "runtime",
             "resources.serve.*": "runtime"},
}

# the choices of data.regenerate.unfinished and .backend, as declared
UNFINISHED = tuple(config_key("data.regenerate.unfinished").schema["enum"])
# A verbatim repetition loop (ends_in_loop): the answer's last LOOP_TAIL characters occur at least
# LOOP_REPEATS times in its last LOOP_WINDOW characters.
LOOP_TAIL, LOOP_WINDOW, LOOP_REPEATS = 60, 600, 3

BACKENDS = tuple(config_key("data.regenerate.backend").schema["enum"])


def decoding(temperature: float, top_p: float) -> str:
    """``greedy`` (temperature 0) or ``sampled (temperature T, top_p P)``: the log's words for it."""
    return "greedy" if temperature == 0 else f"sampled (temperature {temperature:g}, top_p {top_p:g})"


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


def choose_backend(requested: str, needed_by: str = "regenerate_responses") -> dict:
    """``{"used", "requested", "reason"}``: the backend this job runs.

    ``auto``: ``vllm`` where vLLM imports here (``engine_process.require_vllm``), else ``transformers``
    with the import error as the reason. ``vllm`` forced where it does not import fails at once,
    naming ``needed_by`` (the regenerated file).

    Raises:
        ValueError: an unknown backend name.
        engine_process.VLLMUnavailable: ``requested == "vllm"`` and vLLM cannot be imported.
    """
    if requested not in BACKENDS:
        raise ValueError(f"data.regenerate.backend {requested!r}: expected one of {BACKENDS}")
    if requested == "transformers":
        return {"used": "transformers", "requested": requested, "reason": "data.regenerate.backend: transformers"}
    try:
        version = engine_process.require_vllm(needed_by=f"{needed_by} (data.regenerate.backend: vllm)")
    except engine_process.VLLMUnavailable as e:
        if requested == "vllm":
            raise
        cause = f"{type(e.__cause__).__name__}: {e.__cause__}"
        return {"used": "transformers", "requested": requested, "reason": f"vLLM is not usable in this job ({cause})"}
    why = "data.regenerate.backend: vllm" if requested == "vllm" else f"vLLM {version} imports in this job"
    return {"used": "vllm", "requested": requested, "reason": why}


@config_fields({
    "sources": "data.sources", "max_seq_len": "data.max_seq_len", "seed": "data.seed",
    "max_tokens": "data.regenerate.max_tokens", "unfinished": "data.regenerate.unfinished",
    "temperature": "data.regenerate.temperature", "top_p": "data.regenerate.top_p",
    "backend": "data.regenerate.backend", "checkpoint_every": "data.regenerate.checkpoint_every",
    "batch_size": "data.regenerate.batch_size", "served_name": "target.served_name", "dtype": "target.serve_dtype",
    "pipeline_parallel_size": "target.pipeline_parallel_size", "trust_remote_code": "target.trust_remote_code",
})
class RegenerateSettings:
    """What one regenerate_responses job runs (``regenerate``): the conversations of ``sources`` answered by the
    target of ``target_dir`` on the job's ``gpus`` GPUs (vLLM's tensor parallel size, or the devices transformers
    spreads the layers over; 0 = CPU), written to ``out_jsonl`` and the report ``out_report``. The config fields
    (below) are made from their keys' declarations (``config.settings``): ``max_tokens``: cap of one regenerated
    answer (tokens); ``unfinished``: ``keep`` or ``drop`` an answer that reaches it (module docstring);
    ``temperature`` 0 = greedy, > 0 = answers sampled at that temperature from the nucleus of probability
    ``top_p``; ``seed``: ``data.seed``, vLLM's engine seed or torch's generator's (transformers);
    ``checkpoint_every``: answers per engine call between saved states (0: none); ``dtype``: ``target.serve_dtype``
    (``auto`` = bf16 on GPUs, float32 on CPU); ``backend``: auto | vllm | transformers (``choose_backend``);
    ``batch_size``: conversations per ``generate`` call of the transformers backend.
    """

    target_dir: str = job("params.target_dir")
    out_jsonl: str | os.PathLike = job("outputs.jsonl")
    out_report: str | os.PathLike = job("outputs.report")
    gpus: int = job("resources.gpu?", default=0)


def regenerate(s: RegenerateSettings) -> dict:
    """Replace every assistant turn of ``s.sources`` with the target's own answer (``s``: ``RegenerateSettings``);
    write ``s.out_jsonl`` and a report.

    An answer that reaches ``s.max_tokens`` is kept as its conversation's last turn, flagged
    ``last_turn_unfinished`` (``unfinished`` ``keep``), or left out (``drop``) (module docstring).
    Report: the backend used and why, conversations in and out, assistant turns regenerated (kept),
    conversations cut at ``max_seq_len``, answers that hit ``max_tokens`` and how many of them end
    in a repetition loop (``ends_in_loop``), the ``unfinished`` rule, ``temperature`` and ``top_p``,
    generated tokens and tokens/s, skip counts of normalisation.

    ``s.checkpoint_every``: answers per engine call (one ``generate`` of ``regenerate_turns``; not
    the transformers backend's ``batch_size``) between saved states, in
    ``<out_jsonl>.state/state.json``; a rerun of the same job with the same inputs and settings
    resumes from it; removed once the outputs are written (left behind by a job that never
    finishes). 0: none. After a resume the report's ``generate_seconds`` and tokens/s add up
    the answers of every process, ``seconds`` counts the last process only. With temperature > 0
    the answers generated after a resume differ from those of an uninterrupted run (the sampler's
    random state is not saved); the key holds ``temperature`` and ``top_p``.

    Raises:
        ValueError: ``checkpoint_every`` < 0, ``temperature`` < 0 or ``top_p`` outside (0, 1] (checked first);
            ``unfinished`` or ``backend`` outside their choices (when ``s`` is made).
        engine_process.VLLMUnavailable: ``backend="vllm"`` and vLLM cannot be imported (checked first).
        DataError: no conversation in the sources.
        RuntimeError: the vLLM child failed.
    """
    sources, target_dir, out_jsonl, out_report = s.sources, s.target_dir, s.out_jsonl, s.out_report
    max_seq_len, max_tokens, unfinished, checkpoint_every = s.max_seq_len, s.max_tokens, s.unfinished, s.checkpoint_every
    temperature, top_p, gpus = s.temperature, s.top_p, s.gpus
    if checkpoint_every < 0:
        raise ValueError(f"data.regenerate.checkpoint_every must be >= 0, got {checkpoint_every}")
    check_sampling(temperature, top_p)
    choice = choose_backend(s.backend, needed_by=os.fspath(out_jsonl))
    log.info("regeneration backend: %s (%s), %s decoding", choice["used"], choice["reason"], decoding(temperature, top_p))
    t0 = time.perf_counter()
    convs, counters, stats = collect(sources)
    kept = [c for c in convs if any(m["role"] == "tool" or m.get("tool_calls") for m in c.messages)]
    convs = [c for c in convs if c not in kept]
    prompts = [template_messages(c.messages, None) for c in convs]
    state_dir = Path(f"{os.fspath(out_jsonl)}.state")
    resume = {"checkpoint_every": checkpoint_every, "state_path": os.fspath(state_dir / "state.json"),
              "key": _state_key(prompts, target_dir, choice, max_tokens, max_seq_len, unfinished, s.dtype, s.seed, gpus,
                                s.pipeline_parallel_size, s.batch_size, s.trust_remote_code, temperature, top_p)
              if checkpoint_every else ""}
    if not convs:
        res = {"conversations": [], "last_turn_unfinished": [], "turns_regenerated": 0,
               "conversations_cut_at_max_seq_len": 0, "answers_at_max_tokens": 0, "answers_at_max_tokens_looping": 0,
               "generated_tokens": 0,
               "generate_seconds": 0.0}
    elif choice["used"] == "vllm":
        eng = engine_args(target_dir, gpus=gpus, served_name=s.served_name,
                          max_model_len=max_seq_len + max_tokens, seed=s.seed, dtype=s.dtype,
                          pipeline_parallel_size=s.pipeline_parallel_size,
                          trust_remote_code=s.trust_remote_code)
        spec = {"engine": eng, "conversations": prompts, "max_tokens": max_tokens,
                "max_seq_len": max_seq_len, "unfinished": unfinished, "temperature": temperature, "top_p": top_p,
                **resume}
        with tempfile.TemporaryDirectory(prefix="eagle3-regen-") as tmp:
            res = engine_process.run_child("eagle3build.data.regenerate_responses:run_child", spec, tmp, "regenerate")
    else:
        res = regenerate_with_transformers(s, prompts, device="cuda" if gpus > 0 else "cpu",
                                           state_path=resume["state_path"], key=resume["key"])
    lines, n_out = [], 0
    for conv, msgs, cut_last in zip(convs, res["conversations"], res["last_turn_unfinished"], strict=True):
        if any(m["role"] == "assistant" for m in msgs):
            for m in msgs[:-1]:
                m.pop("token_ids", None)  # prepare_data trains the last answer from its ids, the rest from text
            lines.append(json.dumps({"id": conv.id, "messages": msgs, UNFINISHED_KEY: cut_last}, ensure_ascii=False))
            n_out += 1
    for conv in kept:
        rec = {"id": conv.id, "messages": template_messages(conv.messages, "reasoning_content")}
        if conv.tools:
            rec["tools"] = conv.tools
        lines.append(json.dumps(rec, ensure_ascii=False))
        n_out += 1
    report = {
        "backend": choice,
        "sources": [s.__dict__ for s in stats],
        "skipped": dict(counters.skipped),
        "fixed": dict(counters.fixed),
        "conversations_in": len(convs) + len(kept),
        "conversations_out": n_out,
        "conversations_with_tools_kept": len(kept),
        "unfinished": unfinished,
        "temperature": temperature,
        "top_p": top_p,
        **{k: res[k] for k in ("turns_regenerated", "conversations_cut_at_max_seq_len", "answers_at_max_tokens",
                               "answers_at_max_tokens_looping", "generated_tokens", "generate_seconds")},
        "generated_tokens_per_s": round(res["generated_tokens"] / max(res["generate_seconds"], 1e-9), 1),
        "resumed_from_answers": res.get("resumed_from_answers", 0),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_text(out_jsonl, "\n".join(lines) + "\n")
    write_json(out_report, report)
    shutil.rmtree(state_dir, ignore_errors=True)
    log.info("regenerated %d assistant turns of %d conversations with %s, %s (%d tokens, %.0f tokens/s; %d answers cut "
             "at max_tokens, %d of them ending in a repetition loop, %s)", report["turns_regenerated"], n_out,
             choice["used"], decoding(temperature, top_p), report["generated_tokens"], report["generated_tokens_per_s"],
             report["answers_at_max_tokens"], report["answers_at_max_tokens_looping"],
             "kept" if unfinished == "keep" else "dropped")
    return report


def ends_in_loop(text: str) -> bool:
    """Whether an answer ends in a verbatim repetition loop: its last ``LOOP_TAIL`` (60)
    characters occur at least ``LOOP_REPEATS`` (3) times, without overlap, in its last
    ``LOOP_WINDOW`` (600) characters; an answer shorter than half the window never does.
    A diagnostic for the degenerate repetition of greedy decoding (Holtzman et al. 2020, "The
    Curious Case of Neural Text Degeneration", section 3), counted in the regeneration report.
    """
    window = text[-LOOP_WINDOW:]
    return len(window) >= LOOP_WINDOW // 2 and window.count(window[-LOOP_TAIL:]) >= LOOP_REPEATS


def regenerate_turns(conversations: list[list[dict]], generate: Callable[[list[list[dict]]], list[Answer]],
                     prompt_tokens: Callable[[list[dict]], int], max_seq_len: int,
                     unfinished: str = declared("data.regenerate.unfinished"),
                     checkpoint_every: int = declared("data.regenerate.checkpoint_every"),
                     state_path: str | os.PathLike | None = None, key: str = "") -> dict:
    """The backend-independent rounds: turn position by turn position over all conversations.

    ``generate``: the target's answers (greedy or sampled) to a batch of chat prompts (each ending
    on a user turn), in order; ``prompt_tokens``: tokens of a chat prompt rendered with the generation prompt.
    A conversation stops at a turn whose prompt reaches ``max_seq_len`` tokens (that turn and
    the rest dropped) or at an answer cut at ``max_tokens`` (``unfinished`` ``keep``: kept as the
    last turn, flagged; ``drop``: left out; the rest dropped either way). Conversations end on an
    assistant turn (trailing user turns removed).

    Resuming (``data.regenerate.checkpoint_every``): with ``checkpoint_every`` > 0 a round's
    prompts go to ``generate`` that many at a time, and after each call the whole loop state (the
    conversations so far, what is left of the round, the counts) is written atomically as JSON
    to ``state_path`` with ``key``. A call that finds a state of the same ``key`` there goes on
    from it: a job killed mid-way (a preempted cluster job, a device call's time limit) loses at
    most one call's answers. 0: one ``generate`` call per round, nothing written (the answers are
    the same; with a GPU engine bf16 batch composition may flip near-ties either way). With a
    sampling ``generate`` the answers after a resume differ from an uninterrupted run's: its
    random state is not part of the saved state.

    Returns ``conversations`` (messages per input conversation, possibly without any assistant
    turn), ``last_turn_unfinished`` (bool per conversation), ``turns_regenerated`` (answers kept),
    ``conversations_cut_at_max_seq_len``, ``answers_at_max_tokens`` (answers that reached the cap,
    kept or not), ``answers_at_max_tokens_looping`` (of those, the ones that ``ends_in_loop``),
    ``generated_tokens`` (all answers), ``generate_seconds``, ``resumed_from_answers`` (answers
    generated before this call resumed; 0 when it started afresh).

    Raises:
        ValueError: ``unfinished`` is not ``keep`` or ``drop``; ``checkpoint_every`` < 0.
    """
    if unfinished not in UNFINISHED:
        raise ValueError(f"data.regenerate.unfinished must be one of {UNFINISHED}, got {unfinished!r}")
    if checkpoint_every < 0:
        raise ValueError(f"data.regenerate.checkpoint_every must be >= 0, got {checkpoint_every}")
    st = _load_state(state_path, key) if checkpoint_every and state_path else None
    resumed = 0 if st is None else st["counts"]["answers"]
    if st is None:
        st = {"todo": [list(m) for m in conversations], "done": [[] for _ in conversations],
              "flagged": [False] * len(conversations), "active": list(range(len(conversations))), "pending": [],
              "next": [], "counts": dict.fromkeys(("answers", "turns", "cut", "at_max", "looping", "gen_tokens"), 0)
              | {"gen_s": 0.0}}
    todo, done, c = st["todo"], st["done"], st["counts"]
    while True:
        if not st["pending"]:  # start the next round: one prompt per conversation that has an answer to replace
            for i in st["active"]:
                while todo[i] and todo[i][0]["role"] != "assistant":
                    done[i].append(todo[i].pop(0))
                if not todo[i]:
                    continue
                todo[i].pop(0)  # the original answer, replaced below
                if prompt_tokens(done[i]) >= max_seq_len:
                    c["cut"] += 1
                    todo[i] = []
                    continue
                st["pending"].append(i)
            st["active"] = []
            if not st["pending"]:
                break
        ids = st["pending"][:checkpoint_every] if checkpoint_every else st["pending"]
        t = time.perf_counter()
        answers = generate([done[i] for i in ids])
        c["gen_s"] += time.perf_counter() - t
        for i, a in zip(ids, answers, strict=True):
            c["gen_tokens"] += a.tokens
            c["answers"] += 1
            if not a.finished:
                c["at_max"] += 1
                c["looping"] += ends_in_loop(a.text)
                todo[i] = []
                if unfinished == "drop":
                    continue
                st["flagged"][i] = True
            done[i].append({"role": "assistant", "content": a.text, "token_ids": list(a.token_ids)})
            c["turns"] += 1
            if todo[i]:
                st["next"].append(i)
        st["pending"] = st["pending"][len(ids):]
        if not st["pending"]:
            st["active"], st["next"] = st["next"], []
        if checkpoint_every and state_path:
            _save_state(state_path, key, st)
        print(f"regenerate: {'round done' if not st['pending'] else 'batch done'}, {c['turns']} turns kept, "
              f"{c['at_max']} cut at max_tokens ({c['looping']} of them looping), {c['gen_tokens']} tokens, "
              f"{c['gen_tokens'] / max(c['gen_s'], 1e-9):.0f} tok/s", file=sys.stderr, flush=True)
    # A conversation ends on an assistant turn (prepare_data's rule): drop trailing user turns.
    for d in done:
        while d and d[-1]["role"] != "assistant":
            d.pop()
    return {"conversations": done, "last_turn_unfinished": st["flagged"], "turns_regenerated": c["turns"],
            "conversations_cut_at_max_seq_len": c["cut"], "answers_at_max_tokens": c["at_max"],
            "answers_at_max_tokens_looping": c["looping"], "generated_tokens": c["gen_tokens"],
            "generate_seconds": round(c["gen_s"], 2), "resumed_from_answers": resumed}


STATE_FORMAT = 1  # of <out>.state/state.json (regenerate_turns); part of its key


def _state_key(prompts: list, target_dir: str, backend: dict, *settings) -> str:
    """16 hex digits of sha256 over what the answers depend on: the prompts, the target's files
    (name, size, mtime), the backend choice, the stage's ``OUTPUT_VERSION``, the state format, the
    installed vLLM's version (where the backend is vLLM) and the settings. A saved state resumes
    only the same job."""
    files = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in Path(target_dir).iterdir() if f.is_file())
    engine = engine_process.require_vllm("a regeneration state") if backend.get("used") == "vllm" else None
    blob = json.dumps([prompts, files, backend, OUTPUT_VERSION, STATE_FORMAT, engine, settings], sort_keys=True,
                      default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _load_state(path: str | os.PathLike, key: str) -> dict | None:
    """The loop state saved at ``path`` under ``key``, or None (no file, or another run's)."""
    try:
        saved = json.loads(Path(path).read_text())
        saved["state"]["counts"]["answers"]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:  # unreadable or of another format: start afresh
        log.warning("regeneration state %s is unreadable (%s: %s): starting afresh", path, type(e).__name__, e)
        return None
    if saved.get("key") != key:
        log.info("regeneration state %s belongs to other inputs or settings: starting afresh", path)
        return None
    log.info("resuming regeneration from %s after %d answers", path, saved["state"]["counts"]["answers"])
    print(f"regenerate: resumed after {saved['state']['counts']['answers']} answers", file=sys.stderr, flush=True)
    return saved["state"]


def _save_state(path: str | os.PathLike, key: str, st: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps({"key": key, "state": st}, ensure_ascii=False))


def run_child(spec: dict) -> dict:
    """Inside the vLLM child: ``regenerate_turns`` with ``LLM.chat`` as the generator, greedy
    (``temperature`` 0) or sampled at ``temperature`` and ``top_p``."""
    from vllm import SamplingParams

    temperature, top_p = spec["temperature"], spec["top_p"]
    check_sampling(temperature, top_p)
    llm, _ = measure.start_engine(spec["engine"])
    tok = llm.get_tokenizer()
    # No per-request seed: sampled requests draw from the engine's generator, seeded by the engine
    # args' seed (data.seed); a seeded request would take vLLM's per-request-generator path (6x fewer
    # tokens/s: measure.decode_greedy). So a sampled answer depends on its batch: not bit-equal
    # across reruns.
    sp = (SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"]) if temperature == 0
          else SamplingParams(temperature=temperature, top_p=top_p, max_tokens=spec["max_tokens"]))

    def generate(prompts):
        outs = llm.chat(prompts, sp, use_tqdm=False)
        return [Answer(o.outputs[0].text, len(o.outputs[0].token_ids), o.outputs[0].finish_reason != "length",
                       [int(t) for t in o.outputs[0].token_ids]) for o in outs]

    def prompt_tokens(msgs):
        return len(tok.encode(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False),
                              add_special_tokens=False))

    return regenerate_turns(spec["conversations"], generate, prompt_tokens, spec["max_seq_len"], spec["unfinished"],
                            spec["checkpoint_every"], spec["state_path"], spec["key"])


def regenerate_with_transformers(s: RegenerateSettings, conversations: list[list[dict]], device: str = "cpu",
                                 state_path: str | None = None, key: str = "") -> dict:
    """``regenerate_turns`` of ``conversations`` (chat prompts) on transformers' ``generate``
    (``TransformersGenerator`` with ``s``'s ``max_tokens``, ``batch_size``, ``temperature``, ``top_p`` and ``seed``:
    greedy at temperature 0, else sampled with torch seeded by ``seed``); the target of ``s.target_dir`` is loaded
    in ``s.dtype`` by ``target.load_model`` on ``device`` (``"cuda"``: layers over every visible GPU, i.e. the
    job's). ``s.checkpoint_every``, ``state_path`` and ``key``: the resumable state of ``regenerate_turns``.

    Raises:
        ValueError: ``temperature`` or ``top_p`` out of range, checked before the target is loaded.
    """
    check_sampling(s.temperature, s.top_p)
    from transformers import AutoTokenizer

    from ..target import load_model, resolve_dtype

    model = load_model(s.target_dir, resolve_dtype(s.dtype, device), device, s.trust_remote_code)
    tok = AutoTokenizer.from_pretrained(os.fspath(s.target_dir), trust_remote_code=s.trust_remote_code,
                                        local_files_only=True)
    gen = TransformersGenerator(model, tok, s.max_tokens, s.batch_size, s.temperature, s.top_p, s.seed)
    return regenerate_turns(conversations, gen, gen.prompt_tokens, s.max_seq_len, s.unfinished, s.checkpoint_every,
                            state_path, key)
