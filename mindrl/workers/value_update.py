"""The critic's update, Ray-free: the policy update's epochs x mini-batches x micro-batches and
optimizer step (`PolicyUpdater`), with the clipped value loss instead of the policy loss.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mindrl.data.batch import SampleBatch
from mindrl.workers.policy_update import PolicyUpdater

if TYPE_CHECKING:
    import torch

VALUE_SUMMED_METRICS = frozenset({"critic/vf_loss"})


@dataclass(frozen=True)
class ValueMicroBatch:
    tokens: torch.Tensor  # [b, s]
    position_ids: torch.Tensor
    attention_mask: torch.Tensor  # megatron's boolean mask, True = masked
    response_mask: torch.Tensor  # [b, s-1]
    old_values: torch.Tensor  # [b, s-1] the critic's values at rollout
    returns: torch.Tensor  # [b, s-1] GAE returns
    real_tokens: int = 0  # tokens of `tokens` that are samples' (not padding)

    @classmethod
    def from_rows(cls, part: SampleBatch, multiple: int = 1) -> ValueMicroBatch:
        from mindrl.models.logprobs import (
            causal_attention_mask,
            micro_selection,
            position_ids_from_mask,
        )

        length = micro_selection(part.response_mask, multiple).seq  # trailing padding cut
        am = part.attention_mask[:, :length]
        values, returns = part.tensors.get("values"), part.tensors.get("returns")
        if values is None or returns is None:
            raise ValueError("the critic's update batch needs values and returns")
        return cls(
            tokens=part.input_ids[:, :length],
            position_ids=position_ids_from_mask(am),
            attention_mask=causal_attention_mask(length, am),
            response_mask=part.response_mask[:, : length - 1],
            old_values=values[:, : length - 1],
            returns=returns[:, : length - 1],
            real_tokens=int(am.sum()),
        )


def value_micro_batch_loss(
    mb: ValueMicroBatch, cliprange_value: float, normalizer: float, scale: float, output: Any
) -> tuple[Any, dict[str, Any]]:
    import torch

    from mindrl.algorithms.loss import clipped_value_loss
    from mindrl.models.value_model import value_grid

    vpreds = value_grid(output, mb.tokens.shape[1])
    loss, metrics = clipped_value_loss(
        vpreds, mb.old_values, mb.returns, mb.response_mask, cliprange_value, normalizer
    )
    return loss * scale, {k: torch.tensor(v) for k, v in metrics.items()}


def value_forward_step(
    cliprange_value: float,
    normalizer: float,
    scale: float,
    data_iterator: Iterator[ValueMicroBatch],
    model: Any,
) -> tuple[Any, Any]:
    mb = next(data_iterator)
    output = model(mb.tokens, mb.position_ids, mb.attention_mask)
    return output, functools.partial(value_micro_batch_loss, mb, cliprange_value, normalizer, scale)


class ValueUpdater(PolicyUpdater):
    """Trains the critic on the batch's GAE returns; same mini-batching as the actor."""

    role = "critic"
    summed_metrics = VALUE_SUMMED_METRICS

    def __init__(self, *args: Any, cliprange_value: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cliprange_value = cliprange_value

    def forward_inputs(
        self, mini: SampleBatch, groups: list[list[int]], multiple: int
    ) -> tuple[Any, list[Any], int, int]:
        """The critic's passes stay padded (packing is the actor's and reference's)."""
        from mindrl.models.micro_batches import schedule_loss_scale
        from mindrl.workers.policy_update import global_normalizer

        step = functools.partial(
            value_forward_step,
            self.cliprange_value,
            global_normalizer(mini.response_mask, "token-mean"),
            schedule_loss_scale(len(groups)),
        )
        micro = [ValueMicroBatch.from_rows(mini.select(g), multiple) for g in groups]
        return step, micro, mini.input_ids.shape[1], len(groups[0])
