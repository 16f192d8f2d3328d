# Paths, shard arithmetic and input functions shared by all rules; the planning policy is the package's
# (eagle3build.workflow.plan: what the plan refuses, the drafts, the switches), made once here as PLAN.
import math
import os
import sys

from snakemake.common import get_function_params, overwrite_function_params

sys.path.insert(0, workflow.basedir)  # this checkout's eagle3build, whatever is installed
from eagle3build.config import spec
from eagle3build.formats import target_files
from eagle3build.workflow import contract, plan, staleness, stop

RUN = config["run"]
RES = f"results/{RUN}"
LOGS = f"logs/{RUN}"
BENCH = f"{RES}/benchmarks"

# What the compat report decided, apart from its diagnostics (compat.json): a report with the same decisions rewrites
# it byte for byte, and Snakemake skips an input newer than the outputs whose checksum it recorded, so a report rebuilt
# on its own replans nothing below it. Not ancient(): Snakemake 9 then never checks the jobs below a re-running report.
DECISIONS = f"{RES}/decisions.json"
_RECORDED_DECISIONS = staleness.read_decisions(DECISIONS)
REGENERATED = f"{RES}/data/regenerated.jsonl"
PREFLIGHT = f"{RES}/preflight.json"

# The planning policy (plan.Plan.of): the target, sets, compared heads, aux ids and drafts checked; the drafts resolved.
try:
    PLAN = plan.Plan.of(config, RES, _RECORDED_DECISIONS)
except plan.PlanError as e:
    raise WorkflowError(str(e)) from None
if PLAN.weights_problem:
    logger.warning(f"{PLAN.weights_problem}; it plans, but a build stops before its first job that reads them")
if workflow.is_main_process and PLAN.drafts.note:
    logger.warning(PLAN.drafts.note)


# Before the first job of a build (never in a dry-run: Snakemake calls onstart only when it executes). SIGINT or SIGTERM
# to this process from then on stops the running jobs as a terminal's Ctrl-C does and keeps each finished one
# (eagle3build.workflow.stop; docs/staleness.md).
onstart:
    plan.check_weights(PLAN.weights_problem, (job.rule.name for job in workflow.dag.needrun_jobs()))
    stop.forward_signals(workflow, logger.warning)


# A head the user brings (config draft.head, train.init_from): its files as the rules' inputs (plan.HeadInputs).
HEAD_INPUTS = PLAN.head_inputs(DECISIONS)


# The target: a user's HF directory, or a bundled GGUF materialised under resources/; its files are the rules' input.
TARGET = PLAN.target
TARGET_FILES = plan.target_inputs(config, TARGET)


def target_dir(wildcards, input):
    """The target's folder, for the jobs (from the input files: the lint's advice for executors without a shared
    filesystem)."""
    return os.path.dirname(input.target[0])


def signature_once(func):
    """``func``, with its signature recorded once: Snakemake reads it for each job it evaluates ``func`` for, at 10,000
    shards a measurable part of `snakemake -n` (benchmarks/plan_10k.py; snakemake/ioutils/subpath.py does the same)."""
    overwrite_function_params(func, get_function_params(func))
    return func


# Where the jobs run when not in the planner's environment (staleness.job_env: under `--sdm conda`, this environment,
# keyed by its pins; None: where Snakemake runs), which the `version` params carry (docs/staleness.md).
CONDA_ENV = f"{workflow.basedir}/envs/eagle3build.yaml"
JOB_ENV = staleness.job_env(CONDA_ENV, getattr(workflow.deployment_settings, "deployment_method", ()))


def stage_params(stage, cfg=None):
    """A stage rule's rerun-trigger params, one per ``Param`` of its contract, by name (``**stage_params(stage)``), of
    config ``cfg`` where given (a draft.compare_methods job's); `version`: OUTPUT_VERSION, packages' or JOB_ENV."""
    ctx = contract.PlanContext(stage, _RECORDED_DECISIONS, JOB_ENV, REGENERATED)
    return {p.name: contract.param_value(p, cfg or config, ctx) for p in contract.CONTRACTS[stage].params}


def job_settings_param(stage, by_method=False):
    """A stage job's settings (contract.StageSettings) as a param made from ``threads``: derived, not compared, so its
    runtime keys plan nothing (``stage_params`` carry the triggers). ``by_method``: its compare_methods method's."""
    settings = contract.job_settings(stage, config)

    def job_settings(wildcards, threads):
        return contract.job_settings(stage, method_config(wildcards.method)) if by_method else settings

    return signature_once(job_settings)


# One file target per shard: shard i of a split holds samples [i*S, min((i+1)*S, N)). A shard's params depend only on
# its own range, so raising N adds shards and leaves the full ones up to date.
SHARD_SIZE = config["capture"]["samples_per_shard"]
NUM_SAMPLES = {"train": config["capture"]["num_train_samples"], "eval": config["capture"]["num_eval_samples"]}


