# Paths, shard arithmetic and input functions shared by all rules.
import math
import os
import sys

from snakemake.common import get_function_params, overwrite_function_params

sys.path.insert(0, workflow.basedir)  # this checkout's eagle3build, whatever is installed
from eagle3build.config import spec
from eagle3build.draft import choice
from eagle3build.formats import benchmark_runs, target_files
from eagle3build.vllm.engine_args import engine_layout
from eagle3build.workflow import contract, missing, plan, staleness

RUN = config["run"]
RES = f"results/{RUN}"
LOGS = f"logs/{RUN}"
BENCH = f"{RES}/benchmarks"

# The target: a user's HF directory, or a bundled GGUF materialised under resources/.
TARGET = config["target"]["path"] or f"resources/targets/{config['target']['bundled']}"
# Its content, not the folder, is what rules take as input: config, tokenizer files, chat
# template, remote code and weight files (eagle3build.formats.target_files.content_files). A new unrelated
# file in the folder changes nothing; weights rewritten in place are newer than every output.
# A bundled target's files are the outputs of materialize_target.
# A folder that is no model folder (a Hugging Face cache's models--org--name, an unfinished
# download) is refused here, naming what is missing, not in an input function later.
if config["target"]["path"] and target_files.target_dir_problem(TARGET):
    raise ValueError(target_files.target_dir_problem(TARGET))
# A folder with config.json and no weight files (a download that has the config and tokenizer but
# not the weights yet; the examples' config-only targets) plans: a dry-run warns. A build whose
# planned jobs read the weights stops before its first job (onstart below), naming the folder.
TARGET_WEIGHTS_PROBLEM = config["target"]["path"] and target_files.target_weights_problem(TARGET)
# The rules whose jobs read the target's weights (the others read its config and tokenizer only).
READS_TARGET_WEIGHTS = frozenset(
    {"preflight_bound", "regenerate_responses", "capture_hidden_states", "train_draft", "export_head", "benchmark"}
    | set(contract.STAGE_OF_RULE)  # train_draft_method, export_head_method
)
if TARGET_WEIGHTS_PROBLEM:
    logger.warning(f"{TARGET_WEIGHTS_PROBLEM}; it plans, but a build stops before its first job that reads them")


def check_target_weights(jobs):
    """Refuse a build of a target folder without weight files (TARGET_WEIGHTS_PROBLEM) whose planned
    ``jobs`` (Snakemake jobs) include one that reads them (READS_TARGET_WEIGHTS).

    Raises:
        ValueError: naming the folder, what it lacks and the rules that read the weights.
    """
    reading = sorted(READS_TARGET_WEIGHTS.intersection(job.rule.name for job in jobs))
    if TARGET_WEIGHTS_PROBLEM and reading:
        raise ValueError(
            f"{TARGET_WEIGHTS_PROBLEM}; the planned jobs of {', '.join(reading)} read them: nothing was run"
        )


# Before the first job of a build (never in a dry-run: Snakemake calls onstart only when it executes).
onstart:
    check_target_weights(workflow.dag.needrun_jobs())


TARGET_FILES = (
    target_files.content_files(TARGET)
    if config["target"]["path"]
    else [f"{TARGET}/{f}" for f in target_files.MATERIALIZED_FILES]
)


def target_dir(wildcards, input):
    """The target's folder, for the adapters (from the input files: the lint's advice for
    executors without a shared filesystem)."""
    return os.path.dirname(input.target[0])


# What the compat report decided (backend, aux ids, head variant, target summary), apart
# from its diagnostics (compat.json: timings, free disk, warnings; compat.md is rendered
# from it by its own job). Stages read only this file, which a report with the same
# decisions rewrites byte for byte: Snakemake skips an input that is newer than the outputs
# but has the checksum it recorded, so a report rebuilt on its own replans nothing below it.
# Settings that may be `auto` reach the params as requested (eagle3build.workflow.contract.requested): writing
# down what `auto` chose is no change (eagle3build.workflow.staleness.canonical_request). Not ancient(): Snakemake 9 then
# never checks the jobs below a re-running report, and a changed setting would go unplanned.
DECISIONS = f"{RES}/decisions.json"
_RECORDED_DECISIONS = staleness.read_decisions(DECISIONS)
REGENERATED = f"{RES}/data/regenerated.jsonl"


