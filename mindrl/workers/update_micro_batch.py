"""One micro-batch of the policy update as the model and the loss see it: padded rows with
their trailing padding cut, or the rows packed into one sequence (use_remove_padding); either
way the loss reads the rows' own `[b, s-1]` grids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from mindrl.data.batch import SampleBatch
    from mindrl.models.token_select import TokenSelection


@dataclass(frozen=True)
class UpdateMicroBatch:
    """One micro-batch as the model and the loss see it: trailing padding cut, per-token
    inputs on the `[B, S-1]` next-token grid."""

    tokens: torch.Tensor  # [b, s]
    position_ids: torch.Tensor  # [b, s]
    attention_mask: torch.Tensor | None  # megatron's boolean mask, True = masked (None: packed)
    selection: TokenSelection  # which positions are scored (response tokens)
    response_mask: torch.Tensor  # [b, s-1]
    advantages: torch.Tensor | None  # [b, s-1]; None in a DPO update (pairs, no advantages)
    old_log_probs: torch.Tensor | None  # None: on-policy, the update's own are used
    ref_log_probs: torch.Tensor | None
    rollout_log_probs: torch.Tensor | None
    packed_seq_params: Any = None  # set: the rows are packed into one sequence (`tokens` [1, T])
    real_tokens: int = 0  # tokens of `tokens` that are samples' (not padding)

    @classmethod
    def from_rows(cls, part: SampleBatch, multiple: int = 1) -> UpdateMicroBatch:
        """`multiple`: the input length's required multiple (sequence parallelism); `part`
        is already padded to one."""
        from mindrl.models.logprobs import (
            causal_attention_mask,
            micro_selection,
            position_ids_from_mask,
        )

        selection = micro_selection(part.response_mask, multiple)
        length = selection.seq  # trailing padding cut (without PP)
        am = part.attention_mask[:, :length]

        def grid(name: str) -> torch.Tensor | None:
            t = part.tensors.get(name)
            return None if t is None else t[:, : length - 1]

        return cls(
            tokens=part.input_ids[:, :length],
            position_ids=position_ids_from_mask(am),
            attention_mask=causal_attention_mask(length, am),
            selection=selection,
            response_mask=part.response_mask[:, : length - 1],
            advantages=grid("advantages"),
            old_log_probs=grid("old_log_probs"),
            ref_log_probs=grid("ref_log_probs"),
            rollout_log_probs=grid("rollout_log_probs"),
            real_tokens=int(am.sum()),
        )

    @classmethod
    def packed(
        cls, part: SampleBatch, multiple: int = 1, length: int | None = None
    ) -> UpdateMicroBatch:
        """`part`'s rows packed into one sequence (use_remove_padding): the model reads the
        packed tokens, the loss sees `part`'s own [b, s-1] grids."""
        from mindrl.data.packing import pack_rows
        from mindrl.models.micro_batches import packed_seq_params

        packed = pack_rows(part.input_ids, part.attention_mask, multiple, length)
        return cls._one_sequence(
            part,
            packed.tokens,
            packed.position_ids,
            packed.selection(part.response_mask),
            packed_seq_params(packed, packed.tokens.device),
            int(part.attention_mask.sum()),
        )

    @classmethod
    def shared_prompts(
        cls, part: SampleBatch, multiple: int = 1, length: int | None = None
    ) -> UpdateMicroBatch:
        """`part`'s rows packed with each prompt they share once (`share_prompt_forward`):
        the model reads the blocks, the loss sees `part`'s own [b, s-1] grids."""
        from mindrl.data.prefix_sharing import pack_shared
        from mindrl.models.shared_prefix import shared_prefix_params

        rows = pack_shared(
            part.input_ids, part.attention_mask, part.prompt_lengths, multiple, length
        )
        return cls._one_sequence(
            part,
            rows.tokens,
            rows.position_ids,
            rows.selection(part.response_mask, part.input_ids),
            shared_prefix_params(rows, rows.tokens.device),
            rows.real_tokens,
        )

    @classmethod
    def _one_sequence(
        cls,
        part: SampleBatch,
        tokens: torch.Tensor,
        position_ids: torch.Tensor,
        selection: TokenSelection,
        params: Any,
        real_tokens: int,
    ) -> UpdateMicroBatch:
        """`part`'s rows as one model sequence [1, T]; the loss's inputs stay `part`'s grids."""
        return cls(
            tokens=tokens,
            position_ids=position_ids,
            attention_mask=None,
            selection=selection,
            response_mask=part.response_mask,
            advantages=part.tensors.get("advantages"),
            old_log_probs=part.tensors.get("old_log_probs"),
            ref_log_probs=part.tensors.get("ref_log_probs"),
            rollout_log_probs=part.tensors.get("rollout_log_probs"),
            packed_seq_params=params,
            real_tokens=real_tokens,
        )
