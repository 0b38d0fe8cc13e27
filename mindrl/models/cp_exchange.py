"""What context-parallel ranks exchange (`mindrl.models.cp_layout` lays the tokens
out): the gather of a sequence over a group, Ulysses' all-to-all over heads, and the
attention of this rank's queries that puts them together.

The three algorithms are one path with two group sizes (ring x Ulysses = CP): Ulysses first
trades the sequence split for a head split inside its group (each rank then holds its ring
rank's tokens with heads / Ulysses of the heads), then the ring group's keys and values
reach every query of those tokens, and Ulysses trades the output back.
`megatron_cp_algo` is Ulysses 1, `ulysses_cp_algo` ring 1, and `hybrid_cp_algo` both
above 1 (MindSpeed's `ulysses_degree_in_cp`). Across the ring, keys and values either
travel round the ring block by block (`mindrl.models.cp_ring`, `cp_ring_kv: pass`: this
rank keeps one other block at a time) or are all-gathered in one collective (`gather`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from mindrl.models.cp_layout import ContextParallelParams


class _GatherSequence(torch.autograd.Function):
    """All-gather [s_local, ...] over `group` and put the rows in order (`order`: the index
    of each output row in the ranks' concatenation); the backward sums the ranks' gradients
    and returns this rank's rows (`mine`: their positions in the output)."""

    @staticmethod
    def forward(
        ctx: Any, t: torch.Tensor, group: Any, order: torch.Tensor, mine: torch.Tensor
    ) -> torch.Tensor:
        ctx.group, ctx.mine = group, mine
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, t.contiguous(), group=group)
        return torch.cat(parts, dim=0).index_select(0, order.to(t.device))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        return total.index_select(0, ctx.mine.to(grad.device)), None, None, None


def gather_sequence(t: torch.Tensor, params: ContextParallelParams) -> torch.Tensor:
    """This rank's [S / CP, ...] rows -> the whole sequence [S, ...] in order, on every CP
    rank (the decoder's output before the output layer)."""
    out: torch.Tensor = _GatherSequence.apply(
        t, params.group, params.gather_order, params.query_index
    )
    return out


def gather_ring(t: torch.Tensor, params: ContextParallelParams) -> torch.Tensor:
    """This ring rank's [S / ring, ...] rows -> the whole sequence, over the ring group."""
    if params.ring_size == 1:
        return t
    out: torch.Tensor = _GatherSequence.apply(
        t, params.ring_group, params.ring_order, params.ring_rows
    )
    return out


class _AllToAllHeads(torch.autograd.Function):
    """Ulysses' exchange inside its group: [s_local, b, heads, d] (sequence split) ->
    [s_local x U, b, heads / U, d] (the group's tokens in rank order, head block u on
    Ulysses rank u), and back (`inverse`)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, group: Any, inverse: bool) -> torch.Tensor:
        ctx.group, ctx.inverse = group, inverse
        return _heads_exchange(t, group, inverse)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _heads_exchange(grad, ctx.group, not ctx.inverse), None, None


def _heads_exchange(t: torch.Tensor, group: Any, inverse: bool) -> torch.Tensor:
    size = dist.get_world_size(group)
    if not inverse:  # head block j of my tokens to rank j; its tokens follow in rank order
        sends = [c.contiguous() for c in t.chunk(size, dim=2)]
        receives = [torch.empty_like(sends[0]) for _ in range(size)]
        _all_to_all(receives, sends, group)
        return torch.cat(receives, dim=0)
    # the group's tokens of my heads: rank j's rows go back to rank j
    sends = [c.contiguous() for c in t.chunk(size, dim=0)]
    receives = [torch.empty_like(sends[0]) for _ in range(size)]
    _all_to_all(receives, sends, group)
    return torch.cat(receives, dim=2)


def _all_to_all(receives: list[torch.Tensor], sends: list[torch.Tensor], group: Any) -> None:
    if dist.get_backend(group) != "gloo":
        dist.all_to_all(receives, sends, group=group)
        return
    # gloo has no list all-to-all: each rank's blocks broadcast in turn
    me = dist.get_rank(group)
    for source in range(len(sends)):
        stacked = torch.stack(sends) if source == me else torch.empty_like(torch.stack(sends))
        dist.broadcast(stacked, src=dist.get_global_rank(group, source), group=group)
        receives[source].copy_(stacked[me])


def context_parallel_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    params: ContextParallelParams,
    *,
    scale: float,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Attention of this rank's queries [s_local, b, heads, d] over the whole sequence's
    keys / values (grouped-query heads as they are); returns [s_local, b, heads * d]."""
    from mindrl.models.sdpa import scaled_dot_product_attention

    ulysses = params.ulysses_size
    if ulysses > 1:
        kv_heads = key.shape[2]
        if kv_heads % ulysses:  # too few key / value heads to split: repeat them
            repeat = query.shape[2] // kv_heads
            key, value = (t.repeat_interleave(repeat, dim=2) for t in (key, value))
        query, key, value = (
            _AllToAllHeads.apply(t, params.ulysses_group, False) for t in (query, key, value)
        )
    rows = params.ring_rows.to(query.device)
    if params.ring_size > 1 and params.ring_kv == "pass" and dropout == 0.0:
        from mindrl.models.cp_ring import ring_attention

        out = ring_attention(query, key, value, params, scale=scale)
    else:
        key, value = gather_ring(key, params), gather_ring(value, params)
        mask = params.allowed(rows, query.dtype)
        out = scaled_dot_product_attention(
            *(t.permute(1, 2, 0, 3) for t in (query, key, value)),
            attn_mask=mask,
            dropout_p=dropout,
            scale=scale,
        ).permute(2, 0, 1, 3)  # [rows, b, heads here, d]
    if ulysses > 1:
        out = _AllToAllHeads.apply(out.contiguous(), params.ulysses_group, True)
    return out.reshape(out.shape[0], out.shape[1], -1)
