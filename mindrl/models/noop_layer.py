"""MindSpeed's noop layer: a transformer layer slot that holds no weights and passes its
input through, so `noop_layers` can pad `num_layers` to a count the pipeline splits evenly
while the model computes what the model without them computes."""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.transformer.module import MegatronModule


class NoopTransformerLayer(MegatronModule):
    """Identity in a TransformerBlock's layer list: megatron's block calls it as a layer
    (keyword inputs, `(hidden_states, context)` out) and reads its `layer_number`."""

    def __init__(
        self, config: Any, layer_number: int = 1, vp_stage: int | None = None, **_: Any
    ) -> None:
        super().__init__(config=config)
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

        # global 1-based number, as megatron's TransformerLayer keeps it
        self.layer_number = layer_number + get_transformer_layer_offset(config, vp_stage)

    def forward(
        self, hidden_states: torch.Tensor, context: Any = None, **_: Any
    ) -> tuple[torch.Tensor, Any]:
        # a new tensor, as a layer's output is: pipeline schedules free stage outputs
        return hidden_states.clone(), context

    def sharded_state_dict(
        self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None
    ) -> dict[str, Any]:
        return {}  # nothing to save: no weights