def signature_once(func):
    """``func``, with its signature recorded once. Snakemake reads the signature of every
    param, input and resource callable with inspect.signature, two or three times for each
    job it evaluates it for (snakemake.common.get_function_params); recording it up front is
    what Snakemake's own helpers do (snakemake/ioutils/subpath.py). At 10,000 shards this is
    a measurable part of `snakemake -n` (benchmarks/plan_10k.py)."""
    overwrite_function_params(func, get_function_params(func))
    return func


# Where the jobs run when not in the planner's environment: under `--sdm conda`, the conda
# environment named in the `conda` directive of all the rules, keyed by its pins
# (staleness.env_digest: the file and the lock files it names). The `version` params then carry
# it instead of the planner's installed versions, which are not the job's; None: the jobs run
# where Snakemake runs (docs/staleness.md).
CONDA_ENV = f"{workflow.basedir}/envs/eagle3build.yaml"
JOB_ENV = (
    {"conda": staleness.env_digest(CONDA_ENV)}
    if any(m.name == "CONDA" for m in getattr(workflow.deployment_settings, "deployment_method", ()))
    else None
)


def stage_params(stage, cfg=None):
    """A stage rule's rerun-trigger params, one per ``Param`` of its contract
    (eagle3build.workflow.contract.CONTRACTS[stage].params), by name: ``params: **stage_params(stage)``; of config ``cfg``
    where given (``method_config``), else the workflow's.
    The `version` param is the stage's OUTPUT_VERSION and the installed versions of the packages that
    shape its output, or the job's conda environment (JOB_ENV); no packages when the config's
    staleness.track_package_versions is false."""
    ctx = contract.PlanContext(stage, _RECORDED_DECISIONS, JOB_ENV, REGENERATED)
    return {p.name: contract.param_value(p, cfg or config, ctx) for p in contract.CONTRACTS[stage].params}


def job_settings_param(stage, by_method=False):
    """A stage job's settings (eagle3build.workflow.contract.StageSettings: its trigger and runtime keys' values),
    as a param made from ``threads``: Snakemake takes it as derived and does not compare it, so the
    runtime keys in it (resources, sizes for a disk check) plan nothing; the triggers are compared
    through ``stage_params``. ``by_method``: those of ``method_config(wildcards.method)`` (the
    draft.compare_methods rules)."""
    settings = contract.job_settings(stage, config)

    def job_settings(wildcards, threads):
        return contract.job_settings(stage, method_config(wildcards.method)) if by_method else settings

    return signature_once(job_settings)


def check_contracts(rules):
    """Each stage rule's named inputs, and each derived rule's (contract.STAGE_OF_RULE), are those of its stage's
    contract (eagle3build.workflow.contract.CONTRACTS).

    Raises:
        ValueError: a rule's inputs differ from its contract's.
    """
    for name in [*contract.CONTRACTS, *contract.STAGE_OF_RULE]:  # a derived rule restates its stage's inputs
        c = contract.CONTRACTS[contract.stage_of(name)]
        names = set(getattr(rules, name).input.keys())
        if names != set(c.inputs):
            raise ValueError(f"the inputs of {name}, {sorted(names)}, are not its contract's {sorted(c.inputs)}")


