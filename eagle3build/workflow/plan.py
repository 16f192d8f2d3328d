"""The planning policy the rules read, tested as a module without Snakemake (tests/test_plan.py): what the plan refuses
before any job, what it resolves once for every job, and what it tells jobs about the plan itself. rules/common.smk
makes one ``Plan`` of the workflow's config (``Plan.of``) and keeps the paths, the shard arithmetic and the input
functions; every refusal is one line (``PlanError``; the Snakefile raises it as a WorkflowError, the message alone).

- The target folder (``target_folder``; ``Plan.of``): a ``target.path`` folder that is no model folder (a Hugging
  Face cache's ``models--org--name``, an unfinished download) is refused, naming what is missing; one with
  config.json and no weight files plans, with a warning (``Plan.weights_problem``), and a build whose planned jobs
  read the weights (``READS_TARGET_WEIGHTS``) stops before its first job (``check_weights``).
- The benchmark's sets (``check_sets``, ``prompts_file_input``): a set of the prompts file (``custom``) exactly where
  ``data.prompts_file`` names a file;
  ``serve.check_set`` among the sets the benchmark runs. The compared heads (``check_compare_heads``): named apart from
  the run's own head and from each other, and not the run's own head folder.
- ``aux_layer_ids_problem``: ``capture.aux_layer_ids`` against the target's decoder layers (its config.json), refused
  at planning rather than in the compat report after the data (issue 67).
- The draft head (``Drafts``): ``draft.method``, its options and ``draft.layer`` resolved once against the target's
  config.json (``draft.choice``), the heads of ``draft.compare_methods`` each with its layer, their folders as the
  benchmark's compared heads, and the config each of their jobs reads (``Drafts.config_of``).
- Switches read from the config: the pre-flight bound (``preflight_enabled``), whether capture may start vLLM
  (``capture_may_use_vllm``: backend vllm, or auto until the compat report has chosen hooks, from its decisions),
  export's vLLM load check and its resources (``export_loads_in_vllm``, ``export_resources``); a job's GPUs, its GPU
  model and its engine's layout as the resources the dry-run shows (``job_gpus``, ``gpu_model_resources``,
  ``engine_layout_resources``).
- A head the user brings (``check_given_head``, ``check_init_from``; ``draft.given_head`` reads it without torch):
  ``draft.head``, the run's head, and ``train.init_from``, where training starts, each refused in one line where the
  folder is no head (naming what is missing), a head for another target (its hidden size, vocabulary, verifier or
  aux layers against the target's config.json, both values and their files named) or of another ``draft.method`` /
  ``draft.layer``; ``draft.head`` beside ``draft.compare_methods`` or ``train.*`` keys it makes meaningless (named);
  ``train.init_from`` beside ``draft.compare_methods``, or with other aux layers, draft vocabulary or a forced head
  variant than the head's.
- ``check_rules``: each rule against its stage's contract (its inputs; the outputs and params its settings object's
  fields read), at every parse.
- ``benchmark_in_plan``: whether this plan builds the run's benchmark, which serves the run's heads in vLLM engines;
  the export job then leaves its own vLLM load check out (``export.vllm_load_check: auto``), since the benchmark's
  engines load the same head minutes later (issue 65: 38 s of a 51 s export on an H100).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import prompt_sets
from ..config.spec import section_keys
from ..draft import choice, given_head, methods
from ..draft.choice import Draft
from ..draft.given_head import GivenHead, GivenHeadError
from ..draft.head_format import HEAD_FLAGS, HEAD_VARIANTS
from ..formats import benchmark_runs, quantization, target_files
from ..formats.target_files import num_decoder_layers
from ..vllm.engine_args import engine_layout
from .contract import CONTRACTS, RULE_ENTRIES, STAGE_OF_RULE, Contract, job_entry, stage_of
from .job_fields import rule_problems


class PlanError(ValueError):
    """A config or target the plan refuses before any job: the message is the one line that says why and which key
    or folder to change."""


def target_folder(config: Mapping[str, Any]) -> str:
    """The target's folder: ``target.path``, or the bundled target (``target.bundled``) materialised under
    ``resources/targets/`` (relative to the working directory)."""
    return config["target"]["path"] or f"resources/targets/{config['target']['bundled']}"


# The rules whose jobs read the target's weights (the others read its config and tokenizer only), the rules of
# draft.compare_methods included (train_draft_method, export_head_method).
READS_TARGET_WEIGHTS = frozenset({"preflight_bound", "regenerate_responses", "capture_hidden_states", "train_draft",
                                  "export_head", "benchmark", *STAGE_OF_RULE})


def target_inputs(config: Mapping[str, Any], target: str) -> list[str]:
    """What rules take as the target's input: its content, not the folder (``target_files.content_files``: config,
    tokenizer files, chat template, remote code and weight files; a new unrelated file changes nothing, weights
    rewritten in place are newer than every output), or a bundled target's files, the outputs of materialize_target
    (``target_files.MATERIALIZED_FILES`` under ``target``)."""
    if config["target"]["path"]:
        return target_files.content_files(target)
    return [f"{target}/{f}" for f in target_files.MATERIALIZED_FILES]


def check_target(config: Mapping[str, Any], target: str) -> str | None:
    """Refuse a ``target.path`` folder ``target`` that is no model folder (``target_files.target_dir_problem``); return
    what a build misses there that a plan does not, its weights (``target_files.target_weights_problem``), or None (a
    bundled target: its files are the outputs of materialize_target).

    Raises:
        PlanError: the folder is no model folder (the message names what is missing, or the snapshot to use).
    """
    if not config["target"]["path"]:
        return None
    problem = target_files.target_dir_problem(target)
    if problem:
        raise PlanError(problem)
    return target_files.target_weights_problem(target)


def check_weights(problem: str | None, rules: Iterable[str]) -> None:
    """Refuse a build of a target folder without weight files (``problem``: ``Plan.weights_problem``) whose planned jobs
    (their ``rules``) include one that reads them (``READS_TARGET_WEIGHTS``); called before the first job of a build
    (Snakemake's ``onstart``, never in a dry-run).

    Raises:
        PlanError: naming the folder, what it lacks and the rules that read the weights.
    """
    reading = sorted(READS_TARGET_WEIGHTS.intersection(rules))
    if problem and reading:
        raise PlanError(f"{problem}; the planned jobs of {', '.join(reading)} read them: nothing was run")


def file_sets(config: Mapping[str, Any]) -> list[str]:
    """The sets of ``benchmark.sets`` that read ``data.prompts_file`` (``PromptSet.needs``: ``custom``)."""
    return [name for name in config["benchmark"]["sets"] if prompt_sets.get(name).needs == "file"]


def prompts_file_input(config: Mapping[str, Any]) -> str | list:
    """``data.prompts_file`` where a set of the benchmark reads it, an input of the benchmark only (editing it reruns
    just the benchmark); else nothing."""
    return config["data"]["prompts_file"] if file_sets(config) else []


def check_sets(config: Mapping[str, Any]) -> None:
    """Refuse a benchmark set of the prompts file (``custom``) without ``data.prompts_file``, or the file without such a
    set (the file would be silently ignored, or the set would have no prompts), and a ``serve.check_set`` the benchmark
    does not run (``auto`` excepted: serve_check sends a set of benchmark.json).

    Raises:
        PlanError: naming both keys and their values.
    """
    sets, prompts_file = config["benchmark"]["sets"], config["data"]["prompts_file"]
    check_set = config["serve"]["check_set"]
    if bool(file_sets(config)) != bool(prompts_file):
        names = " or ".join(repr(n) for n, st in prompt_sets.SETS.items() if st.needs == "file")
        raise PlanError(f"config: benchmark.sets lists {names} exactly when data.prompts_file names a prompts JSONL; "
                        f"got benchmark.sets={sets} and data.prompts_file={prompts_file!r}")
    if check_set not in ("auto", *sets):
        raise PlanError(f"config: serve.check_set {check_set!r} is not in benchmark.sets {sets}: serve_check sends a "
                        "set the benchmark ran (or auto)")


def check_compare_heads(config: Mapping[str, Any], res: str) -> None:
    """Refuse ``benchmark.compare_heads`` whose names are not apart from the run's own head and from each other
    (``benchmark_runs.check_compare_names``; the benchmark checks them too) or that lists the run's own head folder
    ``<res>/head``; checked when planning, not after training.

    Raises:
        PlanError: naming the heads.
    """
    heads = config["benchmark"]["compare_heads"]
    try:
        benchmark_runs.check_compare_names(heads)
    except ValueError as e:
        raise PlanError(str(e)) from None
    if any(os.path.normpath(h["path"]) == f"{res}/head" for h in heads):
        raise PlanError(f"config: benchmark.compare_heads lists {res}/head, the run's own head, which runs anyway")


@dataclass(frozen=True)
class Drafts:
    """The draft heads of a run, resolved once at planning (``resolve_drafts``): ``own``, the run's (``choice.Draft``:
    ``draft.method``, its options, ``draft.layer``); ``compared``, each method of ``draft.compare_methods`` -> its
    draft (the run's layer where the method is built with it, else its own); ``method_heads``, their folders under
    ``<res>/methods/`` as the benchmark's compared heads (``[{"name", "path"}]``, served after
    ``benchmark.compare_heads``'); ``section``, the config's ``draft`` section they were resolved from."""

    section: Mapping[str, Any]
    own: Draft
    compared: Mapping[str, Draft]
    method_heads: tuple[Mapping[str, str], ...]

    @property
    def note(self) -> str | None:
        """One line for the plan where a compared head gets another layer than the run's (``choice.compare_note``)."""
        return choice.compare_note(self.own, tuple(self.compared.values()))

    def of(self, method: str) -> Draft:
        """The draft of a draft.compare_methods job of ``method`` (any method: a head asked for by its path is built
        too, though only the listed ones are benchmarked; ``choice.compare_draft``).

        Raises:
            choice.DraftError: ``method`` cannot be built.
        """
        return self.compared.get(method) or choice.compare_draft(self.section, self.own, method)

    def config_of(self, config: Mapping[str, Any], method: str) -> dict:
        """The workflow's ``config`` with ``draft.method`` set to ``method`` and ``draft.layer`` to the layer its head
        is built with (``of``): what a draft.compare_methods job of ``method`` reads (its params and settings)."""
        return {**config, "draft": {**config["draft"], "method": method, "layer": self.of(method).layer.name}}


def resolve_drafts(config: Mapping[str, Any], res: str, target_config: Mapping[str, Any] | None,
                   target: str = "the target") -> Drafts:
    """The run's ``Drafts``: the config's ``draft`` section resolved against the target's config.json
    (``target_config``; None: not readable at planning) named ``target`` in messages (``target.path /models/x``), the
    compared heads' folders under ``res`` (the run's results folder, ``results/<run>``).

    Raises:
        PlanError: a draft that cannot be built (the keys named: ``choice.DraftError``), a compared method that is the
            run's own or listed twice, or whose name or folder ``benchmark.compare_heads`` already uses.
    """
    section = config["draft"]
    try:
        own = choice.resolve(section, target_config, target)
        compared = {d.method.name: d for d in choice.compared(section, own)}
        heads = benchmark_runs.method_heads(res, section["method"], section["compare_methods"],
                                            config["benchmark"]["compare_heads"])
    except ValueError as e:  # choice.DraftError is one
        raise PlanError(str(e)) from None
    return Drafts(section, own, compared, tuple(heads))


def _read_head(folder: str, key: str, config: Mapping[str, Any], target_config: Mapping[str, Any] | None,
               target: str) -> GivenHead:
    """The head ``folder`` named by config ``key``, checked against the target (``given_head.target_problem``) and the
    run's ``draft.method`` and ``draft.layer`` (``given_head.draft_problem``).

    Raises:
        PlanError: its one line.
    """
    try:
        head = given_head.read(folder, key)
    except GivenHeadError as e:
        raise PlanError(str(e)) from None
    draft = config["draft"]
    problem = (given_head.target_problem(head, target_config, target)
               or given_head.draft_problem(head, draft["method"], draft["layer"]))
    if problem:
        raise PlanError(problem)
    return head


def meaningless_with_head(config: Mapping[str, Any]) -> list[str]:
    """The keys a given ``draft.head`` makes meaningless that ``config`` sets: ``draft.compare_methods`` (not empty:
    other heads trained from shards that are not captured) and each ``train.*`` key off its default (no head is
    trained), as ``key=value``."""
    out = [f"draft.compare_methods={config['draft']['compare_methods']}"] if config["draft"]["compare_methods"] else []
    return out + [f"{k.path}={config['train'][k.name]!r}" for k in section_keys("train")
                  if config["train"].get(k.name, k.default) != k.default]


def check_given_head(config: Mapping[str, Any], res: str, target_config: Mapping[str, Any] | None,
                     target: str = "the target") -> GivenHead | None:
    """The run's given head (config ``draft.head``), read and checked; None where the run trains its own. Its
    folder is not the run's own head folder ``<res>/head`` (export writes there), and no key it makes meaningless is
    set (``meaningless_with_head``).

    Raises:
        PlanError: one line: the keys named, or as ``_read_head``.
    """
    folder = config["draft"]["head"]
    if not folder:
        return None
    if os.path.normpath(folder) == os.path.normpath(f"{res}/head"):
        raise PlanError(f"config: draft.head {folder} is the run's own head folder, which export writes: give the "
                        "head's own folder")
    bad = meaningless_with_head(config)
    if bad:
        raise PlanError(f"config: draft.head {folder} is benchmarked and served as it is, no head is trained: "
                        f"{', '.join(bad)} would not apply; leave them out")
    return _read_head(folder, "draft.head", config, target_config, target)


def head_flags(head: GivenHead) -> dict[str, bool]:
    """The head flags (``head_format.HEAD_FLAGS``) of a given head's config.json (absent: False)."""
    return {f: bool(head.config.get(f, False)) for f in HEAD_FLAGS}


def check_init_from(config: Mapping[str, Any], target_config: Mapping[str, Any] | None,
                    target: str = "the target", res: str | None = None) -> GivenHead | None:
    """The head training starts from (config ``train.init_from``), read and checked as ``draft.head`` is, and against
    what training makes of the run's shards: the same aux layer ids (``capture.aux_layer_ids``; ``auto``: the
    ``draft.method``'s default for the target's layers, ``DraftMethod.default_aux_layer_ids``), draft vocabulary size
    (``vocab.draft_vocab_size``; the run trains on the head's own d2t/t2d) and head flags (a forced
    ``train.head_variant``'s); not beside ``draft.compare_methods``, nor inside the run's results folder ``res`` (its
    head and checkpoint are made from this training: a cycle). None where training starts from an untrained head.

    Raises:
        PlanError: one line naming both values and where each came from.
    """
    folder = config["train"]["init_from"]
    if not folder:
        return None
    if res and os.path.commonpath([os.path.abspath(folder), os.path.abspath(res)]) == os.path.abspath(res):
        raise PlanError(f"config: train.init_from {folder} is inside the run's results folder {res}, which this training "
                        "makes: copy the head elsewhere, or give it to a run of another name")
    if config["draft"]["compare_methods"]:
        raise PlanError(f"config: train.init_from {folder} beside draft.compare_methods "
                        f"{config['draft']['compare_methods']}: their heads would start from it too; leave one out")
    head = _read_head(folder, "train.init_from", config, target_config, target)
    where = f"train.init_from {folder}"
    n = num_decoder_layers(dict(target_config)) if target_config else None
    requested = config["capture"]["aux_layer_ids"]
    method = methods.get(config["draft"]["method"])
    ours = (method.default_aux_layer_ids(n) if n and n >= 3 else None) if requested == "auto" else list(requested)
    theirs = head.aux_ids_for(n)
    if ours is not None and theirs is not None and ours != theirs:
        raise PlanError(f"{where} reads aux layers {theirs} ({folder}/config.json) but capture.aux_layer_ids "
                        f"{requested} captures {ours}: set capture.aux_layer_ids: {theirs}")
    if head.draft_vocab_size != config["vocab"]["draft_vocab_size"]:
        raise PlanError(f"{where} has a draft vocabulary of {head.draft_vocab_size} tokens ({folder}/config.json "
                        f"draft_vocab_size) but vocab.draft_vocab_size is {config['vocab']['draft_vocab_size']}: set it "
                        f"to {head.draft_vocab_size} (training keeps the head's d2t/t2d)")
    variant = config["train"]["head_variant"]
    if variant != "auto" and HEAD_VARIANTS[variant] != head_flags(head):
        raise PlanError(f"{where} has the head flags {head_flags(head)} ({folder}/config.json) but train.head_variant "
                        f"{variant} sets {HEAD_VARIANTS[variant]}: use auto (the head's)")
    return head


def preflight_enabled(config: Mapping[str, Any]) -> bool:
    """Whether the plan has the pre-flight bound (``preflight.enabled``): ``always``, or ``auto`` where the serve jobs
    get GPUs (``resources.serve.gpu`` > 0: the bound is a GPU job, and the benchmark then checks its measured steps
    against it); ``never`` not."""
    enabled = config["preflight"]["enabled"]
    return enabled == "always" or (enabled == "auto" and config["resources"]["serve"]["gpu"] > 0)


def capture_may_use_vllm(config: Mapping[str, Any], decisions: Mapping[str, Any] | None) -> bool:
    """Whether a capture job may start vLLM (its engine layout, its retry with more memory): ``capture.backend`` vllm,
    or ``auto`` until the compat report has chosen hooks (``decisions``: decisions.json as recorded, None before the
    first report)."""
    backend = config["capture"]["backend"]
    recorded = ((decisions or {}).get("capture") or {}).get("backend")
    return (recorded if backend == "auto" and recorded else backend) != "hooks"


def job_gpus(config: Mapping[str, Any], job: str) -> int:
    """The GPUs a job of resources section ``job`` asks for (``resources.<job>.gpu``; a section without one: 0)."""
    return config["resources"][job].get("gpu") or 0


def gpu_model_resources(config: Mapping[str, Any], job: str | None) -> dict[str, str]:
    """``gpu_model`` (``resources.gpu_model``) for a job of resources section ``job`` that asks for GPUs: cluster
    executors read it (SLURM: ``--gpus=<model>:<n>``); nothing for a CPU job (``job`` None, or no GPU) or an unset
    model."""
    model = config["resources"]["gpu_model"]
    return {"gpu_model": model} if model and job and job_gpus(config, job) > 0 else {}


def engine_layout_resources(config: Mapping[str, Any], job: str, starts_engine: bool = True) -> dict[str, int]:
    """The layout of the vLLM engine a job of resources section ``job`` starts (``engine_args.engine_layout`` of its
    GPUs and ``target.pipeline_parallel_size``, as ``engine_args`` lays the job's engine out), as resources the dry-run
    shows beside its ``gpu``; nothing where the job starts no engine. No ``--resources`` limit names them and they are
    no params: they replan nothing."""
    if not starts_engine:
        return {}
    return engine_layout(job_gpus(config, job), config["target"]["pipeline_parallel_size"])


# export_head's resources where its vLLM load check is off (export.vllm_load_check: never): a small CPU job.
EXPORT_CPU_RESOURCES = {"gpu": 0, "threads": 1, "mem_mb": 4000, "runtime": 30}


def export_loads_in_vllm(config: Mapping[str, Any]) -> bool:
    """Whether export_head's vLLM load check may run (``export.vllm_load_check`` other than ``never``): the job then
    serves the target as the benchmark does."""
    return config["export"]["vllm_load_check"] != "never"


def export_resources(config: Mapping[str, Any]) -> dict[str, int]:
    """export_head's ``gpu``, ``threads``, ``mem_mb`` (MB) and ``runtime`` (minutes): the serve job's
    (``resources.serve``; no ``gpu``: 0) while its vLLM load check may run, else ``EXPORT_CPU_RESOURCES``."""
    if not export_loads_in_vllm(config):
        return dict(EXPORT_CPU_RESOURCES)
    serve = config["resources"]["serve"]
    return {k: serve.get(k, 0) for k in EXPORT_CPU_RESOURCES}


@dataclass(frozen=True)
class Plan:
    """What rules/common.smk reads of the planning policy, made once a parse (``Plan.of``): ``target``, the target's
    folder; ``weights_problem``, what a build misses in it (``check_target``; the plan warns, ``check_weights``
    refuses a build that reads them); ``drafts`` (``Drafts``); ``preflight``, ``capture_vllm``, ``export_vllm``: the
    switches above; ``export_resources``; ``given_head``, the run's head where config ``draft.head`` gives one (None:
    trained here); ``init_head``, where ``train.init_from`` names one."""

    target: str
    weights_problem: str | None
    drafts: Drafts
    preflight: bool
    capture_vllm: bool
    export_vllm: bool
    export_resources: Mapping[str, int]
    given_head: GivenHead | None = None
    init_head: GivenHead | None = None

    @classmethod
    def of(cls, config: Mapping[str, Any], res: str, decisions: Mapping[str, Any] | None = None) -> Plan:
        """The plan of the workflow's ``config`` (validated against its schema) for the run's results folder ``res``
        (``results/<run>``), ``decisions`` the compat report's as recorded (None before the first). Checks, in this
        order: the target folder, the benchmark's sets, the compared heads, the target's quantization method
        (``formats.quantization.refusal``), the aux layer ids against the target's
        config.json (a bundled target's known fields before it is materialised: ``target_files.planning_config``),
        the drafts, the given head (``check_given_head``), the head training starts from (``check_init_from``).

        Raises:
            PlanError: the first check that fails (its one line).
        """
        target = target_folder(config)
        weights = check_target(config, target)
        check_sets(config)
        check_compare_heads(config, res)
        bundled = None if config["target"]["path"] else config["target"]["bundled"]
        target_config, name = target_files.planning_config(target, bundled)
        problem = quantization.refusal(target_config or {}, name)  # a scheme no route here reads (issue 74)
        if problem:
            raise PlanError(problem)
        problem = aux_layer_ids_problem(methods.get(config["draft"]["method"]), config["capture"]["aux_layer_ids"],
                                        target_config, name)
        if problem:
            raise PlanError(problem)
        drafts = resolve_drafts(config, res, target_config, name)
        given = check_given_head(config, res, target_config, name)
        init = check_init_from(config, target_config, name, res)
        return cls(target, weights, drafts, preflight_enabled(config), capture_may_use_vllm(config, decisions),
                   export_loads_in_vllm(config), export_resources(config), given, init)

    def head_inputs(self, decisions_json: str) -> HeadInputs:
        """The rules' inputs that a given head decides (``HeadInputs``), the compat report's ``decisions_json``
        (``results/<run>/decisions.json``) among them. Plain paths, known when parsing, not input functions: the
        deleted-intermediate check (workflow.missing) reads the rules' plain paths."""
        g, i = self.given_head, self.init_head
        return HeadInputs(compat_config=g.files[:1] if g else [], given=g.files if g else [],
                          given_decisions=[decisions_json] if g else [], init_from=i.files if i else [])


@dataclass(frozen=True)
class HeadInputs:
    """What a head the user brings adds to the rules' inputs (``Plan.head_inputs``; empty lists where none is given):
    ``compat_config``, the given head's config.json (compat_report's ``given_head``: the report checks it);
    ``given``, its files, and ``given_decisions``, the report that checked it (export_head's ``given`` and
    ``decisions``, in place of the checkpoint and vocab map: ``trained``); ``init_from``, the files of the head
    training starts from (build_vocab_map's and train_draft's ``init_from``)."""

    compat_config: list[str]
    given: list[str]
    given_decisions: list[str]
    init_from: list[str]

    def trained(self, path: str) -> str | list[str]:
        """An input of export_head made by training (``path``), or nothing where draft.head gives the head (then
        capture, the vocab map and training are unplanned: nothing asks for them)."""
        return [] if self.given else path

# The rules whose jobs need the run's benchmark.json (rules/benchmark.smk and the rules below it): asking for one of
# them, or for one of their files, plans the benchmark.
BENCHMARK_RULES = ("all", "benchmark", "plot_benchmark", "serve_config", "serve_check")
# The files of those rules under results/<run>/ (rules/benchmark.smk, plot_benchmark.smk, serve_config.smk,
# serve_check.smk).
BENCHMARK_FILES = ("benchmark.json", "report/benchmark.png", "serve/serve.yaml", "serve/serve.env", "serve/serve.sh",
                   "serve/serving.json", "serve/serve_check.json")


def benchmark_in_plan(targets: Iterable[str], res: str, until: Iterable[str] = (), omit_from: Iterable[str] = (),
                      target_jobs: Iterable[str] = ()) -> str | None:
    """The run's benchmark file (``<res>/benchmark.json``) where the plan asked for by ``targets`` (Snakemake's targets:
    rule names or file paths, relative to the working directory) and ``target_jobs`` (``--target-jobs`` specs,
    ``rule:wildcards``: how a cluster job's own Snakemake is given its one job) builds it, else None. Neither given:
    the default target, rule ``all``, which does. A plan cut by ``--until`` or ``--omit-from`` is taken not to (a
    head exported there is checked by itself).

    ``res``: the run's results folder (``results/<run>``).
    """
    if tuple(until) or tuple(omit_from):
        return None
    wanted = {os.path.normpath(os.path.join(res, f)) for f in BENCHMARK_FILES}
    asked = set(targets) | {str(j).split(":", 1)[0] for j in target_jobs}
    if not asked or any(t in BENCHMARK_RULES or os.path.normpath(t) in wanted for t in asked):
        return os.path.join(res, "benchmark.json")
    return None


def aux_layer_ids_problem(method: methods.DraftMethod, aux_layer_ids: str | list[int],
                          target_config: Mapping[str, Any] | None, target: str = "the target") -> str | None:
    """Why the config's ``capture.aux_layer_ids`` (``auto`` or a list) cannot be captured for a head of draft
    ``method`` from a target whose config.json is ``target_config`` (a dict; None: not readable at planning, checked
    by the compat report), as one line naming the key and ``target`` (``target.path /models/x``); None where they can
    (``auto``: three distinct layers for any target of 3 layers or more, ``DraftMethod.default_aux_layer_ids``)."""
    n = num_decoder_layers(dict(target_config)) if target_config else None
    if n is None:
        return None
    try:
        if aux_layer_ids == "auto":
            method.default_aux_layer_ids(n)
        else:
            method.check_aux_layer_ids(list(aux_layer_ids), n)
    except ValueError as e:
        return f"config: {e} ({target}: {n} decoder layers in its config.json)"
    return None



def check_rules(rules: Any, contracts: Mapping[str, Contract] = CONTRACTS) -> None:
    """Each stage rule's named inputs, and each derived rule's (``contract.STAGE_OF_RULE``: a derived rule restates its
    stage's), are those of its stage's contract (in ``contracts``); each rule with an entry names the outputs and params
    its settings object's fields read (``job_fields.rule_problems``). ``rules``: Snakemake's ``rules`` namespace,
    duck-typed (``getattr(rules, name).input``, ``.output``, ``.params``: named lists); the Snakefile calls it at every
    parse.

    Raises:
        ValueError: a rule's inputs differ from its contract's, or it lacks what its settings object reads (named).
    """
    for name in [*contracts, *STAGE_OF_RULE]:
        expected = contracts[stage_of(name)].inputs
        names = set(getattr(rules, name).input.keys())
        if names != set(expected):
            raise ValueError(f"the inputs of {name}, {sorted(names)}, are not its contract's {sorted(expected)}")
    problems = [p for name in [*CONTRACTS, *STAGE_OF_RULE, *RULE_ENTRIES]
                for p in rule_problems(name, job_entry(name), getattr(rules, name).output.keys(),
                                       getattr(rules, name).params.keys())]
    if problems:
        raise ValueError("; ".join(problems))
