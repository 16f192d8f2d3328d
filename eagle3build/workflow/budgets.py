"""Disk and GPU plans: what a capture needs against what the machine has (shared layer).

Used by the compat report (the whole run, when it is built) and by each capture job
(its own shard, before the target is loaded). Bytes per token come from the shard
format's one definition, ``shards.bytes_per_token``.
"""

from __future__ import annotations

import math

DISK_WARN_FRACTION = 0.8
# Memory a job needs per byte of weights: activations, CUDA context and (serving) KV cache
# on top of the weights themselves.
GPU_HEADROOM = 1.2


def plan_disk(bytes_per_token: int, planned_tokens: int, free_bytes: int, upper_bound: bool = False) -> dict:
    """Hidden-state bytes of the planned capture against free disk: ``ok``, ``warn`` above 80 %, ``fail`` above 100 %.

    ``upper_bound``: ``planned_tokens`` is a bound (samples x ``max_seq_len``, before the data
    is tokenized), not a count; above 100 % it is then a ``warn`` (real conversations are
    shorter: 12,000 bundled samples at ``max_seq_len`` 2,048 hold 16.3 M tokens, not 24.6 M), and
    the capture jobs refuse from the real token counts (``check_disk_for_split``).
    """
    need = bytes_per_token * planned_tokens
    frac = need / free_bytes if free_bytes else float("inf")
    status = "fail" if frac > 1 and not upper_bound else "warn" if frac > DISK_WARN_FRACTION else "ok"
    what = "at most" if upper_bound else ""
    msg = (f"hidden states need {what + ' ' if what else ''}{need / 1e9:.2f} GB ({planned_tokens} tokens x "
           f"{bytes_per_token} B); {free_bytes / 1e9:.2f} GB free under the results directory")
    if upper_bound and frac > 1:
        msg += ("; an upper bound (samples x max_seq_len): each capture job refuses before loading the target "
                "if the real token counts of its split's missing shards exceed the free space")
    return {"status": status, "bytes_per_token": bytes_per_token, "planned_tokens": planned_tokens,
            "upper_bound": upper_bound, "needed_bytes": need, "free_bytes": free_bytes,
            "fraction_of_free": round(frac, 4), "message": msg}


def gpus_needed(weight_bytes: float, gpu_memory_bytes: int) -> int:
    """GPUs (a power of two, as tensor parallelism needs) whose memory holds ``GPU_HEADROOM`` x the weights."""
    n = max(1, math.ceil(weight_bytes * GPU_HEADROOM / gpu_memory_bytes))
    return 1 << (n - 1).bit_length()


def plan_gpus(parameters: int, bytes_per_parameter: float, gpu_memory_bytes: int | None, gpus_per_node: int,
              configured: dict[str, int]) -> dict:
    """GPUs per capture/serve job for the target's weights against per-GPU memory and the configured counts.

    ``configured``: job -> GPUs the config asks for (0 = CPU job). A GPU job asking for
    fewer GPUs than its weights need, or a need beyond one node, fails the plan.
    """
    weight_bytes = parameters * bytes_per_parameter
    out = {"weight_bytes": int(weight_bytes), "bytes_per_parameter": bytes_per_parameter, "headroom": GPU_HEADROOM,
           "gpu_memory_bytes": gpu_memory_bytes, "gpus_per_node": gpus_per_node, "jobs": {}, "status": "ok"}
    if not gpu_memory_bytes:
        out["message"] = "no GPU memory known (no GPU here and resources.gpu_memory_gb unset): GPU plan skipped"
        out["status"] = "warn" if any(configured.values()) else "ok"
        return out
    need = gpus_needed(weight_bytes, gpu_memory_bytes)
    out["gpus_needed_per_job"] = need
    for job, n in configured.items():
        if n == 0:
            st, msg = "ok", "CPU job"
        elif n < need:
            st, msg = "fail", (f"{job} job asks for {n} GPU(s); {weight_bytes / 1e9:.0f} GB of weights need {need} "
                               f"of {gpu_memory_bytes / 1e9:.0f} GB")
        elif need > gpus_per_node > 0:
            st, msg = "fail", f"{need} GPUs needed but a node has {gpus_per_node}"
        else:
            st, msg = "ok", (f"{n} GPU(s) of {gpu_memory_bytes / 1e9:.0f} GB hold {weight_bytes / 1e9:.0f} GB "
                             f"of weights (need {need})")
        out["jobs"][job] = {"configured": n, "needed": need, "status": st, "message": msg}
        if st == "fail":
            out["status"] = "fail"
    return out


