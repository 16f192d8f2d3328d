"""One contract per stage: what reaches it, through which channel, and what it makes.

``CONTRACTS[stage]`` (a ``Contract``) declares, for each workflow stage (one Snakemake rule,
``rules/<stage>.smk`` and ``eagle3build/<group>/<stage>.py``; every rule's ``script:`` is the one adapter,
scripts/run_stage.py):

- ``inputs``: the names of the rule's input files (``plan.check_rules`` checks each rule against them
  when the workflow is parsed);
- ``params``: the rule's rerun-trigger params (``Param``: a name, the config keys its value is made
  from, the function that makes it), which rules/common.smk builds (``stage_params``, ``param_value``);
  their keys are the stage's
  ``triggers``: a change to one plans the stage again;
- ``runtime``: the config keys the job reads at run time only (threads, memory, GPUs, the offline
  switch, sizes for a disk check): never params, so a change plans nothing;
- ``files``: the config keys that decide which files the stage reads or writes (the run's folder,
  the target's path, the data files, the number of shards): a change plans it through its files
  (a key may be a file key and runtime too: capture reads its split's size for a disk check);
- ``decisions``: the fields of decisions.json it reads (dotted), ``packages``: the libraries whose
  versions shape its output (the rule's ``version`` param, with ``output_version``);
- ``entry``: the library function the adapter calls (``module:function``, of the stage's module), with one object of
  ``settings``, the stage's settings class (``module:Class``, beside it: its config fields made from the key table,
  ``config.settings``), whose own fields (files, GPUs, what planning or the report decided) come from the job as
  ``from_job`` says (``workflow.job_fields``: ``{"out_json": "outputs.json", "gpus": "resources.gpu?"}``);
  ``eagle3build.workflow.job.run_stage`` makes the object and calls the entry.

The config keys of ``params``, ``runtime`` and ``files`` are not listed here: each key's declaration in
eagle3build.config.spec names the stages it reaches and its role there, and ``build_contracts`` makes the
contracts from them and the ``STAGES`` (inputs, computed params, decisions, packages, entry).

Config keys are dotted paths into config.yaml (``data.regenerate.max_tokens``). A key may be a
trigger of one stage and read at run time by another (``data.max_seq_len``: prepare_data tokenizes
to it, the compat report's disk plan multiplies by it), never both for one stage
(tests/test_contract.py: every key of schemas/config.schema.yaml is in some stage's contract, and
no stage has a key as trigger and runtime-only).

The job gets its settings as one ``StageSettings`` (``job_settings``): the values, from the workflow's
config, of its trigger and runtime keys and no others (the adapters read no ``snakemake.config``);
the trigger params only decide staleness. The jobs that build a draft head (train_draft, preflight_bound) also get
the draft planning resolved from the ``draft`` keys (eagle3build.draft.choice), as a derived ``draft`` param. Planning
imports this module (no torch).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..config.settings import declared
from ..config.spec import KEYS, ROLES, Key
from ..draft import methods
from ..formats.target_files import num_aux_layers
from .job_fields import JobEntry, JobField
from .staleness import canonical_request, package_versions


@dataclass(frozen=True)
class PlanContext:
    """What a param may read besides the config, at planning time (rules/common.smk): the ``stage``, the
    ``decisions`` recorded by an earlier compat report (decisions.json as a dict, None before the first),
    ``job_env`` (the jobs' conda environment's digest, ``staleness.env_digest``, or None: the planner's
    environment) and ``regenerated`` (the path of regenerate_responses' answers, results/<run>/data/)."""

    stage: str
    decisions: Mapping[str, Any] | None = None
    job_env: Mapping[str, Any] | None = None
    regenerated: str = ""


def value(values: Mapping[str, Any], ctx: PlanContext) -> Any:
    """The one key's value (mappings with sorted keys: ``config_value``)."""
    (v,) = values.values()
    return v


def section(values: Mapping[str, Any], ctx: PlanContext) -> dict:
    """The keys as one mapping by their last part, sorted (``canonical``)."""
    return canonical({k.rsplit(".", 1)[-1]: v for k, v in values.items()})


@dataclass(frozen=True)
class NamedSection:
    """``section`` with some keys named otherwise than by their last part: ``names``, (path, name) pairs
    (config.spec's ``trigger:<param>/<name>``: a key renamed keeps its name in the param, so no build replans),
    and some left out while they hold their default: ``quiet``, (path, default) pairs (config.spec's
    ``Key.quiet_default``: a key added keeps the param of a build that does not set it, so none replans)."""

    names: tuple[tuple[str, str], ...] = ()
    quiet: tuple[tuple[str, Any], ...] = ()
    only_with: tuple[tuple[str, tuple[str, Any]], ...] = ()  # (path, Key.only_with): left out where it does not hold

    @property
    def __name__(self) -> str:
        return "section"

    def __call__(self, values: Mapping[str, Any], ctx: PlanContext) -> dict:
        names, quiet = dict(self.names), dict(self.quiet)
        idle = {k for k, (path, want) in self.only_with if not _holds(values.get(path), want)}
        return canonical({names.get(k, k.rsplit(".", 1)[-1]): v for k, v in values.items()
                          if not (k in quiet and v == quiet[k]) and k not in idle})


def _holds(value: Any, want: Any) -> bool:
    """Whether a config value holds ``want``: a list containing it, or a value equal to it (``Key.only_with``)."""
    return want in value if isinstance(value, (list, tuple)) else value == want


def requested(values: Mapping[str, Any], ctx: PlanContext) -> Any:
    """A setting that may be ``auto`` (``capture.backend``, ``capture.aux_layer_ids``), as requested: writing
    down what ``auto`` chose is no change (``staleness.canonical_request`` against ``ctx.decisions``)."""
    ((key, v),) = values.items()
    return canonical_request(v, ctx.decisions, key.rsplit(".", 1)[-1])


def version(values: Mapping[str, Any], ctx: PlanContext) -> dict:
    """The stage's ``OUTPUT_VERSION`` and, unless ``staleness.track_package_versions`` is false, its packages'
    versions or the jobs' environment (``stage_version``); where the stage's version also reads ``draft.layer``
    (export_head), what that layer adds (``DraftLayer.version_param``: the MLA layer's format version as
    ``layer_format``; nothing for the default layer, whose builds keep their param)."""
    track = values.get("staleness.track_package_versions", declared("staleness.track_package_versions"))
    out = stage_version(ctx.stage, track, ctx.job_env)
    return {**out, **methods.get_layer(values.get("draft.layer", methods.DEFAULT_LAYER)).version_param()}


def prepare_sources(values: Mapping[str, Any], ctx: PlanContext) -> list[dict]:
    """prepare_data's sources: ``data.sources``, or the regenerated answers (``ctx.regenerated``) where
    ``data.regenerate.enabled``."""
    if values["data.regenerate.enabled"]:
        return [{"max_samples": None, "path": ctx.regenerated}]
    return values["data.sources"]


def num_aux_layers_param(values: Mapping[str, Any], ctx: PlanContext) -> int:
    """``num_aux_layers`` of ``capture.aux_layer_ids``."""
    return num_aux_layers(values["capture.aux_layer_ids"])


def require_eval_param(values: Mapping[str, Any], ctx: PlanContext) -> bool:
    """``require_eval`` of ``capture.num_eval_samples``."""
    return require_eval(values["capture.num_eval_samples"])


def online_param(values: Mapping[str, Any], ctx: PlanContext) -> dict | None:
    """``online_capture`` of ``capture.mode``, the sample counts, ``capture.storage_dtype``,
    ``capture.tokens_per_batch`` and ``capture.compute_dtype``."""
    return online_capture(values["capture.mode"], values["capture.num_train_samples"],
                          values["capture.num_eval_samples"], values["capture.storage_dtype"],
                          values["capture.tokens_per_batch"], values["capture.compute_dtype"])


@dataclass(frozen=True)
class Param:
    """One rerun-trigger param of a rule: ``name``, made from config ``keys`` by ``make``.

    ``make(values, ctx)``: ``values`` maps each of ``keys`` to its config value (``config_value``), ``ctx``
    is the ``PlanContext``; returns the param's value (``value``, ``section``, ``requested``, ``version``,
    ``prepare_sources``, ``num_aux_layers_param``, ``require_eval_param``, ``online_param``). Snakemake
    compares the values: a change plans the stage again.
    """

    name: str
    keys: tuple[str, ...]
    make: Callable[[Mapping[str, Any], PlanContext], Any] = value


def param_value(param: Param, config: Mapping[str, Any], ctx: PlanContext) -> Any:
    """``param``'s value for ``config`` (the workflow's config dict) in ``ctx``.

    Raises:
        KeyError: ``config`` lacks one of the param's keys.
    """
    return param.make({k: config_value(config, k) for k in param.keys}, ctx)


@dataclass(frozen=True)
class Contract:
    """A stage's contract (see the module docstring); the tuples of strings are config keys."""

    stage: str
    group: str
    inputs: tuple[str, ...]
    params: tuple[Param, ...]
    runtime: tuple[str, ...]
    files: tuple[str, ...]
    decisions: tuple[str, ...]
    packages: tuple[str, ...]
    entry: str
    settings: str = ""
    from_job: Mapping[str, JobField] = field(default_factory=dict)

    @property
    def job(self) -> JobEntry:
        """What the adapter calls for a job of the stage (``job_fields.JobEntry``)."""
        return JobEntry(self.entry, self.settings, self.from_job)

    @property
    def triggers(self) -> tuple[str, ...]:
        """The config keys of the params, in order, each once."""
        return tuple(dict.fromkeys(k for p in self.params for k in p.keys))


@dataclass(frozen=True)
class Stage:
    """What a stage's contract declares beside its config keys (which eagle3build.config.spec declares, with the
    stages each reaches): ``computed``, its params whose value a function makes from their keys (``version``,
    ``requested``, ...; a param's keys are the config keys of role ``trigger:<name>`` for the stage, none for
    ``version`` of a stage without packages); ``entry`` and ``settings``: a function and a class of the stage's
    module, by name; ``from_job``: field name -> source (``job_fields.JobField.parse``); the rest as ``Contract``."""

    stage: str
    group: str
    inputs: tuple[str, ...]
    computed: Mapping[str, Callable[[Mapping[str, Any], PlanContext], Any]]
    decisions: tuple[str, ...]
    packages: tuple[str, ...]
    entry: str
    settings: str
    from_job: Mapping[str, str]

    @property
    def module(self) -> str:
        """The stage's module, ``eagle3build.<group>.<stage>``."""
        return f"eagle3build.{self.group}.{self.stage}"


# Where the settings objects' own fields come from, shared by several stages (job_fields.JobField).
TARGET_DIR = {"target_dir": "params.target_dir"}
GPUS = {"gpus": "resources.gpu?"}

STAGES: tuple[Stage, ...] = (
    # The bundled target, dequantised once: a build made from it stays consistent with it after an
    # upgrade, and re-materialising would rewrite 270 MB of weights and replan every stage (no packages).
    Stage("materialize_target", "compat", inputs=(), computed={"version": version}, decisions=(), packages=(),
          entry="materialize_target", settings="MaterializeSettings",
          from_job={"name": "wildcards.name", "out_dir": "params.out_dir"}),
    # The disk and GPU plans are read at run time: growing the sample count or changing resources must
    # not re-run the report and, behind it, every shard. Backend and aux ids reach the params as
    # requested (staleness.canonical_request); the job reads them as configured.
    # A given head (draft.head): its config.json is an input (checked against the target; a changed weight replans
    # export, not this report: export checks the tensors).
    Stage("compat_report", "compat", inputs=("target", "given_head"),
          computed={"backend": requested, "aux_layer_ids": requested, "version": version}, decisions=(), packages=(),
          entry="compat_report", settings="CompatSettings",
          from_job={**TARGET_DIR, "results_dir": "params.results_dir", "out_json": "outputs.json",
                    "out_decisions": "outputs.decisions", "given_head": "inputs.given_head?"}),
    Stage("regenerate_responses", "data", inputs=("target", "sources"), computed={"version": version},
          decisions=(), packages=("vllm",), entry="regenerate", settings="RegenerateSettings",
          from_job={**TARGET_DIR, "out_jsonl": "outputs.jsonl", "out_report": "outputs.report", **GPUS}),
    # Tokenization and chat-template rendering; the regenerated answers replace data.sources when enabled.
    Stage("prepare_data", "data", inputs=("target", "regenerated", "sources"),
          computed={"version": version, "sources": prepare_sources, "num_aux_layers": num_aux_layers_param,
                    "require_eval": require_eval_param},
          decisions=(), packages=("tokenizers", "transformers"), entry="prepare", settings="PrepareSettings",
          from_job={**TARGET_DIR, "sources": "params.sources", "out_train": "outputs.train", "out_eval": "outputs.eval",
                    "out_prompts": "outputs.prompts", "out_report": "outputs.report",
                    "num_aux_layers": "params.num_aux_layers", "require_eval": "params.require_eval",
                    "workers": "resources.threads?"}),
    # One shard per job: the sample counts and the shard size decide which shards exist (a shard's
    # range is its param), and the job reads the split's size for its disk check. Aux ids and backend
    # are triggers only: the job reads what the report decided.
    # The job hands its shard to a capture host that keeps the target loaded for the next (HOSTED, workflow/host.py).
    Stage("capture_hidden_states", "capture", inputs=("decisions", "tokens"),
          computed={"aux_layer_ids": requested, "backend": requested, "version": version},
          decisions=("target.fingerprint", "capture.aux_layer_ids", "capture.backend"),
          packages=("torch", "transformers"), entry="capture_shard", settings="CaptureSettings",
          from_job={**TARGET_DIR, "tokens_path": "inputs.tokens", "out_path": "outputs.shard",
                    "start": "params.shard.start", "count": "params.shard.num_samples", "split": "wildcards.split",
                    "aux_layer_ids": "decisions.capture.aux_layer_ids",
                    "target_fingerprint": "decisions.target.fingerprint", "backend": "decisions.capture.backend",
                    **GPUS}),
    # speculators' build_vocab_mappings_from_distribution runs on torch
    # train.init_from: the head's own d2t/t2d, its files the stage's inputs.
    Stage("build_vocab_map", "train", inputs=("tokens", "decisions", "init_from"), computed={"version": version},
          decisions=("target.vocab_size",), packages=("speculators", "torch"), entry="build_vocab_map",
          settings="VocabSettings",
          from_job={"tokens_path": "inputs.tokens", "target_vocab_size": "decisions.target.vocab_size",
                    "out_d2t": "outputs.d2t", "out_t2d": "outputs.t2d", "out_json": "outputs.info",
                    "init_head": "inputs.init_from?"}),
    # Online (capture.mode), the states are made in this stage: what shapes them (sample counts, storage
    # and compute dtypes, batching) becomes its trigger; offline the shards carry them. Its inputs are
    # then the tokens files instead of the shards (rules/common.smk, states_input).
    # train.init_from: the head's files are inputs (a changed weight retrains); the path is in the train param.
    Stage("train_draft", "train", inputs=("decisions", "train", "eval", "d2t", "t2d", "vocab", "target", "init_from"),
          computed={"aux_layer_ids": requested, "version": version, "online": online_param},
          decisions=("target.fingerprint", "capture.aux_layer_ids", "head.recommended_variant", "capture.backend"),
          packages=("speculators", "torch"), entry="train_draft", settings="TrainSettings",
          from_job={**TARGET_DIR, "out_dir": "params.out_dir", "train_files": "inputs.train",
                    "eval_files": "inputs.eval", "d2t_path": "inputs.d2t", "t2d_path": "inputs.t2d",
                    "vocab_json": "inputs.vocab", "decisions_json": "inputs.decisions", "draft": "params.draft",
                    **GPUS}),
    # A given head (draft.head): its files are the inputs in place of the checkpoint and vocab map (taken as it is, or
    # converted by speculators' converter), and the decisions of the compat report that checked it; a changed weight
    # replans it and what follows.
    Stage("export_head", "serve", inputs=("checkpoint", "d2t", "t2d", "vocab", "target", "given", "decisions"),
          computed={"version": version}, decisions=(), packages=("speculators", "torch"), entry="export",
          settings="ExportSettings",
          from_job={**TARGET_DIR, "checkpoint_dir": "params.checkpoint_dir?", "d2t_path": "inputs.d2t?",
                    "t2d_path": "inputs.t2d?", "vocab_json": "inputs.vocab?", "out_dir": "params.out_dir", **GPUS,
                    "benchmarked_by": "params.benchmarked_by?", "given_files": "inputs.given?"}),
    Stage("benchmark", "serve",
          inputs=("head", "head_config", "prompts", "custom_prompts", "compare_heads", "preflight", "target"),
          computed={"version": version}, decisions=(), packages=("vllm",), entry="benchmark",
          settings="BenchmarkSettings",
          from_job={**TARGET_DIR, "head_dir": "params.head_dir", "prompts_path": "inputs.prompts",
                    "out_json": "outputs.json", **GPUS, "custom_prompts_path": "inputs.custom_prompts?",
                    "preflight_path": "inputs.preflight?", "method_heads": "params.method_heads?"}),
    # Before training: vLLM engines on the serve job's GPUs time the target's verification steps alone and with an
    # untrained head (decisions.json: its aux layer ids and variant).
    Stage("preflight_bound", "compat", inputs=("target", "decisions"), computed={"version": version},
          decisions=("capture.aux_layer_ids", "head.recommended_variant"), packages=("vllm", "torch", "speculators"),
          entry="preflight", settings="PreflightSettings",
          from_job={**TARGET_DIR, "out_json": "outputs.json", "decisions_json": "inputs.decisions", **GPUS,
                    "draft": "params.draft"}),
    Stage("plot_benchmark", "serve", inputs=("benchmark",), computed={"version": version}, decisions=(),
          packages=("matplotlib",), entry="plot_benchmark", settings="PlotSettings",
          from_job={"benchmark_json": "inputs.benchmark", "out_png": "outputs.png"}),
    # The serving files (results/<run>/serve/): the head behind vLLM's OpenAI-compatible server at the benchmark's
    # choice of k, on the serve section's layout. vLLM's version decides which server options the file may name.
    Stage("serve_config", "serve", inputs=("head", "head_config", "benchmark", "target"), computed={"version": version},
          decisions=(), packages=("vllm",), entry="serve_config", settings="ServeConfigSettings",
          from_job={**TARGET_DIR, "head_dir": "params.head_dir", "benchmark_json": "inputs.benchmark",
                    "out_dir": "params.out_dir"}),
    # The server started from those files, the benchmark's prompts sent through it with the openai client.
    Stage("serve_check", "serve",
          inputs=("serve_yaml", "serve_env", "serving", "benchmark", "prompts", "custom_prompts", "target"),
          computed={"version": version}, decisions=(), packages=("vllm", "openai"), entry="serve_check",
          settings="CheckSettings",
          from_job={"serve_dir": "params.serve_dir", "benchmark_path": "inputs.benchmark",
                    "prompts_path": "inputs.prompts",
                    "custom_prompts_path": "inputs.custom_prompts?", "out_json": "outputs.json",
                    "server_log": "params.server_log"}),
)


def build_contracts(stages: tuple[Stage, ...] = STAGES, keys: tuple[Key, ...] = KEYS) -> dict[str, Contract]:
    """Each stage's ``Contract`` from its ``Stage`` and the config keys' declarations (``spec.Key.uses``):
    a computed param per ``Stage.computed`` entry, with the keys of role ``trigger:<its name>``; a ``value``
    param per other key of role ``trigger`` (named by its last part) or alone in a ``trigger:<name>``; a
    ``section`` param per ``trigger:<name>`` of several keys; ``runtime`` and ``files`` the keys of those roles.

    Raises:
        ValueError: a key reaches a stage that is not one, has a role that is not one, or two keys of role
            ``trigger`` of one stage share their last part; a ``from_job`` source is malformed, or names an input
            the stage lacks or a decisions field it does not declare (``job_fields.JobEntry.problems``).
    """
    names = {st.stage for st in stages}
    for k in keys:
        for stage in k.uses:
            if stage not in names:
                raise ValueError(f"config key {k.path} reaches {stage!r}, which is not a stage")
            bad = [r for r in k.roles(stage) if r.split(":", 1)[0] not in ROLES]
            if bad:
                raise ValueError(f"config key {k.path}: roles {bad} for {stage} are not among {list(ROLES)}")
    out = {}
    for st in stages:
        groups: dict[str, list[str]] = {}
        renamed: dict[str, list[tuple[str, str]]] = {}
        quiet: dict[str, list[tuple[str, Any]]] = {}
        cond: dict[str, list[tuple[str, tuple[str, Any]]]] = {}
        for k in keys:
            found = k.trigger_param(st.stage)
            if found is None:
                continue
            name, given, key_name = found
            if not given and name in groups:
                raise ValueError(f"{st.stage}: two trigger keys named {name!r}: {groups[name][0]} and {k.path}")
            groups.setdefault(name, []).append(k.path)
            if key_name != k.name:
                renamed.setdefault(name, []).append((k.path, key_name))
            if k.quiet_default:
                quiet.setdefault(name, []).append((k.path, k.default))
            if k.only_with:
                cond.setdefault(name, []).append((k.path, k.only_with))
        params = [Param(name, tuple(groups.pop(name, ())), make) for name, make in st.computed.items()]
        for name, ks in groups.items():
            if len(ks) == 1 and name not in quiet and name not in cond:
                make = value
            elif name in renamed or name in quiet or name in cond:
                make = NamedSection(tuple(renamed.get(name, ())), tuple(quiet.get(name, ())), tuple(cond.get(name, ())))
            else:
                make = section
            params.append(Param(name, tuple(ks), make))
        job = JobEntry.of(f"{st.module}:{st.entry}", f"{st.module}:{st.settings}", st.from_job)
        bad = job.problems(st.inputs, st.decisions)
        if bad:
            raise ValueError(f"{st.stage}'s from_job: " + "; ".join(bad))
        out[st.stage] = Contract(
            st.stage, st.group, st.inputs, tuple(params),
            runtime=tuple(k.path for k in keys if "runtime" in k.roles(st.stage)),
            files=tuple(k.path for k in keys if "files" in k.roles(st.stage)),
            decisions=st.decisions, packages=st.packages, entry=job.entry, settings=job.settings,
            from_job=job.from_job)
    return out


CONTRACTS: dict[str, Contract] = build_contracts()

# Each stage's subpackage: the stage module is eagle3build/<group>/<stage>.py, beside its
# private modules (docs/layout.md); the rule is rules/<stage>.smk; its entry, a function of the module taking its
# settings object.
STAGE_GROUPS: dict[str, str] = {s: c.group for s, c in CONTRACTS.items()}

# The libraries whose versions shape each stage's output bytes (rules' `version` param). A stage's OUTPUT_VERSION
# covers the modules it uses too, shared (tokens.py, conversations.py, shards.py, head_format.py, vocab_map.py, ...)
# and private (data/chat_masking.py, train/trainer.py, ...; tests/test_layers.py keeps stages from importing each
# other): a change to a module that alters a stage's output bytes bumps that stage's OUTPUT_VERSION (and that of
# every other stage whose bytes it alters); tests/test_e2e.py's digest test catches a forgotten bump.
STAGE_PACKAGES: dict[str, tuple[str, ...]] = {s: c.packages for s, c in CONTRACTS.items()}

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # eagle3build/
_VERSION_LINE = re.compile(r"^OUTPUT_VERSION\s*=\s*(\d+)\s*(?:#.*)?$", re.M)


@functools.cache
def output_version(stage: str) -> int:
    """``OUTPUT_VERSION`` of stage module ``eagle3build/<group>/<stage>.py`` (group: ``STAGE_GROUPS``). A change
    to a stage, or to a shared module it uses, that alters its output bytes bumps it; a refactor that changes no
    bytes does not, and rebuilds nothing (tests/test_e2e.py's digest test holds this). Read from the module's source
    text, not by importing it: planning must not import torch (seconds, and once per Snakemake process).

    Raises:
        KeyError: ``stage`` is not a stage.
        FileNotFoundError: the stage module is missing.
        ValueError: the module has no ``OUTPUT_VERSION = <int>`` line at top level.
    """
    path = _PACKAGE_DIR / STAGE_GROUPS[stage] / f"{stage}.py"
    m = _VERSION_LINE.search(path.read_text())
    if m is None:
        raise ValueError(f"{path}: no top-level 'OUTPUT_VERSION = <int>' line (every stage module has one)")
    return int(m.group(1))


def stage_version(stage: str, track_packages: bool = True, job_env: dict | None = None) -> dict:
    """What a stage's rule carries in its ``version`` param: ``{"output": OUTPUT_VERSION,
    "packages": {name: version}}`` (packages from ``STAGE_PACKAGES``, their versions
    ``staleness.package_versions``; ``{}`` when not tracked or none).

    ``job_env``: where the jobs run when not in the planner's environment (``{"conda": staleness.env_digest(...)}``
    under ``--sdm conda``): then ``"packages"`` is ``{"environment": job_env}``, not the planner's
    versions, which are not the job's; a changed environment file replans the stage.
    """
    packages = STAGE_PACKAGES[stage]
    if job_env is not None and packages and track_packages:
        return {"output": output_version(stage), "packages": {"environment": job_env}}
    return {"output": output_version(stage), "packages": package_versions(packages, track_packages)}


@dataclass(frozen=True)
class Hosted:
    """How a stage's jobs run in a host (eagle3build/workflow/host.py): functions of the stage's module, by name.
    ``spec(settings) -> dict``: what the host's state depends on (JSON; its ``env``, where given, is the host process's
    environment); ``load(spec) -> dict``: that state, loaded once in the host, the entry's keywords for each job
    (``entry(settings, alive=..., **state)``; ``alive()`` says False once the job that asked is gone)."""

    spec: str
    load: str


# Stages whose jobs hand their work to a host process of their Snakemake run that outlives each job: a capture job's
# shard is captured by a capture host, which keeps the target loaded for the next shard (issue 70). The adapter's
# set-up (job.setup) takes no GPUs for such a job (the host holds them) and imports no torch (the job only asks).
HOSTED: dict[str, Hosted] = {"capture_hidden_states": Hosted(spec="host_spec", load="host_load")}


# Rules that are no stage (no contract) but run an entry of a stage's module through the one adapter.
RULE_ENTRIES: dict[str, JobEntry] = {
    # compat.md from compat.json, its own job: a missing compat.md comes back without re-running the report
    "compat_markdown": JobEntry.of("eagle3build.compat.compat_report:markdown_job",
                                   "eagle3build.compat.compat_report:MarkdownSettings",
                                   {"compat_json": "inputs.json", "out_md": "outputs.md",
                                    "preflight_json": "inputs.preflight?"}),
}


# Rules that run a stage's job on other paths (rules/*.smk ``use rule STAGE as RULE``): draft.compare_methods' heads
STAGE_OF_RULE: dict[str, str] = {"train_draft_method": "train_draft", "export_head_method": "export_head"}


def stage_of(rule: str) -> str:
    """The stage whose job ``rule`` runs: the stage a derived rule names in ``STAGE_OF_RULE``, else ``rule``."""
    return STAGE_OF_RULE.get(rule, rule)


def job_entry(rule: str) -> JobEntry:
    """What the adapter calls for ``rule`` (``job_fields.JobEntry``: entry, settings class, ``from_job``): its stage
    contract's (``stage_of``), or ``RULE_ENTRIES``'.

    Raises:
        KeyError: ``rule`` is neither a stage, nor derived from one, nor in ``RULE_ENTRIES``.
    """
    rule = stage_of(rule)
    if rule in CONTRACTS:
        return CONTRACTS[rule].job
    if rule in RULE_ENTRIES:
        return RULE_ENTRIES[rule]
    raise KeyError(f"rule {rule!r} has no entry (eagle3build.workflow.contract.CONTRACTS, RULE_ENTRIES)")


def entry(rule: str) -> str:
    """The entry (``module:function``) the adapter calls for ``rule`` (``job_entry``; raises what it raises)."""
    return job_entry(rule).entry


def online_capture(mode: str, num_train: int, num_eval: int, storage_dtype: str, tokens_per_batch: int,
                   compute_dtype: str) -> dict | None:
    """train_draft's ``online`` param: None offline (the shards carry these settings), else the settings that
    shape the states it computes (``_ONLINE_KEYS`` by their last part; ``capture.compute_dtype`` as ``compute_dtype``)."""
    if mode != "online":
        return None
    return {"num_train_samples": num_train, "num_eval_samples": num_eval, "storage_dtype": storage_dtype,
            "tokens_per_batch": tokens_per_batch, "compute_dtype": compute_dtype}


def require_eval(num_eval_samples: int) -> bool:
    """Whether prepare_data must produce eval samples (capture.num_eval_samples > 0)."""
    return num_eval_samples > 0


def canonical(obj: Any) -> Any:
    """``obj`` with every mapping's keys sorted (lists and scalars as they are). Snakemake compares
    params by their repr, so a config whose keys come in another order (yaml.safe_dump sorts them)
    must not read as changed params; the job's settings come in the same order."""
    if isinstance(obj, Mapping):
        return {k: canonical(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [canonical(v) for v in obj]
    return obj


def config_value(config: Mapping[str, Any], key: str) -> Any:
    """The value at dotted path ``key`` of ``config`` (``"data.regenerate.max_tokens"``), ``canonical``.

    Raises:
        KeyError: no such key in ``config``.
    """
    value: Any = config
    for part in key.split("."):
        value = value[part]
    return canonical(value)


class StageSettings:
    """A job's settings: the values of its stage's trigger and runtime keys, read from the workflow's config.

    ``settings["train.lr"]`` is one value; ``settings["train"]`` is every declared key directly
    under a section, as a dict by the keys' last part (``{"lr": 0.001, ...}``). The rule hands it to
    the job as a param computed from ``threads`` (rules/common.smk, ``job_settings_param``): Snakemake
    takes such a param as derived and does not compare it, so the runtime keys in it plan nothing.
    """

    def __init__(self, stage: str, values: Mapping[str, Any]):
        self.stage = stage
        self.values = dict(values)

    def __getitem__(self, key: str) -> Any:
        """The value of config key ``key``, or the section ``key`` as a dict.

        Raises:
            KeyError: ``key`` is neither a declared key of the stage nor a section holding one: a
                job reads no setting its contract does not declare.
        """
        if key in self.values:
            return self.values[key]
        section = {k[len(key) + 1:]: v for k, v in self.values.items()
                   if k.startswith(key + ".") and "." not in k[len(key) + 1:]}
        if not section:
            raise KeyError(f"{key!r} is not a setting of stage {self.stage} (eagle3build.workflow.contract.CONTRACTS)")
        return section

    def __repr__(self) -> str:
        return f"StageSettings({self.stage!r}, {self.values!r})"


def job_settings(stage: str, config: Mapping[str, Any],
                 contracts: Mapping[str, Contract] | None = None) -> StageSettings:
    """The settings of a job of ``stage`` from the workflow's config (the dict Snakemake loaded), by its contract
    in ``contracts`` (default ``CONTRACTS``).

    Raises:
        KeyError: ``stage`` is not a stage, or ``config`` lacks one of its declared keys.
    """
    c = (CONTRACTS if contracts is None else contracts)[stage]
    return StageSettings(stage, {k: config_value(config, k) for k in c.triggers + c.runtime})