def warn_missing_intermediates(rules):
    """Warn, at planning, of each intermediate of a built run that is gone while what was made from it is present
    (eagle3build.workflow.missing.missing_intermediates): Snakemake 9 plans nothing for it and says nothing. Names the
    files, the command that rebuilds them and what is replanned after. ``rules``: the workflow's rules; those
    with wildcards in their outputs are producers only (their files are read through the rules that list them);
    the inputs of rules without outputs (rule ``all``) are targets, which Snakemake plans when missing."""
    steps = [
        missing.Step(r.name, tuple(str(f) for f in r.input if isinstance(f, str)), tuple(map(str, r.output)))
        for r in rules
        if r.output and not r.has_wildcards()
    ]

    def producer_of(path):
        return next((r.name for r in rules if r.output and r.is_producer(path)), None)

    targets = frozenset(str(f) for r in rules if not r.output for f in r.input if isinstance(f, str))
    for m in missing.missing_intermediates(steps, producer_of, targets):
        logger.warning(missing.missing_intermediate_message(m))


# One file target per shard: shard i of a split holds samples [i*S, min((i+1)*S, N)).
# A shard's params depend only on its own range, so raising N adds shards and
# leaves the full ones up to date.
SHARD_SIZE = config["capture"]["samples_per_shard"]
NUM_SAMPLES = {
    "train": config["capture"]["num_train_samples"],
    "eval": config["capture"]["num_eval_samples"],
}


wildcard_constraints:
    split="train|eval",
    shard=r"\d{5}",
    method="|".join(spec.DRAFT_METHODS),


def num_shards(split):
    return math.ceil(NUM_SAMPLES[split] / SHARD_SIZE)


def shard_files(split):
    return [f"{RES}/hidden_states/{split}/shard-{i:05d}.safetensors" for i in range(num_shards(split))]


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


# Benchmark set ``custom`` is the file data.prompts_file; one without the other is a
# config error (the file would be silently ignored, or the set would have no prompts).
if ("custom" in config["benchmark"]["sets"]) != bool(config["data"]["prompts_file"]):
    raise ValueError(
        "config: benchmark.sets lists 'custom' exactly when data.prompts_file names a prompts JSONL; "
        f"got benchmark.sets={config['benchmark']['sets']} and data.prompts_file={config['data']['prompts_file']!r}"
    )


# serve.check_set names a set the benchmark runs (or auto): serve_check sends that set's prompts of benchmark.json.
if config["serve"]["check_set"] not in ("auto", *config["benchmark"]["sets"]):
    raise ValueError(
        f"config: serve.check_set {config['serve']['check_set']!r} is not in benchmark.sets "
        f"{config['benchmark']['sets']}: serve_check sends a set the benchmark ran (or auto)"
    )


def custom_prompts_input(wildcards):
    """data.prompts_file, an input of the benchmark only (editing it reruns just the benchmark)."""
    return config["data"]["prompts_file"] if "custom" in config["benchmark"]["sets"] else []


# benchmark.compare_heads: named apart from the run's own head and from each other, and not the run's own head
# directory; checked when planning, not after training (eagle3build.serve.benchmark checks the names too).
benchmark_runs.check_compare_names(config["benchmark"]["compare_heads"])
if any(os.path.normpath(h["path"]) == f"{RES}/head" for h in config["benchmark"]["compare_heads"]):
    raise ValueError(f"config: benchmark.compare_heads lists {RES}/head, the run's own head, which runs anyway")


# The draft head (eagle3build.draft.choice): draft.method, its options and draft.layer resolved once, here, against
# the target's config.json (a bundled target's known fields before it is materialised); what cannot be built stops
# the plan in one line naming the keys. The jobs get it as their derived `draft` param (draft_param).
BUNDLED = None if config["target"]["path"] else config["target"]["bundled"]
TARGET_CONFIG = target_files.planning_config(TARGET, BUNDLED)  # (config.json as a dict or None, the key naming it)
# capture.aux_layer_ids against the target's decoder layers: refused here in one line (eagle3build.workflow.plan)
AUX_PROBLEM = plan.aux_layer_ids_problem(config["capture"]["aux_layer_ids"], *TARGET_CONFIG)
if AUX_PROBLEM:
    raise WorkflowError(AUX_PROBLEM)
