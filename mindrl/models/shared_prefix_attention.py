"""Attention over shared-prompt blocks (`share_prompt_forward`), one row at a time.

A block holds a prompt once, then the responses of the rows that share it. Laid out as one
causal sequence per block, attention would cost (prompt + n responses)^2 per block, ~5x what
the rows need when 8 responses of 64 tokens share a 50-token prompt, the excess all spent
on scores the mask discards. Here attention runs as two batched calls:
- each block's prompt, causal over itself: [blocks, prompt, prompt];
- each response, over its block's prompt and its own earlier tokens: [responses, response,
  prompt + response], the prompt's keys / values gathered once per response.
The result is the same per token (the same keys, the same weights); only the masked-out
work is gone. The index and mask tensors depend on the micro-batch alone, so a forward's
layers (and its recomputation) share one `SharedPrefixLayout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mindrl.models.sdpa import gather_rows, scaled_dot_product_attention

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class _RowGroup:
    """Rows of one kind, padded to a common length: token indices and an additive mask."""

    queries: torch.Tensor  # [rows, q_len] token indices (padding: any valid index)
    keys: torch.Tensor  # [rows, k_len] token indices (padding: masked out)
    mask: torch.Tensor  # [rows, 1, q_len, k_len] additive, 0 / -inf

    def attend(self, q: Any, k: Any, v: Any, scale: float, dropout: float) -> Any:
        """[rows * q_len, heads, dim] outputs, query-padding slots included."""

        rq = gather_rows(q, self.queries).transpose(1, 2)  # [rows, heads, q_len, dim]
        # grouped-query key / value heads as they are: the attention call reads them per group
        rk, rv = (gather_rows(t, self.keys) for t in (k, v))
        out = scaled_dot_product_attention(
            rq,
            rk.transpose(1, 2),
            rv.transpose(1, 2),
            attn_mask=self.mask,
            dropout_p=dropout,
            scale=scale,
        )
        return out.transpose(1, 2).reshape(-1, *q.shape[1:])


@dataclass(frozen=True)
class SharedPrefixLayout:
    """Where each token's query, keys and output sit in the two batched calls."""

    prompts: _RowGroup | None
    responses: _RowGroup | None
    output_index: torch.Tensor  # [T]: each token's slot in the two calls' outputs, concatenated

    @classmethod
    def build(
        cls, block_bounds: torch.Tensor, segments: torch.Tensor, device: Any, dtype: Any
    ) -> SharedPrefixLayout:
        """From the block bounds and each token's part (0: the block's prompt, k: its k-th
        response; the padding tail is a block with a prompt only)."""
        import torch

        segments = segments.to(device=device, dtype=torch.long)
        total = segments.numel()
        bounds = block_bounds.to(device=device, dtype=torch.long)
        block = torch.repeat_interleave(
            torch.arange(bounds.numel() - 1, device=device), bounds[1:] - bounds[:-1]
        )
        # a row is a run of tokens of one part of one block
        new_row = torch.ones(total, dtype=torch.bool, device=device)
        new_row[1:] = (block[1:] != block[:-1]) | (segments[1:] != segments[:-1])
        starts = new_row.nonzero().flatten()
        row_of = new_row.long().cumsum(0) - 1
        lengths = torch.diff(starts, append=torch.tensor([total], device=device))
        position = torch.arange(total, device=device) - starts[row_of]
        is_prompt = segments[starts] == 0
        # each row's prompt: its block's first row when that row is a prompt
        row_block = block[starts]
        first_row = torch.searchsorted(row_block, row_block)
        has_prompt = is_prompt[first_row] & ~is_prompt
        prompt_start = starts[first_row]
        prompt_length = torch.where(has_prompt, lengths[first_row], 0)

        prompt_rows = is_prompt.nonzero().flatten()
        response_rows = (~is_prompt).nonzero().flatten()
        prompts = _prompt_group(starts[prompt_rows], lengths[prompt_rows], dtype)
        responses = _response_group(
            starts[response_rows],
            lengths[response_rows],
            prompt_start[response_rows],
            prompt_length[response_rows],
            dtype,
        )
        # output slots: the prompt call's [rows, q_len] first, then the response call's
        rank = torch.empty(starts.numel(), dtype=torch.long, device=device)
        rank[prompt_rows] = torch.arange(prompt_rows.numel(), device=device)
        rank[response_rows] = torch.arange(response_rows.numel(), device=device)
        prompt_slots = prompts.queries.numel() if prompts is not None else 0
        q_len = torch.where(
            is_prompt,
            prompts.queries.shape[1] if prompts is not None else 0,
            responses.queries.shape[1] if responses is not None else 0,
        )
        base = torch.where(is_prompt, 0, prompt_slots) + rank * q_len
        return cls(prompts, responses, base[row_of] + position)

    def attend(self, query: Any, key: Any, value: Any, scale: float, dropout: float) -> Any:
        """[T, heads, dim] query / key / value -> [T, heads * dim]."""
        import torch

        parts = [
            group.attend(query, key, value, scale, dropout)
            for group in (self.prompts, self.responses)
            if group is not None
        ]
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return gather_rows(out, self.output_index).reshape(query.shape[0], -1)


def _spans(starts: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, longest] token indices of contiguous spans (padding clamped to the span's
    start) and which of them are real."""
    import torch

    steps = torch.arange(int(lengths.max()), device=starts.device)
    real = steps[None, :] < lengths[:, None]
    return torch.where(real, starts[:, None] + steps[None, :], starts[:, None]), real


def _additive(allowed: torch.Tensor, dtype: Any) -> torch.Tensor:
    import torch

    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, float("-inf"))[:, None]


def _causal_within(real: torch.Tensor) -> torch.Tensor:
    """[rows, q, k]: a span's token sees its own earlier ones, a query-padding slot the whole
    span (so no query row is empty)."""
    import torch

    steps = torch.arange(real.shape[1], device=real.device)
    return ((steps[None, :] <= steps[:, None]) | ~real[:, :, None]) & real[:, None, :]


def _prompt_group(starts: torch.Tensor, lengths: torch.Tensor, dtype: Any) -> _RowGroup | None:
    """Each prompt causal over itself."""
    if starts.numel() == 0:
        return None
    index, real = _spans(starts, lengths)
    return _RowGroup(index, index, _additive(_causal_within(real), dtype))


def _response_group(
    starts: torch.Tensor,
    lengths: torch.Tensor,
    prompt_starts: torch.Tensor,
    prompt_lengths: torch.Tensor,
    dtype: Any,
) -> _RowGroup | None:
    """Each response over its prompt's keys, then its own earlier ones."""
    import torch

    if starts.numel() == 0:
        return None
    own, own_real = _spans(starts, lengths)
    if int(prompt_lengths.max()) > 0:
        prefix, prefix_real = _spans(prompt_starts, prompt_lengths)
    else:  # no response has a prompt: no prefix columns
        prefix = own[:, :0]
        prefix_real = own_real[:, :0]
    allowed = torch.cat(
        [prefix_real[:, None, :].expand(-1, own.shape[1], -1), _causal_within(own_real)], dim=2
    )
    return _RowGroup(own, torch.cat([prefix, own], dim=1), _additive(allowed, dtype))
