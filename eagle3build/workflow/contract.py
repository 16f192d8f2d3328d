"""One contract per stage: what reaches it, through which channel, and what replans it (staleness).

``CONTRACTS[stage]`` (a ``Contract``) is made from what the stage's module declares beside its code
(``workflow.stages``: inputs, decisions read, packages, the config keys that reach it with their roles, computed
params, entry, its settings class's own fields) and the key table (eagle3build.config.spec): its ``params``, the
rule's rerun triggers (``Param``: a name, the keys its value is made from, the function that makes it; rules/common.smk
builds them, ``stage_params``), whose keys are its ``triggers``: a change replans the stage; ``runtime``, the keys the
job reads at run time only: a change plans nothing; ``files``, the keys that decide its files; and ``job``, what the
one adapter calls (``job_fields.JobEntry``). A key may be a trigger of one stage and runtime-only for another
(``data.max_seq_len``), never both for one (tests/test_contract.py). A job's settings are one ``StageSettings``
(``job_settings``): its trigger and runtime keys' values and no others. The jobs that build a draft head also get the
draft resolved at planning (eagle3build.draft.choice) as a derived ``draft`` param. Planning imports this module (no
torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..config.key import Key
from ..config.settings import declared
from ..config.spec import KEYS
from ..draft import methods
from . import stages
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
    """``methods.num_aux_layers`` of ``capture.aux_layer_ids``."""
    return methods.num_aux_layers(values["capture.aux_layer_ids"])


def require_eval_param(values: Mapping[str, Any], ctx: PlanContext) -> bool:
    """Whether prepare_data must produce eval samples: ``capture.num_eval_samples`` > 0."""
    return values["capture.num_eval_samples"] > 0


def online_param(values: Mapping[str, Any], ctx: PlanContext) -> dict | None:
    """train_draft's ``online`` param: None offline (``capture.mode``; the shards carry these settings), else the
    settings that shape the states it computes: the sample counts, ``capture.storage_dtype``,
    ``capture.tokens_per_batch`` and ``capture.compute_dtype``, by their last part."""
    if values["capture.mode"] != "online":
        return None
    return {k.rsplit(".", 1)[-1]: values[f"capture.{k}"] for k in ("num_train_samples", "num_eval_samples",
                                                                    "storage_dtype", "tokens_per_batch", "compute_dtype")}


@dataclass(frozen=True)
class Param:
    """One rerun-trigger param of a rule: ``name``, made from config ``keys`` by ``make``.

    ``make(values, ctx)``: ``values`` maps each of ``keys`` to its config value (``config_value``), ``ctx``
    is the ``PlanContext``; returns the param's value (``value``, ``section``, ``version``, one of ``MAKERS``).
    Snakemake compares the values: a change plans the stage again.
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
class Hosted:
    """How a stage's jobs run in a host (eagle3build/workflow/host.py): functions of the stage's module, by name.
    ``spec(settings) -> dict``: what the host's state depends on (JSON; its ``env``, where given, is the host process's
    environment); ``load(spec) -> dict``: that state, loaded once in the host, the entry's keywords for each job
    (``entry(settings, alive=..., **state)``; ``alive()`` says False once the job that asked is gone)."""

    spec: str
    load: str


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
    output_version: int = 1
    hosted: Hosted | None = None

    @property
    def job(self) -> JobEntry:
        """What the adapter calls for a job of the stage (``job_fields.JobEntry``)."""
        return JobEntry(self.entry, self.settings, self.from_job)

    @property
    def triggers(self) -> tuple[str, ...]:
        """The config keys of the params, in order, each once."""
        return tuple(dict.fromkeys(k for p in self.params for k in p.keys))


# The makers of computed params a stage names in its ``STAGE["params"]`` (``version``: every stage's).
MAKERS: dict[str, Callable[[Mapping[str, Any], PlanContext], Any]] = {
    "requested": requested, "sources": prepare_sources, "num_aux_layers": num_aux_layers_param,
    "require_eval": require_eval_param, "online": online_param}


