"""Forward hooks that capture a transformers target's hidden states (shared layer).

Forward pre-hooks on the aux decoder layers record the residual stream *entering* each
(vLLM's and speculators' convention for aux layer id ``k``: vllm/model_executor/models/llama_eagle3.py,
``eagle_aux_hidden_state_layer_ids``), and a forward hook on the last decoder layer records its
output *before* the final norm, the state speculators' ``Eagle3DraftModel`` feeds through its
own ``verifier_norm`` (speculators/models/eagle3.py). Used by the ``hooks`` capture backend
(``capture_hidden_states``) and by the compat report's capture probes.
"""

from __future__ import annotations

import torch

from .target import DecoderStack, find_decoder_layers, text_config


class HookCapture:
    """Capture aux-layer inputs and the last layer's output of a transformers model.

    ``capture(input_ids [B, T] int64, attention_mask [B, T] or None)`` returns
    ``(aux [B, T, A*H], last [B, T, H])`` in the model's compute dtype on the device of
    the first layer, aux states concatenated in ``aux_layer_ids`` order.
    """

    def __init__(self, model: torch.nn.Module, aux_layer_ids: list[int], stack: DecoderStack | None = None):
        self.stack = stack or find_decoder_layers(model, text_config(model.config).num_hidden_layers)
        n = len(self.stack.layers)
        for i in aux_layer_ids:
            if not 0 <= i < n:
                raise ValueError(f"aux layer id {i} out of range for {n} decoder layers")
        self.aux_layer_ids = list(aux_layer_ids)
        self._buf: dict[object, torch.Tensor] = {}
        self._handles = [
            self.stack.layers[i].register_forward_pre_hook(self._pre_hook(i), with_kwargs=True) for i in self.aux_layer_ids
        ]
        self._handles.append(self.stack.layers[n - 1].register_forward_hook(self._last_hook))

    def _pre_hook(self, i: int):
        def hook(module, args, kwargs):
            self._buf[i] = args[0] if args else kwargs["hidden_states"]

        return hook

    def _last_hook(self, module, args, output):
        self._buf["last"] = output[0] if isinstance(output, tuple) else output

    @torch.inference_mode()
    def capture(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._buf.clear()
        self.stack.owner(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        dev = input_ids.device
        # With the layers spread over several GPUs the states live on different devices.
        aux = torch.cat([self._buf[i].to(dev) for i in self.aux_layer_ids], dim=-1)
        return aux, self._buf["last"].to(dev)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