try:
    DRAFT = choice.resolve(config["draft"], *TARGET_CONFIG)
    # draft.compare_methods: heads of other draft methods, trained from this run's shards under
    # results/<run>/methods/ (rules train_draft_method, export_head_method), each with its own layer where the
    # method is not built with draft.layer (said below), served by the benchmark beside the run's own head
    COMPARED = {d.method.name: d for d in choice.compared(config["draft"], DRAFT)}
except choice.DraftError as e:
    raise WorkflowError(str(e)) from None
if workflow.is_main_process and choice.compare_note(DRAFT, tuple(COMPARED.values())):
    logger.warning(choice.compare_note(DRAFT, tuple(COMPARED.values())))
COMPARE_METHODS = config["draft"]["compare_methods"]
METHOD_HEADS = benchmark_runs.method_heads(
    RES, config["draft"]["method"], COMPARE_METHODS, config["benchmark"]["compare_heads"]
)


def compare_heads_input(wildcards):
    """benchmark.compare_heads and draft.compare_methods: each other head's files, inputs of the benchmark (a
    retrained head reruns it; a method's head is built first)."""
    return [
        f"{h['path']}/{f}"
        for h in config["benchmark"]["compare_heads"] + METHOD_HEADS
        for f in ("config.json", "model.safetensors")
    ]


def method_heads_param(wildcards, input):
    """The draft.compare_methods heads ({name, path}) the benchmark serves after benchmark.compare_heads'; a derived
    param (from ``input``): Snakemake does not compare it, the benchmark's ``benchmark`` param holds the methods."""
    return METHOD_HEADS


def method_draft(method):
    """The draft of a draft.compare_methods job of ``method`` (any method: a head asked for by path is built too):
    the run's layer where the method is built with it, else its own (eagle3build.draft.choice.compare_draft)."""
    return COMPARED.get(method) or choice.compare_draft(config["draft"], DRAFT, method)


def method_config(method):
    """The workflow's config with ``draft.method`` set to ``method`` and ``draft.layer`` to the layer its head is
    built with (``method_draft``): what a draft.compare_methods job reads."""
    return {**config, "draft": {**config["draft"], "method": method, "layer": method_draft(method).layer.name}}


def draft_param(by_method=False):
    """The job's draft (eagle3build.draft.choice.Draft.section: method, layer, options), resolved at planning, as a
    param made from ``threads``: derived, not compared (its keys are the ``train`` and ``preflight`` params'
    triggers). ``by_method``: ``method_draft(wildcards.method)`` (the draft.compare_methods rules)."""
    section = DRAFT.section()

    def draft(wildcards, threads):
        return method_draft(wildcards.method).section() if by_method else section

    return signature_once(draft)


def method_stage_params(stage):
    """``stage_params(stage)`` for a draft.compare_methods job, of ``method_config`` by its ``method`` wildcard (any
    method: a head asked for by path is built too, though only the listed ones are benchmarked): one callable of
    the wildcards per param, so Snakemake compares each method's values as the run's own job's."""
    by_method = {}

    def param(name):
        def value(wildcards):
            m = wildcards.method
            if m not in by_method:
                by_method[m] = stage_params(stage, method_config(m))
            return by_method[m][name]

        return signature_once(value)

    return {p.name: param(p.name) for p in contract.CONTRACTS[stage].params}


# The pre-flight speed-up bound (eagle3build.compat.preflight_bound): a GPU job, so `auto` runs it where
# the serve jobs get GPUs; the benchmark then checks its measured steps against it.
PREFLIGHT = f"{RES}/preflight.json"
PREFLIGHT_ENABLED = config["preflight"]["enabled"] == "always" or (
    config["preflight"]["enabled"] == "auto" and config["resources"]["serve"]["gpu"] > 0
)


def preflight_input(wildcards):
    """preflight.json where the pre-flight bound is enabled, else nothing."""
    return PREFLIGHT if PREFLIGHT_ENABLED else []