def hidden_state_bytes_per_token(num_aux_layers: int, hidden_size: int, storage_dtype: str,
                                 with_tokens: bool = False) -> int:
    """Shard bytes one token takes: ``num_aux_layers`` aux states plus the last layer's, each
    ``hidden_size`` wide in ``storage_dtype`` (with fp8 scales), e.g. ``(A + 1) * H * 2`` in bf16;
    ``with_tokens`` adds its id and mask (5 bytes). The arithmetic is ``shards.bytes_per_token``'s.
    """
    from ..formats.shards import ShardMeta, bytes_per_token

    meta = ShardMeta("", list(range(num_aux_layers)), storage_dtype, hidden_size, [], "")
    return bytes_per_token(meta, with_tokens=with_tokens)


def draft_training_bytes(config, draft_vocab: int, num_aux: int, total_seq_len: int, ttt_steps: int) -> dict:
    """GPU bytes training an EAGLE-3 draft head takes, estimated from its shapes (speculators'
    ``Eagle3DraftModel``: one llama decoder layer whose attention reads ``2 x hidden`` (token embedding and
    fused state, EAGLE-3, arXiv:2503.01840 §3.2) and the ``fc`` fusing ``num_aux`` aux states; frozen: the
    target's embedding, the draft ``lm_head`` and the verifier's ``lm_head`` rows of the draft vocab; the
    count equals speculators 0.9's trainable parameters for ``eagle3.1``, tests/test_online.py).

    ``config``: a transformers config (the target's text config, or the draft layer's: the draft layer takes the
    target's shapes), read for its hidden and intermediate sizes, heads, KV heads (the heads where unset), head dim
    (hidden / heads where unset) and vocab (tokens); ``draft_vocab``: tokens; ``num_aux``: the aux states fused;
    ``total_seq_len``: packed tokens a step; ``ttt_steps``: draft tokens trained a position.

    ``states``: trainable parameters x 16 B (fp32 weights, gradients, AdamW's two moments) + frozen x 4 B;
    ``activations``: per TTT step and packed token, the draft and verifier logits over the draft vocab in
    fp32 with their softmax and gradient (4 x 4 B per entry), and the layer's activations (an allowance of
    4 B x (16 x hidden + 3 x intermediate)) — an estimate, not a measurement (``benchmarks/`` has the
    measured peaks). Returns ``{"trainable_parameters", "states_bytes", "activation_bytes", "total_bytes"}``.
    """
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    H, inter, target_vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    q, kv = heads * head_dim, (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    # trained: fc, attention over 2 x hidden, o_proj, MLP, norms (four of hidden, the fc input's of num_aux x
    # hidden); frozen: the embedding, the draft lm_head (speculators 0.9 copies it from the verifier's rows and
    # does not train it), the verifier's lm_head rows and norm
    trainable = num_aux * H * H + 2 * H * (q + 2 * kv) + q * H + 3 * H * inter + (4 + num_aux) * H
    frozen = target_vocab * H + 2 * draft_vocab * H + H
    states = trainable * 16 + frozen * 4
    act = ttt_steps * total_seq_len * (4 * 4 * draft_vocab + 4 * (16 * H + 3 * inter))
    return {"trainable_parameters": trainable, "states_bytes": states, "activation_bytes": act,
            "total_bytes": states + act}


def plan_online_memory(gpu_memory_bytes: int | None, gpus: int, target_weight_bytes: float, kv_bytes_per_token: int | None,
                       kv_tokens: int, trainer: dict, target_fraction: float) -> dict:
    """Online training's split of each GPU between the target and the trainer (``capture.online``).

    The target (a vLLM engine or transformers, over ``gpus`` GPUs) gets ``target_fraction`` of each
    card: its weights (``target_weight_bytes`` / ``gpus`` x ``GPU_HEADROOM`` for activations) and, for
    an engine, the KV cache of ``kv_tokens`` tokens (``kv_bytes_per_token`` on one GPU of the group,
    ``target.kv_cache_bytes_per_token``; None: not counted). The trainer, on the first GPU, gets the rest for
    ``trainer["total_bytes"]`` (``draft_training_bytes``). A side that does not fit fails the plan,
    both numbers named. ``gpu_memory_bytes`` None (no GPU known) or ``gpus`` 0 (a CPU job): skipped.
    """
    out = {"target_fraction": target_fraction, "gpus": gpus, "gpu_memory_bytes": gpu_memory_bytes, "status": "ok"}
    if not gpu_memory_bytes or gpus == 0:
        out["message"] = "CPU job or no GPU memory known: online memory split not planned"
        return out
    target = target_weight_bytes / gpus * GPU_HEADROOM + (kv_bytes_per_token or 0) * kv_tokens
    t_budget = target_fraction * gpu_memory_bytes
    tr_budget = (1 - target_fraction) * gpu_memory_bytes
    out.update(target_bytes_per_gpu=int(target), target_budget_bytes=int(t_budget),
               trainer_bytes=int(trainer["total_bytes"]), trainer_budget_bytes=int(tr_budget), trainer=trainer)
    gb = 1e9
    msgs = []
    if target > t_budget:
        msgs.append(f"the target needs {target / gb:.1f} GB per GPU (weights {target_weight_bytes / gpus / gb:.1f} GB "
                    f"x {GPU_HEADROOM} + KV cache) but capture.online.target_memory_fraction {target_fraction} of "
                    f"{gpu_memory_bytes / gb:.0f} GB gives it {t_budget / gb:.1f} GB")
    if trainer["total_bytes"] > tr_budget:
        msgs.append(f"the trainer needs {trainer['total_bytes'] / gb:.1f} GB (states {trainer['states_bytes'] / gb:.1f}, "
                    f"activations {trainer['activation_bytes'] / gb:.1f}) but the rest of a {gpu_memory_bytes / gb:.0f} GB "
                    f"GPU after the target's share is {tr_budget / gb:.1f} GB")
    if msgs:
        out.update(status="fail", message="; ".join(msgs))
    else:
        out["message"] = (f"target {target / gb:.1f} of {t_budget / gb:.1f} GB per GPU, trainer "
                          f"{trainer['total_bytes'] / gb:.1f} of {tr_budget / gb:.1f} GB")
    return out


def plan_online_for_target(text_cfg, weight_bytes: float, backend: str | None, num_aux: int, online: dict,
                           gpu_memory_bytes: int | None) -> dict:
    """``plan_online_memory`` for a target with (text) transformers config ``text_cfg`` and ``weight_bytes``
    of weights: the KV cache of a capture engine where ``backend`` is ``vllm`` (2 x (tokens per step +
    longest sample) tokens, ``target.capture_kv_cache_tokens``, as ``vllm.capture.capture_engine_args`` sizes it,
    bf16) and the draft's
    training need from the target's shapes (``draft_training_bytes``). ``online``: ``gpus``,
    ``target_memory_fraction``, ``total_seq_len``, ``ttt_steps``, ``draft_vocab_size``,
    ``tokens_per_batch`` and ``max_seq_len`` (tokens). Used by the compat report (from the config) and by
    ``train_draft`` online before it loads the target (from its own inputs)."""
    from ..target import capture_kv_cache_tokens, kv_cache_bytes_per_token

    gpus = online["gpus"]
    trainer = draft_training_bytes(text_cfg, online["draft_vocab_size"], num_aux, online["total_seq_len"],
                                       online["ttt_steps"])
    engine = backend == "vllm"
    kv = kv_cache_bytes_per_token(text_cfg, 2, max(1, gpus)) if engine else None
    return plan_online_memory(gpu_memory_bytes, gpus, weight_bytes, kv,
                              capture_kv_cache_tokens(online["tokens_per_batch"], online["max_seq_len"]) if engine
                              else 0, trainer, online["target_memory_fraction"])
