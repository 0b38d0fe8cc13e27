"""The DPO update, Ray-free: the policy updater's megatron schedule and optimizer step with
DPO's pairwise loss in place of the clipped GRPO loss.

A DPO batch is `mindrl.data.pairs.pair_batch`'s layout: 2B rows, each pair's chosen row then
its rejected row, with the reference's per-token log-probs as `ref_log_probs` (the reference
role's pass over the same rows). Micro-batches hold whole pairs (`micro_batch_size` pairs,
MindSpeed-LLM's meaning: one micro-batch of 1 is one chosen + one rejected sequence), and each
global batch is one optimizer step.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mindrl.data.batch import SampleBatch
from mindrl.workers.policy_update import PolicyUpdater
from mindrl.workers.update_micro_batch import UpdateMicroBatch

if TYPE_CHECKING:
    import torch

    from mindrl.algorithms.dpo_config import DPOLossConfig
    from mindrl.models.token_select import OutputHead

# TRL's metric names; each is a mean over the global batch's pairs (summed parts / pairs).
DPO_METRICS = frozenset(
    {
        "dpo/loss",
        "dpo/pair_loss",
        "sft_loss",
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracies",
        "logps/chosen",
        "logps/rejected",
    }
)


@dataclass(frozen=True)
class DPOLossSettings:
    """What the DPO loss needs besides the micro-batch; fixed for one global batch."""

    loss: DPOLossConfig
    vocab_size: int
    pairs: float  # pairs of the global batch (all DP ranks)
    scale: float  # undoes megatron's 1/n_micro and DDP's 1/DP averaging


def dpo_micro_batch_loss(
    mb: UpdateMicroBatch, settings: DPOLossSettings, head: OutputHead, output: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The scaled DPO loss of one micro-batch of whole pairs, and its metric parts (each
    divided by the global pair count, so parts over micro-batches and DP ranks add up)."""
    import torch

    from mindrl.algorithms.dpo import dpo_loss
    from mindrl.models.logprobs import scored_log_probs

    if mb.ref_log_probs is None:
        raise ValueError("a DPO batch needs the reference's log-probs (ref_log_probs)")
    picked, _ = scored_log_probs(
        output, head, mb.selection, mb.tokens, vocab_size=settings.vocab_size
    )
    log_prob = mb.selection.scatter(picked)
    mask = mb.response_mask
    reference = (mb.ref_log_probs.float() * mask).sum(-1)
    out = dpo_loss(
        settings.loss,
        log_prob[0::2],
        log_prob[1::2],
        reference[0::2],
        reference[1::2],
        mask[0::2],
        mask[1::2],
        normalizer=settings.pairs,
    )
    reported = {k: torch.tensor(v / settings.pairs) for k, v in out.metric_sums.items()}
    reported["dpo/loss"] = out.loss.detach().double()
    return out.loss * settings.scale, reported


def dpo_forward_step(
    settings: DPOLossSettings, data_iterator: Iterator[UpdateMicroBatch], model: Any
) -> tuple[torch.Tensor, Any]:
    """megatron's `forward_step_func` for a DPO micro-batch (the policy update's forward,
    the DPO loss)."""
    from mindrl.models.shared_prefix import rope_at_positions
    from mindrl.models.token_select import select_tokens

    mb = next(data_iterator)
    packed = mb.packed_seq_params
    extra = {} if packed is None else {"packed_seq_params": packed}
    with select_tokens(model, mb.selection, hidden_only=True) as head:
        with rope_at_positions(model, packed):
            output = model(mb.tokens, mb.position_ids, mb.attention_mask, **extra)
    return output, functools.partial(dpo_micro_batch_loss, mb, settings, head)


class DPOUpdater(PolicyUpdater):
    """Trains on pair batches: one optimizer step per global batch of pairs."""

    summed_metrics = DPO_METRICS

    def __init__(self, *args: Any, dpo: DPOLossConfig, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dpo = dpo

    def mini_batches(self, size: int, step: int, epoch: int) -> list[Any]:
        import torch

        return [torch.arange(size)]

    def micro_groups(self, mini: SampleBatch) -> list[list[int]]:
        """`micro_batch` whole pairs per micro-batch."""
        if mini.size % 2:
            raise ValueError(f"a DPO batch holds pairs: {mini.size} rows is not even")
        rows = 2 * max(1, min(self.micro_batch, mini.size // 2))
        return [list(range(i, min(i + rows, mini.size))) for i in range(0, mini.size, rows)]

    def forward_inputs(
        self, mini: SampleBatch, groups: list[list[int]], multiple: int
    ) -> tuple[Any, list[Any], int, int]:
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        from mindrl.models.micro_batches import fixed_packed_length

        pairs = torch.tensor(float(mini.size // 2), dtype=torch.float64)
        dist.all_reduce(pairs, group=ps.get_data_parallel_group())
        settings = DPOLossSettings(
            loss=self.dpo,
            vocab_size=self.vocab_size,
            pairs=float(pairs),
            scale=float(len(groups) * ps.get_data_parallel_world_size()),
        )
        parts = [mini.select(g) for g in groups]
        if self.packing.remove_padding:  # packed pairs: each micro-batch one sequence
            fixed = fixed_packed_length(mini.attention_mask, groups, multiple)
            micro = [UpdateMicroBatch.packed(p, multiple, fixed) for p in parts]
            seq, mbs = micro[0].tokens.shape[1], 1
        else:
            micro = [UpdateMicroBatch.from_rows(p, multiple) for p in parts]
            seq, mbs = mini.input_ids.shape[1], len(groups[0])
        return functools.partial(dpo_forward_step, settings), micro, seq, mbs