def local_data_files():
    """The local files of data.sources (``bundled:`` ones are versioned by their package, whose
    version the stage's params carry): inputs of the stage that reads them, so editing or growing
    one replans it."""
    return [s["path"] for s in config["data"]["sources"] if not s["path"].startswith("bundled:")]


def data_source_files(wildcards):
    """prepare_data's data files: the local sources, or none where it reads regenerated.jsonl."""
    return [] if config["data"]["regenerate"]["enabled"] else local_data_files()


def regenerated_input(wildcards):
    return REGENERATED if config["data"]["regenerate"]["enabled"] else []


def res(job, key):
    """A resource of config section resources.<job>, 0 for gpu when absent."""
    return config["resources"][job].get(key, 0)


def gpu_model_res(job):
    """``gpu_model`` (resources.gpu_model) for a job of section ``job`` that asks for GPUs: cluster
    executors read it (SLURM: ``--gpus=<model>:<n>``); nothing for a CPU job or an unset model."""
    model = config["resources"]["gpu_model"]
    return {"gpu_model": model} if model and job and res(job, "gpu") > 0 else {}


def engine_layout_res(job, starts_engine=True):
    """The layout of the vLLM engine a job of resources section ``job`` starts, as resources the dry-run shows
    beside its ``gpu``: ``tensor_parallel_size`` and ``pipeline_parallel_size`` (vllm.engine_args.engine_layout of
    the section's GPUs and target.pipeline_parallel_size: the function the job lays its engine out with, from
    the same numbers). Nothing where the job starts no engine (``starts_engine`` false). No ``--resources``
    limit names them: Snakemake only shows them; they are no params, so they replan nothing."""
    if not starts_engine:
        return {}
    return engine_layout(res(job, "gpu"), config["target"]["pipeline_parallel_size"])


# Jobs that start a vLLM engine (benchmark, regenerate_responses, export_head's load check, capture
# with the vllm backend) get one more attempt, with more memory: an engine that ran out of host
# memory (CPU KV cache, weights staged in RAM) often fits at 1.5x.
VLLM_RETRIES = 1


def attempt_mem_mb(base_mb):
    """mem_mb for attempt n (1, 2, ...): ``base_mb`` (MB) x (1 + (n - 1) / 2)."""

    def mem_mb(wildcards, attempt):
        return int(base_mb * (1 + (attempt - 1) / 2))

    return signature_once(mem_mb)


def capture_may_use_vllm():
    """Whether capture may start vLLM: backend vllm, or auto until the report has chosen hooks."""
    backend = config["capture"]["backend"]
    if backend == "auto" and _RECORDED_DECISIONS:
        backend = _RECORDED_DECISIONS.get("capture", {}).get("backend", "auto")
    return backend != "hooks"


# The run's benchmark file where this plan builds it (eagle3build.workflow.plan.benchmark_in_plan, from the targets
# Snakemake was given; a cluster job's own Snakemake, given its job alone, plans none), else None: export_head then
# leaves its vLLM load check out (export.vllm_load_check: auto), the benchmark's engines loading the same head. Read
# when the jobs are planned: Snakemake sets its DAG settings after parsing this file.
def benchmarked_by(wildcards, threads):
    """export_head's ``benchmarked_by``, a param made from ``threads``: derived, not compared, so that asking for the
    head alone, then for the whole run, replans nothing."""
    d = workflow.dag_settings
    return plan.benchmark_in_plan(d.targets, RES, d.until, d.omit_from, d.target_jobs)


signature_once(benchmarked_by)


def export_res(key):
    """export_head's resources: the serve job's while its vLLM load check may run, else a
    small CPU job (the check is off: ``export.vllm_load_check: never``)."""
    if config["export"]["vllm_load_check"] != "never":
        return res("serve", key)
    return {"gpu": 0, "threads": 1, "mem_mb": 4000, "runtime": 30}[key]