def build_contracts(declared_stages: tuple[stages.Declared, ...] | None = None,
                    keys: tuple[Key, ...] = KEYS) -> dict[str, Contract]:
    """Each stage's ``Contract`` from its declaration (``stages.declared()`` where None) and the keys' (``stages.key_roles``):
    a computed param per ``params`` entry and ``version``, with the keys of role ``trigger:<its name>``; a ``value``
    param per other key of role ``trigger`` (named by its last part) or alone in a ``trigger:<name>``; a
    ``section`` param per ``trigger:<name>`` of several keys; ``runtime`` and ``files`` the keys of those roles.

    Raises:
        ValueError: what ``stages.key_roles`` raises; a computed param's maker is not one of ``MAKERS``; two keys of
            role ``trigger`` of one stage share their last part; a ``from_job`` source is malformed.
    """
    out = {}
    for st in stages.declared() if declared_stages is None else declared_stages:
        roles = stages.key_roles(st, keys)
        unknown = sorted(set(st.params.values()) - set(MAKERS))
        if unknown:
            raise ValueError(f"{st.stage}: computed params {unknown} are not among {sorted(MAKERS)}")
        groups: dict[str, list[str]] = {}
        renamed: dict[str, list[tuple[str, str]]] = {}
        quiet: dict[str, list[tuple[str, Any]]] = {}
        cond: dict[str, list[tuple[str, tuple[str, Any]]]] = {}
        for k in keys:
            found = stages.trigger_param(roles.get(k.path, ()), k.name)
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
        computed = {"version": version, **{name: MAKERS[m] for name, m in st.params.items()}}
        params = [Param(name, tuple(groups.pop(name, ())), make) for name, make in computed.items()]
        for name, ks in groups.items():
            if len(ks) == 1 and name not in quiet and name not in cond:
                make = value
            elif name in renamed or name in quiet or name in cond:
                make = NamedSection(tuple(renamed.get(name, ())), tuple(quiet.get(name, ())), tuple(cond.get(name, ())))
            else:
                make = section
            params.append(Param(name, tuple(ks), make))
        job = JobEntry.of(f"{st.module}:{st.entry}", f"{st.module}:{st.settings}", st.from_job)
        decisions = tuple(dict.fromkeys([*(".".join(f.path) for f in job.fields_of("decisions").values()),
                                         *st.decisions]))
        inputs = tuple(dict.fromkeys([*(f.path[0] for f in job.fields_of("inputs").values()),
                                      *(["decisions"] if decisions else []), *st.inputs]))
        out[st.stage] = Contract(
            st.stage, st.group, inputs, tuple(params),
            runtime=tuple(p for p, r in roles.items() if "runtime" in r),
            files=tuple(p for p, r in roles.items() if "files" in r),
            decisions=decisions, packages=st.packages, entry=job.entry, settings=job.settings,
            from_job=job.from_job, output_version=st.output_version,
            hosted=Hosted(**st.hosted) if st.hosted else None)
    return out


CONTRACTS: dict[str, Contract] = build_contracts()

# Each stage's subpackage: its module is eagle3build/<group>/<stage>.py, beside its private modules (docs/layout.md).
STAGE_GROUPS: dict[str, str] = {s: c.group for s, c in CONTRACTS.items()}

# The libraries whose versions shape each stage's output bytes (rules' `version` param). A stage's OUTPUT_VERSION
# covers the modules it uses too, shared and private: a change to one that alters a stage's output bytes bumps that
# stage's OUTPUT_VERSION (and every other stage's whose bytes it alters); tests/test_e2e.py's digest test catches it.
STAGE_PACKAGES: dict[str, tuple[str, ...]] = {s: c.packages for s, c in CONTRACTS.items()}


def output_version(stage: str) -> int:
    """``OUTPUT_VERSION`` of stage module ``eagle3build/<group>/<stage>.py``, read from its source (``stages.read``:
    planning imports no torch). A change to a stage, or to a shared module it uses, that alters its output bytes bumps
    it; a refactor that changes no bytes does not, and rebuilds nothing (tests/test_e2e.py's digest test).

    Raises:
        KeyError: ``stage`` is not a stage.
    """
    return CONTRACTS[stage].output_version


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


# Stages whose jobs hand their work to a host process of their Snakemake run that outlives each job (their STAGE's
# ``hosted``): a capture job's shard is captured by a capture host, which keeps the target loaded for the next shard
# (issue 70). The adapter's set-up (job.setup) takes no GPUs for such a job (the host holds it) and imports no torch.
HOSTED: dict[str, Hosted] = {s: c.hosted for s, c in CONTRACTS.items() if c.hosted is not None}

# Rules that are no stage (no contract) but run a function of a stage's module through the one adapter: compat.md from
# compat.json, its own job (a missing compat.md comes back without re-running the report).
RULE_ENTRIES: dict[str, JobEntry] = {"compat_markdown": JobEntry.of(*stages.module_entry("compat.compat_report",
                                                                                          "markdown_job"))}


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
