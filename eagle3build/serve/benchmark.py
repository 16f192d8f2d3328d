"""Stage ``benchmark``: vLLM greedy decoding without and with the head, per k.

Each run starts its own vLLM engine in a fresh Python process (``engine_process.run_child``,
tensor-parallel over the job's GPUs): counters and engine state cannot leak between
runs, and a crash in one run is reported, not hidden. Spec-decode figures come from
vLLM's own counters (``LLM.get_metrics()`` with stats on): ``vllm:spec_decode_num_drafts``,
``..._num_draft_tokens``, ``..._num_accepted_tokens``, ``..._num_accepted_tokens_per_pos``.

Mean acceptance length τ = 1 + accepted / drafts (tokens emitted per target forward;
EAGLE-3 paper). Acceptance rate at position i = accepted_per_pos[i] / drafts; overall
acceptance rate = accepted / draft tokens.

Draft vocab coverage = the share of the baseline's output tokens (the target's own greedy
answers) that the head's draft vocab holds (``d2t`` of its ``model.safetensors``): the head can
propose no other token, so with lossless greedy decoding accepted tokens <= coverage x baseline
output tokens (a bound on the tokens, not on each position's rate).

Per request, from vLLM's ``RequestOutput.metrics`` (engine-core timestamps, seconds):
latency = last token - queued; time to first token = first token - queued; time per
output token (TPOT) = (last token - first token) / (output tokens - 1), as in vLLM's
own ``vllm:request_time_per_output_token_seconds``. ``concurrency`` requests are in
flight at a time (1: one after another, the latency-bound case speculative decoding is
for; 0: all prompts at once).

Lossless check (``serve.lossless``): greedy decoding with the head must emit the baseline's tokens, up to
numerical near-ties and first-token differences (its module docstring); a real divergence fails the job.
The k schedule (``benchmark.k_schedule_concurrencies``) is its own experiment: ``serve.k_schedule``.

The stage's settings travel as one ``BenchmarkSettings`` (made from the job by the one adapter:
``workflow.job.stage_settings``, as the stage's contract says). Each head served (the run's own, each compared one)
is a ``head_format.Head``, its folder's config.json read once (``read_heads``) before any engine starts.

Engines are sized to the job (``engine_args``): ``concurrency`` sequences of
``max_model_len`` tokens of KV cache, CUDA graphs for at most ``concurrency x (k + 1)`` tokens.

Prompt sets (``benchmark.sets``, see ``prompt_sets``): a prompt whose chat-template rendering
(the target's tokenizer, as vLLM's ``LLM.chat`` renders it) plus ``max_tokens`` exceeds
``max_model_len`` tokens is skipped before any engine starts and counted per set
(``settings.sets[name].skipped_too_long``), as is one the chat template refuses to render
(``skipped_template_error``, each logged with the prompt id and the template's message;
``prepare_data`` has checked them before any GPU stage: ``prompt_sets.drop_refused``). Every engine decodes the sets one
after the other; vLLM's spec-decode counters are global per engine, so each set's
figures are the counter deltas and the wall time around that set's requests. The
overall figures sum the sets (tokens/s = all output tokens / summed wall time of the sets).
A set whose prompts carry categories (``PromptSet.categories``: ``prompt_sets.categories``) is decoded one category
after the other in the same way, so each category gets the set's figures (τ, acceptance per position, speed-up against
the baseline's same category, lossless check, draft vocab coverage) under ``sets[name]["categories"]``, and the
set's are its categories together. A set sent with more than one turn (``PromptSet.turns``) has the target's own
greedy answers to its first turns made once, by one engine of the target alone before the baseline
(``target_answers``), and every run gets the same next-turn prompts after them (``PromptSet.next_turns``; the answers
in benchmark.json's ``settings.sets[name].first_turn_answers``, beside the set's options).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from .. import prompt_sets
from ..atomic import write_json
from ..config.provenance import BENCHMARK_PACKAGES, hardware, software_versions
from ..config.settings import config_fields, declared, job
from ..draft import vocab_map
from ..draft.head_format import Head
from ..draft.step_costs import compare_benchmark, step_cost
from ..formats.benchmark_runs import OWN_HEAD, check_compare_names, run_label
from ..vllm import engine_process
from ..vllm.engine_args import SIDE_BY_SIDE, decode_graph_sizes, engine_args, side_by_side
from ..vllm.measure import RUN_ENTRY
from . import lossless
from .k_schedule import k_schedule

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes (the
# rule's params carry it; tests/test_e2e.py's digest test fails on changed bytes without it).
# 2: near-ties told from divergences (differences, near_ties, divergences, lossless); over-long prompts skipped
# 3: draft_vocab_coverage per EAGLE-3 run and set
# 4: the pre-flight comparison's step and decode step each against the table's (step_costs.compare_benchmark)
# 5: step_ms and step_cost_ratio per run and set; the pre-flight comparison's draft_cost for every head
# 6: k_schedule served on vLLM's V1 runner, its sweep's k 0 the head held at k 0, the target alone as baseline;
#    each run's startup.model_runner (P-EAGLE runs on V1, EAGLE-3 and DFlash on V2 for a dense target in vLLM 0.26)
# 7: the warm-up decodes every timed batch's prefill before timing and empties the prefix cache (measure.warm_up:
#    the Kimi-shaped target's first tokens read 5-10x slow in a machine's first benchmark on it); the sweep empties
#    the prefix cache before each concurrency
# Not bumped for issue 55 item 4 (every run names what it served: head, method, draft_layer, trained_positions beside
# num_speculative_tokens; the runs under "runs", before "eagle3" whatever the method; "heads" lists each served head
# once; the pre-flight draft_cost names the own head's method): that issue asks that no finished build replan, and
# every reader takes both layouts (benchmark_runs.benchmark_runs), so a finished build keeps its file until its benchmark
# reruns for another reason.
# Not bumped for issue 67 item 4 (a set of categories, figures per category under sets.<set>.categories, and the set's
# options and first_turn_answers in its settings): a benchmark without such a set writes the same bytes as before; the
# default build's benchmark reruns once all the same, for its benchmark.sets param (mtbench added to the default).
OUTPUT_VERSION = 7
STAGE = {
    "inputs": ("head", "head_config", "compare_heads", "target"), "packages": ("vllm",), "entry": "benchmark",
    "keys": {"run": "files", "target.bundled": "files", "target.path": "files", "target.served_name": "trigger",
             "target.serve_dtype": "trigger:benchmark/dtype",  # its name there before issue 39: no build replans
             "target.trust_remote_code": "trigger",
             "target.offline": "runtime", "target.pipeline_parallel_size": "trigger", "data.prompts_file": "files",
             "draft.compare_methods": "trigger:benchmark", "benchmark.*": "trigger:benchmark",
             "benchmark.*.*": "trigger:benchmark/*", "preflight.enabled": "files", "resources.gpu_model": "runtime",
             "resources.serve.*": "runtime"},
}

BenchmarkError = lossless.BenchmarkError  # raised by the lossless check; named here for the stage's callers


SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "benchmark.schema.json"  # artifacts.schema_path("benchmark")


def validate(result: dict) -> None:
    """Check a benchmark result against ``eagle3build/schemas/benchmark.schema.json``.

    Raises:
        artifacts.ArtifactError: a field is missing or out of range (the message names it).
    """
    from ..formats.artifacts import validate as validate_artifact

    validate_artifact(result, "benchmark", "benchmark result")


@config_fields({
    "ks": "benchmark.ks", "num_prompts": "benchmark.num_prompts", "max_tokens": "benchmark.max_tokens",
    "dtype": "target.serve_dtype", "served_name": "target.served_name", "max_model_len": "benchmark.max_model_len",
    "seed": "benchmark.seed", "concurrency": "benchmark.concurrency",
    "pipeline_parallel_size": "target.pipeline_parallel_size", "sets": "benchmark.sets",
    "near_tie_max_logprob_gap": "benchmark.near_tie_max_logprob_gap", "trust_remote_code": "target.trust_remote_code",
    "k_schedule_concurrencies": "benchmark.k_schedule_concurrencies", "compare_heads": "benchmark.compare_heads",
    **{f"{st.name}_{o.name}": f"benchmark.{st.name}.{o.name}" for st in prompt_sets.SETS.values() for o in st.options},
})
class BenchmarkSettings:
    """What one benchmark job runs (``benchmark``): the files, the config's ``benchmark.*`` and ``target.*``
    settings it reads (its config fields, below, made from their keys' declarations: ``config.settings``), and the
    job's GPUs.

    ``target_dir``: the target's folder; ``head_dir``: the run's exported head; ``prompts_path``: prepare_data's
    held-out chat prompts (set ``chat``); ``out_json``: benchmark.json; ``gpus``: GPUs the job holds (the engines'
    tensor parallel size; 0 = CPU); ``custom_prompts_path``: set ``custom``'s file; ``preflight_path``: the run's
    preflight.json; ``method_heads``: ``[{"name", "path"}]``, the heads of draft.compare_methods
    (``benchmark_runs.method_heads``), served beside the run's own after ``compare_heads`` (``heads_compared``). Of
    the config fields: ``compare_heads``: ``[{"name", "path"}]`` of other exported heads; ``dtype`` is
    ``target.serve_dtype`` (``auto`` = bf16 on GPUs, float32 on CPU); ``sets``: ``prompt_sets`` names;
    ``near_tie_max_logprob_gap``: nats, or ``auto`` (``lossless.NEAR_TIE_GAP`` of the dtype);
    ``k_schedule_concurrencies``: the k schedule's concurrencies (``serve.k_schedule``; empty: none);
    ``<set>_<option>``: a set's options (``benchmark.<set>.<option>``, ``set_options``).
    """

    target_dir: str = job("params.target_dir")
    head_dir: str = job("params.head_dir")
    prompts_path: str = job("inputs.prompts")
    out_json: str = job("outputs.json")
    gpus: int = job("resources.gpu?", default=0)
    custom_prompts_path: str | None = job("inputs.custom_prompts?", default=None)
    preflight_path: str | None = job("inputs.preflight?", default=None)
    method_heads: list[Mapping[str, str]] = job("params.method_heads?", default_factory=list)

    def set_options(self, name: str) -> dict:
        """Set ``name``'s options (``PromptSet.options``) by their names, from the config fields
        ``<set>_<option>``."""
        return {o.name: getattr(self, f"{name}_{o.name}") for o in prompt_sets.get(name).options}

    @property
    def heads_compared(self) -> list[Mapping[str, str]]:
        """The heads served beside the run's own, in order: ``compare_heads``, then ``method_heads``."""
        return [*self.compare_heads, *self.method_heads]


def benchmark(s: BenchmarkSettings) -> dict:
    """Baseline run plus one run per head and k over every prompt set; write ``s.out_json``
    (eagle3build/schemas/benchmark.schema.json). ``s``: ``BenchmarkSettings``.

    ``s.num_prompts`` applies per set (the first N); of those, prompts longer than ``max_model_len`` minus
    ``max_tokens`` tokens with the target's chat template (``chat_token_counter``) are skipped
    (``prompt_sets.drop_too_long``), logged and counted per set in ``settings.sets`` (``skipped_too_long``), so a
    set may run fewer than N. One engine per configuration (baseline, each head and k) decodes the sets one after
    the other (``measure.decode_greedy`` with ``sets``), so a set's figures are its own counter deltas and wall
    time in that engine.

    Per run, overall and per set (``"sets": {name: ...}``): output tokens/s, wall seconds, latencies; per run with
    a head also drafts, draft tokens, accepted tokens, τ, acceptance rate per position, speed-up against the
    baseline (the same set's tokens/s), the lossless check (``lossless.figures``), ``draft_vocab_coverage`` (the
    share of the baseline's output tokens inside the head's draft vocab, the same for every k) and the mean engine
    step with the head and its cost in the baseline's decode steps (``step_costs.step_cost``). Engine start seconds
    and their breakdown (``engine_process.startup_breakdown``) per run. With ``s.preflight_path`` the result gets
    ``preflight``, each run's measured step cost against the table's, and every head's drafting cost a step
    (``draft_cost``; ``step_costs.compare_benchmark``), logged; with ``s.k_schedule_concurrencies`` (e.g. ``[1, 4,
    16]``) ``k_schedule`` (``serve.k_schedule``). ``s.heads_compared``: other exported heads of this target (any
    draft method), each run at every k after the run's own head, against the same baseline with the same prompts,
    lossless check included. Every run in ``runs`` names what it served: ``head`` (``benchmark_runs.OWN_HEAD`` for the
    run's own, else its name), its draft ``method``, ``draft_layer`` (``Head.draft_layer``),
    ``trained_positions`` (``Head.trained_positions``; null: one token a forward, any k) and
    ``num_speculative_tokens``; ``heads`` lists each served head once with the same fields. The pre-flight
    comparison and the k schedule are the own head's. A set of categories is decoded one category after the other: its
    figures per category under ``sets.<set>.categories``; for a set of more than one turn one more engine, of the target
    alone, first answers its first turns (``target_answers``), and every run decodes each first turn followed by
    its next after that answer (``next_turns``: a next turn too long or refused is skipped and counted).

    Raises:
        engine_process.VLLMUnavailable: vLLM cannot be imported (checked first, before any work).
        prompt_sets.PromptSetError: an unknown set, a set without prompts, or a set whose every prompt
            is too long for ``max_model_len`` or refused by the chat template (before any engine starts).
        OSError, ValueError: the target's tokenizer cannot be loaded from ``target_dir``, or it has
            no chat template (transformers' errors, before any engine starts).
        ValueError: ``max_tokens`` >= ``max_model_len``, a ``k_schedule_concurrencies`` entry above the
            number of prompts that run (it could not be put in flight), or a ``compare_heads`` name used twice
            or equal to ``benchmark_runs.OWN_HEAD`` (before any engine starts).
        RuntimeError: an engine run failed.
        FileNotFoundError, KeyError: ``head_dir`` (or a ``compare_heads`` path) has no ``model.safetensors``
            holding ``d2t`` (before any engine starts).
        head_format.HeadError: a head's ``config.json`` names no registered method, or lacks its layers or
            trained positions (``read_heads``, before any engine starts).
        BenchmarkError: a prompt's output differs from the baseline's beyond a near-tie (the
            message names the prompt ids, k, the position and both tokens; nothing is written).
    """
    import tempfile

    engine_process.require_vllm(needed_by=os.fspath(s.out_json))
    check_compare_names(s.heads_compared)
    heads = read_heads(s)
    options = {name: s.set_options(name) for name in s.sets}
    loaded = prompt_sets.load_sets(s.sets, s.num_prompts, prompt_sets.Sources(s.prompts_path, s.custom_prompts_path),
                                   options)
    limit = s.max_model_len - s.max_tokens
    if limit < 1:
        raise ValueError(f"benchmark.max_tokens {s.max_tokens} leaves no room for a prompt in benchmark.max_model_len "
                         f"{s.max_model_len}: raise max_model_len")
    count = chat_token_counter(s.target_dir, s.trust_remote_code)
    loaded, refused = prompt_sets.drop_refused(loaded, count)  # checked by prepare_data; the custom file may be newer
    for name, bad in refused.items():
        for r in bad:
            log.warning("benchmark set %s: prompt %s skipped, the chat template refuses it (%s)", name, r["id"],
                        r["detail"])
    by_set, skipped = prompt_sets.drop_too_long(loaded, count, limit)
    for name, n in skipped.items():
        if n:
            log.warning("benchmark set %s: %d of %d prompts skipped, longer than %d tokens with the chat template "
                        "(max_model_len %d - max_tokens %d)", name, n, len(loaded[name]), limit, s.max_model_len,
                        s.max_tokens)
    log.info("prompts per set: %s (skipped as too long: %s)", {k: len(v) for k, v in by_set.items()}, skipped)
    turns = [name for name in by_set if prompt_sets.get(name).turns(options[name]) > 1]
    # a set of two turns: each first turn is followed by its next (after the answers engine): counted now
    n_prompts = sum(len(ps) for ps in by_set.values()) + sum(len(by_set[name]) for name in turns)
    in_flight = s.concurrency or n_prompts
    sweep_cs = sorted(set(s.k_schedule_concurrencies))

    def check_sweep(n: int) -> None:
        if sweep_cs and (sweep_cs[0] < 1 or sweep_cs[-1] > n):
            raise ValueError(f"benchmark.k_schedule_concurrencies {sweep_cs}: each must be from 1 to the {n} prompts "
                             f"that run ({len(by_set)} set(s)), or that many requests are never in flight: raise "
                             "benchmark.num_prompts")

    check_sweep(n_prompts)

    own_layers = heads[0][1].kv_layers

    def engine(k: int = 0, eager: bool = False, seqs: int | None = None, layers: int | None = None) -> dict:
        # sized to the job: ``seqs`` sequences (None: the requests in flight) of max_model_len tokens; CUDA graphs up
        # to one decode step's tokens; ``layers``: the serving head's KV-cached layers (``Head.kv_layers``; None: the
        # run's own head's)
        seqs = in_flight if seqs is None else seqs
        return engine_args(s.target_dir, gpus=s.gpus, served_name=s.served_name,
                           max_model_len=s.max_model_len, seed=s.seed, dtype=s.dtype,
                           pipeline_parallel_size=s.pipeline_parallel_size,
                           trust_remote_code=s.trust_remote_code, max_num_seqs=seqs,
                           kv_cache_tokens=seqs * (s.max_model_len + k),
                           draft_layers=(own_layers if layers is None else layers) if k else 0,
                           eager=eager, graph_sizes=decode_graph_sizes(seqs, k))

    gap = s.near_tie_max_logprob_gap
    gap = lossless.NEAR_TIE_GAP[engine()["dtype"]] if gap == "auto" else float(gap)
    template_errors = {k: len(v) for k, v in refused.items()}
    notes = {name: dict(options[name]) for name in by_set if options[name]}
    with tempfile.TemporaryDirectory(prefix="eagle3-bench-") as tmpdir, engine_process.compile_cache(
            engine_cache_dir(s.out_json)) as cache:
        log.info("vLLM's caches (compiled forwards, inspected model classes) under %s", cache)
        for name in turns:
            answers = target_answers(Path(tmpdir), engine, name, by_set[name], s.max_tokens, s.concurrency)
            by_set[name], dropped = next_turns(name, by_set[name], answers, count, limit)
            skipped[name] += dropped["too_long"]
            template_errors[name] = template_errors.get(name, 0) + dropped["template_error"]
            notes[name]["first_turn_answers"] = answers
            log.info("%s: %d prompts, every turn (next turns skipped: %s)", name, len(by_set[name]), dropped)
            check_sweep(sum(len(ps) for ps in by_set.values()))  # less the next turns skipped
        return _benchmark(Path(tmpdir), engine, by_set, s, gap, skipped, template_errors, heads, notes)


def engine_cache_dir(out_json: str | os.PathLike) -> Path:
    """The folder of vLLM's caches for the engines of the benchmark writing ``out_json``
    (``engine_process.compile_cache``): ``vllm_cache`` beside it, ``results/<run>/vllm_cache``, so the run's
    benchmark started again (a retry, a rerun with other figures wanted) finds its engines' compiled forwards, and a
    run's folder removed takes its cache with it. Not a file target: Snakemake neither plans nor removes it."""
    return Path(out_json).resolve().parent / "vllm_cache"


def run_engines(tmp: Path, runs: list[tuple[str, dict]], target_dir: str | os.PathLike) -> list[dict]:
    """The benchmark's timed engine runs ``runs`` (``(name, spec)``, ``measure.RUN_ENTRY``'s spec, in order), their
    results in that order: ``engine_args.SIDE_BY_SIDE`` at a time started side by side and decoding one after the other
    (``engine_process.run_side_by_side``) where their engines may (``engine_args.side_by_side``: every CPU engine, a
    small target's on a card), else one at a time. Every result keeps its engine's start (``engine_start_s``,
    ``startup``), logged once more together at the end.

    Raises:
        RuntimeError: an engine run failed.
    """
    out: list[dict] = []
    for i in range(0, len(runs), SIDE_BY_SIDE):
        group = runs[i:i + SIDE_BY_SIDE]
        beside = side_by_side([spec["engine"] for _, spec in group], target_dir) if len(group) > 1 else None
        if beside is None:
            out += [engine_process.run_child(RUN_ENTRY, spec, tmp, name) for name, spec in group]
        else:
            out += engine_process.run_side_by_side(
                [(RUN_ENTRY, {**spec, "engine": e}, name) for (name, spec), e in zip(group, beside, strict=True)], tmp)
    log.info("engine starts: %s", ", ".join(
        f"{name} {r['engine_start_s']} s" + (f" (beside {', '.join(r['started_beside'])})" if r.get("started_beside")
                                              else "") for (name, _), r in zip(runs, out, strict=True)))
    return out


def target_answers(tmp: Path, engine: Callable[..., dict], name: str, first_turns: list[dict], max_tokens: int,
                   concurrency: int) -> dict[str, str]:
    """The target's own greedy answers to set ``name``'s ``first_turns``, made once by one engine of the target alone
    (``engine()``, the baseline's arguments; ``max_tokens`` a request, ``concurrency`` in flight, 0 = all): ``{its
    answer_key: text}``, the conversation every run's next turn continues (``PromptSet.next_turns``). Engines' files
    under ``tmp``.

    Raises:
        RuntimeError: the engine run failed.
    """
    r = engine_process.run_child(RUN_ENTRY, {"prompts": first_turns, "max_tokens": max_tokens,
                                             "concurrency": concurrency, "engine": engine()}, tmp,
                                 f"{name}_first_turn_answers")
    log.info("%s: the target answered %d first turns (%d output tokens) for the next turns", name, len(first_turns),
             r["output_tokens"])
    key = prompt_sets.get(name).answer_key
    return {key(p["id"]): text for p, text in zip(first_turns, r["texts"], strict=True)}


def next_turns(name: str, first_turns: list[dict], answers: dict[str, str], count_tokens: Callable[[list[dict]], int],
               limit: int) -> tuple[list[dict], dict[str, int]]:
    """Set ``name``'s ``first_turns``, each followed by its next turn after ``answers`` (``PromptSet.next_turns``),
    less the next turns the chat template refuses or whose tokens (``count_tokens``) exceed ``limit``, each logged:
    ``(prompts, {"template_error": n, "too_long": n})``."""
    out, dropped, first = [], {"template_error": 0, "too_long": 0}, {p["id"] for p in first_turns}
    for p in prompt_sets.get(name).next_turns(first_turns, answers):
        if p["id"] in first:
            out.append(p)
            continue
        try:
            n = count_tokens(p["messages"])
        except Exception as e:  # whatever the template raises (jinja2's TemplateError, ValueError, ...)
            log.warning("benchmark set %s: prompt %s skipped, the chat template refuses it (%s: %s)", name, p["id"],
                        type(e).__name__, e)
            dropped["template_error"] += 1
            continue
        if n > limit:
            log.warning("benchmark set %s: prompt %s skipped, %d tokens with the chat template (over %d)", name,
                        p["id"], n, limit)
            dropped["too_long"] += 1
            continue
        out.append(p)
    return out, dropped


def read_heads(s: BenchmarkSettings) -> list[tuple[str, Head]]:
    """The heads ``s`` serves, each read once (``Head.read``): ``(benchmark_runs.OWN_HEAD, the run's own)``, then
    each of ``s.heads_compared`` by its name.

    Raises:
        head_format.HeadError: a head's config.json is no head of a registered method, or lacks what it is read
            for (its layers, its trained positions).
    """
    return [(OWN_HEAD, Head.read(s.head_dir)), *((h["name"], Head.read(h["path"])) for h in s.heads_compared)]


def chat_token_counter(target_dir: str, trust_remote_code: bool = declared("target.trust_remote_code")
                       ) -> Callable[[list[dict]], int]:
    """A function of a chat prompt's messages -> its token count as vLLM's ``LLM.chat`` renders it: the
    target's tokenizer (``target_dir``, local files only) and chat template with the generation prompt,
    no special tokens added beyond the template's.

    Raises:
        OSError, ValueError: the tokenizer cannot be loaded from ``target_dir`` (transformers' errors);
            the returned function raises ValueError where the tokenizer has no chat template.
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.fspath(target_dir), trust_remote_code=trust_remote_code,
                                        local_files_only=True)
    return lambda messages: len(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                        return_dict=False))


def _benchmark(tmp: Path, engine: Callable[..., dict], by_set: dict[str, list[dict]], s: BenchmarkSettings,
               gap: float, skipped_too_long: dict[str, int], skipped_template_error: dict[str, int] | None = None,
               heads: list[tuple[str, Head]] | None = None, notes: dict[str, dict] | None = None) -> dict:
    """``benchmark`` of ``s`` once the prompts are chosen: ``by_set`` (the prompts that run, per set; a set whose
    prompts carry a ``category`` is decoded and reported per category), ``skipped_too_long`` and
    ``skipped_template_error`` (prompts skipped per set, written to ``settings.sets``), ``engine`` (k, eager, seqs,
    layers -> ``engine_args``; ``layers``: the served head's KV-cached layers), ``gap`` (near-tie threshold, nats),
    ``heads`` (``read_heads`` of ``s``, read here where not given), ``notes`` (more of a set's ``settings.sets``
    entry: its options, first_turn_answers); engines' files under ``tmp``."""
    heads = heads or read_heads(s)
    # before any engine starts: a head without d2t fails here
    drafts = {name: draft_vocab_ids(h.path) for name, h in heads}
    prompts = [p for ps in by_set.values() for p in ps]
    set_of = [name for name, ps in by_set.items() for _ in ps]
    groups = []
    for name, ps in by_set.items():
        cats = prompt_sets.categories(ps)
        groups.append({"name": name, "count": len(ps), **({"parts": cats} if cats else {})})
    common = {"prompts": prompts, "max_tokens": s.max_tokens, "concurrency": s.concurrency, "sets": groups}
    planned = [("baseline", None, None, {**common, "engine": engine()})]  # (name, head, k, spec) of each engine run
    for head, h in heads:
        trained = h.trained_positions
        for k in s.ks:
            if trained is not None and k > trained:
                log.warning("%s k=%d: the head was trained to fill %d draft positions in one forward "
                            "(draft.peagle.num_depths or draft.dflash.block_size - 1); its drafts beyond position %d are "
                            "untrained", head, k, trained, trained)
            spec = h.speculative_config(k)  # by the head's method: eagle3, peagle or dflash
            planned.append((f"eagle3_k{k}" if head == OWN_HEAD else f"compare_{head}_k{k}", head, k,
                            {**common, "engine": engine(k, layers=h.kv_layers), "speculative_config": spec}))
    results = run_engines(tmp, [(name, spec) for name, _, _, spec in planned], s.target_dir)
    base = results[0]
    log.info("baseline: %.2f output tokens/s", base["output_tokens_per_s"])
    runs, named = [], dict(heads)
    for (_, head, k, _), r in zip(planned[1:], results[1:], strict=True):
        r.update(num_speculative_tokens=k, head=head, **named[head].described())  # every run names what it served
        runs.append(r)
    tops = lossless.baseline_top_logprobs(tmp, engine, base, runs)
    # the baseline's tokens inside each head's draft vocab: one figure per set, the same for every k
    cover = {h: {name: draft_vocab_coverage(base["sets"][name]["token_ids"], d) for name in by_set}
             for h, d in drafts.items()}
    cover_all = {h: draft_vocab_coverage(base["token_ids"], d) for h, d in drafts.items()}
    for r in runs:
        k, head, who = r["num_speculative_tokens"], r.get("head", OWN_HEAD), run_label(r)
        r["draft_vocab_coverage"] = cover_all[head]
        diffs = lossless.differences(base, r, prompts, set_of, tops, gap)
        r.update(num_speculative_tokens=k, **compare(base, r, prompts, diffs))
        for name, ps in by_set.items():
            r["sets"][name].update(compare(base["sets"][name], r["sets"][name], ps,
                                           [d for d in diffs if d["set"] == name]),
                                   draft_vocab_coverage=cover[head][name])
            if "categories" in r["sets"][name]:
                per_category(base["sets"][name], r["sets"][name], ps, [d for d in diffs if d["set"] == name],
                             drafts[head], f"{who} {name}")
            log.info("%s %s: tau=%s, %.2f tokens/s (x%.2f), %d prompts differ (%d near-ties), draft vocab "
                     "coverage %s", who, name, r["sets"][name]["mean_acceptance_length"],
                     r["sets"][name]["output_tokens_per_s"], r["sets"][name]["speedup"],
                     r["sets"][name]["prompts_differing_from_baseline"], r["sets"][name]["near_ties"],
                     r["sets"][name]["draft_vocab_coverage"])
        log.info("%s overall: tau=%s, %.2f tokens/s (x%.2f), %d prompts differ (%d near-ties)", who,
                 r["mean_acceptance_length"], r["output_tokens_per_s"], r["speedup"],
                 r["prompts_differing_from_baseline"], r["near_ties"])
    for r in [base, *runs]:
        r.pop("token_ids")
        r.pop("prompt_token_ids")
        for v in r["sets"].values():
            v.pop("token_ids")
            v.pop("prompt_token_ids")
            for c in v.get("categories", {}).values():
                for key in ("token_ids", "prompt_token_ids", "texts"):  # the texts are the set's, in its order
                    c.pop(key)
    lossless.check(runs, s.out_json, gap, run_label)
    eng = engine()
    result = {
        "versions": software_versions(BENCHMARK_PACKAGES, keep_missing=False),
        "hardware": hardware(),
        "settings": {"num_prompts": s.num_prompts, "max_tokens": s.max_tokens, "dtype": eng["dtype"],
                     "temperature": 0.0, "ks": s.ks, "concurrency": s.concurrency, "served_name": s.served_name,
                     "max_model_len": s.max_model_len,
                     "tensor_parallel_size": eng["tensor_parallel_size"],
                     "pipeline_parallel_size": eng["pipeline_parallel_size"],
                     "near_tie_max_logprob_gap": gap, "near_tie_top_logprobs": lossless.NEAR_TIE_TOP,
                     "sets": {name: {"num_prompts": len(ps), "prompt_ids": [p["id"] for p in ps],
                                     "skipped_too_long": skipped_too_long[name],
                                     "skipped_template_error": (skipped_template_error or {}).get(name, 0),
                                     **(notes or {}).get(name, {})}
                              for name, ps in by_set.items()}},
        "baseline": base,
        "heads": [{"name": name, **h.described()} for name, h in heads],
        "runs": runs,
    }
    if s.heads_compared:
        result["settings"]["compare_heads"] = [{"name": h["name"], "path": h["path"]} for h in s.heads_compared]
    if s.preflight_path:
        result["preflight"] = compare_benchmark(result, json.loads(Path(s.preflight_path).read_text()))
    if s.k_schedule_concurrencies:
        result["k_schedule"] = k_schedule(tmp, engine, prompts, heads[0][1], s.ks, s.max_tokens,
                                          sorted(set(s.k_schedule_concurrencies)))
    validate(result)
    write_json(s.out_json, result)
    return result


def draft_vocab_ids(head_dir: str | os.PathLike) -> frozenset[int]:
    """The target token ids of the head's draft vocab: ``arange(D) + d2t`` (``d2t`` int64 [D] of the exported
    ``model.safetensors``, the tensor vLLM maps draft ids with: vllm/model_executor/models/llama_eagle3.py).

    Raises:
        FileNotFoundError: ``head_dir`` has no ``model.safetensors``.
        KeyError: it holds no ``d2t``.
    """
    from safetensors import safe_open

    path = Path(head_dir) / "model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the head's weights (with d2t) are missing")
    with safe_open(str(path), framework="numpy") as f:
        if "d2t" not in f.keys():
            raise KeyError(f"{path}: no d2t tensor (the draft vocab map)")
        d2t = f.get_tensor("d2t")
    return frozenset(vocab_map.draft_target_ids(d2t).tolist())


def draft_vocab_coverage(token_ids: list[list[int]], draft: frozenset[int]) -> float | None:
    """Share of the output tokens ``token_ids`` (per prompt, target ids) inside ``draft`` (``draft_vocab_ids``),
    in [0, 1]; None without output tokens."""
    from collections import Counter

    return vocab_map.coverage(Counter(t for seq in token_ids for t in seq), draft)


def per_category(base_set: dict, run_set: dict, prompts: list[dict], differences: list[dict],
                 draft: frozenset[int], label: str) -> None:
    """Complete a run's per-category figures of one set in place: for each category of ``run_set["categories"]``
    (the engine's counters and timings of that category's requests: τ, acceptance per position), its speed-up over
    ``base_set["categories"]`` (the baseline's same category), the step with the head and the lossless check of its
    prompts (``compare``, ``differences`` of the set filtered to them) and the share of the baseline's output tokens
    of the category inside ``draft`` (``draft_vocab_coverage``). ``prompts``: the set's, in order, each with its
    ``category``; ``label``: the run and set in the log line each category gets."""
    for cat, fig in run_set["categories"].items():
        ps = [p for p in prompts if p["category"] == cat]
        ids = {p["id"] for p in ps}
        b = base_set["categories"][cat]
        fig.update(compare(b, fig, ps, [d for d in differences if d["prompt_id"] in ids]),
                   draft_vocab_coverage=draft_vocab_coverage(b["token_ids"], draft))
        log.info("%s %s: tau=%s, %.2f tokens/s (x%.2f), %d prompts differ", label, cat, fig["mean_acceptance_length"],
                 fig["output_tokens_per_s"], fig["speedup"], fig["prompts_differing_from_baseline"])


def compare(base: dict, run: dict, prompts: list[dict], differences: list[dict] | None = None) -> dict:
    """Speed-up (``run`` tokens/s over ``base`` tokens/s, same prompts), the step with the head
    (``step_costs.step_cost``) and the lossless check of ``prompts`` (``lossless.figures``)."""
    return {**step_cost(base, run), "speedup": run["output_tokens_per_s"] / base["output_tokens_per_s"],
            **lossless.figures(base, run, prompts, differences)}