wildcard_constraints:
    split="train|eval",
    shard=r"\d{5}",
    method="|".join(spec.DRAFT_METHODS),


def shard_files(split):
    return [
        f"{RES}/hidden_states/{split}/shard-{i:05d}.safetensors"
        for i in range(math.ceil(NUM_SAMPLES[split] / SHARD_SIZE))
    ]


# capture.mode online: no shard is a target; train_draft reads the tokens files and runs the target itself.
ONLINE = config["capture"]["mode"] == "online"


def states_input(split):
    """train_draft's input for ``split``: its shards (offline) or its tokens file (online)."""
    return [f"{RES}/data/{split}.safetensors"] if ONLINE else shard_files(split)


@signature_once
def shard_range(wildcards):
    """Shard ``wildcards.shard`` of split ``wildcards.split``: {"start": first sample, "num_samples": samples}."""
    start = int(wildcards.shard) * SHARD_SIZE
    return {"start": start, "num_samples": min(SHARD_SIZE, NUM_SAMPLES[wildcards.split] - start)}


def custom_prompts_input(wildcards):
    """data.prompts_file where a set reads it (plan.prompts_file_input)."""
    return plan.prompts_file_input(config)


METHOD_HEADS = list(PLAN.drafts.method_heads)  # draft.compare_methods' heads, under results/<run>/methods/


def compare_heads_input(wildcards):
    """benchmark.compare_heads and draft.compare_methods: each other head's files, inputs of the benchmark (a
    retrained head reruns it; a method's head is built first)."""
    heads = config["benchmark"]["compare_heads"] + METHOD_HEADS
    return [f"{h['path']}/{f}" for h in heads for f in ("config.json", "model.safetensors")]


def method_heads_param(wildcards, input):
    """The draft.compare_methods heads ({name, path}) the benchmark serves after benchmark.compare_heads': a derived
    param (from ``input``), not compared: the ``benchmark`` param holds the methods."""
    return METHOD_HEADS


def method_config(method):
    """The config a draft.compare_methods job of ``method`` reads (plan.Drafts.config_of)."""
    return PLAN.drafts.config_of(config, method)


def draft_param(by_method=False):
    """The job's draft (Draft.section), resolved at planning, as a param made from ``threads``: derived, not compared
    (its keys are the ``train`` and ``preflight`` params' triggers). ``by_method``: its method's (plan.Drafts.of)."""
    section = PLAN.drafts.own.section()

    def draft(wildcards, threads):
        return PLAN.drafts.of(wildcards.method).section() if by_method else section

    return signature_once(draft)


def method_stage_params(stage):
    """``stage_params(stage)`` for a draft.compare_methods job, of ``method_config`` by its ``method`` wildcard: one
    callable of the wildcards per param, so Snakemake compares each method's values as the run's own job's."""
    by_method = {}

    def param(name):
        def value(wildcards):
            m = wildcards.method
            if m not in by_method:
                by_method[m] = stage_params(stage, method_config(m))
            return by_method[m][name]

        return signature_once(value)

    return {p.name: param(p.name) for p in contract.CONTRACTS[stage].params}


def preflight_input(wildcards):
    """preflight.json where the pre-flight bound is enabled (plan.preflight_enabled), else nothing."""
    return PREFLIGHT if PLAN.preflight else []


def local_data_files():
    """The local files of data.sources (a ``bundled:`` one's version is its package's, in the params): inputs of the
    stage that reads them, so editing or growing one replans it."""
    return [s["path"] for s in config["data"]["sources"] if not s["path"].startswith("bundled:")]


def data_source_files(wildcards):
    """prepare_data's data files: the local sources, or none where it reads regenerated.jsonl."""
    return [] if config["data"]["regenerate"]["enabled"] else local_data_files()


def regenerated_input(wildcards):
    return REGENERATED if config["data"]["regenerate"]["enabled"] else []


def res(job, key):
    """A resource of config section resources.<job>, 0 for gpu when absent."""
    return config["resources"][job].get(key, 0)


# Jobs that start a vLLM engine get one more attempt, with more memory: an engine that ran out of host memory (CPU KV
# cache, weights staged in RAM) often fits at 1.5x.
VLLM_RETRIES = 1


def attempt_mem_mb(base_mb):
    """mem_mb for attempt n (1, 2, ...): ``base_mb`` (MB) x (1 + (n - 1) / 2)."""

    def mem_mb(wildcards, attempt):
        return int(base_mb * (1 + (attempt - 1) / 2))

    return signature_once(mem_mb)


# The run's benchmark file where this plan builds it (plan.benchmark_in_plan), else None; read when the jobs are
# planned: Snakemake sets its DAG settings after parsing this file.
@signature_once
def benchmarked_by(wildcards, threads):
    """export_head's ``benchmarked_by``, a param made from ``threads``: derived, not compared, so that asking for the
    head alone, then for the whole run, replans nothing."""
    d = workflow.dag_settings
    return plan.benchmark_in_plan(d.targets, RES, d.until, d.omit_from, d.target_jobs)
