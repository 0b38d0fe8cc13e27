"""Context parallelism for megatron-core's local attention (CPU over gloo, or wherever
Transformer Engine is absent): each sequence split over the CP ranks.

megatron's load-balanced layout: a micro-batch's sequence of S tokens is cut into 2 x CP
chunks and CP rank r holds chunks r and 2 x CP - 1 - r, so every rank gets an equal share of
the causal attention's work. Everything in the decoder (embedding, norms, linears, MLP and
their activations) then runs on the rank's S / CP tokens; only attention needs the others:
- `megatron_cp_algo` (MindSpeed-RL's ring attention): each rank's keys and values are
  all-gathered over the CP group (the same blocks a ring passes around, exchanged in one
  collective; the backward sums each block's gradient back to its owner), and the rank's
  queries attend to them under the causal (or packed-segment) mask of their global
  positions;
- `ulysses_cp_algo`: an all-to-all trades the sequence split for a head split (each rank
  attends over the whole sequence with heads / CP of the heads) and a second one trades it
  back.
The decoder's output (hidden states after the final norm) is gathered back to the whole
sequence before the output layer, so the log-prob / entropy / loss code sees the sequence it
sees without CP, identical on every CP rank; the gather's backward sums the CP ranks'
gradients, which makes every parameter's gradient summed over the CP ranks CP times the
whole gradient, and megatron's DDP (averaging over data x context parallel ranks) divides
it back out. Rotary positions follow each token's global position (or its position in its
packed segment). Weights are not split by CP: checkpoints and the weight sync see the
ordinary TP x PP layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

CP_ALGORITHMS = ("megatron_cp_algo", "ulysses_cp_algo")


def segment_positions(cu_seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(segment, position) of every packed token, both [cu_seqlens[-1]] long, from the
    segments' bounds `cu_seqlens` ([segments + 1], starting at 0)."""
    bounds = cu_seqlens.to(torch.long)
    lengths = bounds[1:] - bounds[:-1]
    segment = torch.repeat_interleave(torch.arange(lengths.numel(), device=bounds.device), lengths)
    position = torch.arange(segment.numel(), device=bounds.device) - bounds[segment]
    return segment, position


def chunk_index(seq: int, cp_size: int, cp_rank: int, device: Any = None) -> torch.Tensor:
    """Global positions of this CP rank's tokens ([seq / cp_size]): chunks r and 2cp-1-r of
    the sequence cut into 2 x cp_size chunks (megatron's `get_batch_on_this_cp_rank`)."""
    if seq % (2 * cp_size):
        raise ValueError(f"sequence length {seq} is not a multiple of 2 x CP = {2 * cp_size}")
    chunk = seq // (2 * cp_size)
    starts = (cp_rank * chunk, (2 * cp_size - 1 - cp_rank) * chunk)
    return torch.cat([torch.arange(s, s + chunk, device=device) for s in starts])


def global_order(seq: int, cp_size: int, device: Any = None) -> torch.Tensor:
    """For the CP ranks' tokens concatenated in rank order, the index of each global
    position in that concatenation (gathered[global_order] is the sequence in order)."""
    ranks = torch.cat([chunk_index(seq, cp_size, r) for r in range(cp_size)])
    return torch.empty_like(ranks).index_copy_(0, ranks, torch.arange(seq)).to(device)


@dataclass
class ContextParallelParams:
    """One micro-batch's CP layout, riding in megatron's `packed_seq_params` argument
    (format `sbhd`: megatron hands it to the core attention untouched).

    `query_index`: this rank's tokens' global positions. `segments`: every global token's
    packed segment (None: one padded sequence per row, masked by `full_mask`).
    `positions`: this rank's tokens' rotary positions."""

    group: Any
    cp_size: int
    cp_rank: int
    algo: str
    seq: int
    query_index: torch.Tensor  # [S / CP]
    positions: torch.Tensor  # [S / CP]
    segments: torch.Tensor | None = None  # [S] packed: segment of each token, -1 = padding
    full_mask: torch.Tensor | None = None  # [b, 1, S, S] padded: megatron's (True = masked)
    qkv_format: str = "sbhd"
    cp_group: Any = None  # what megatron reads (rotary: none, positions come from here)
    max_seqlen_q: int = 0
    max_seqlen_kv: int = 0
    _masks: dict[Any, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    def allowed(self, rows: torch.Tensor, dtype: Any) -> torch.Tensor:
        """Additive mask [b or 1, 1, len(rows), S] for queries at global positions `rows`
        over every key: causal within a packed segment, or megatron's padded mask (the
        diagonal always allowed, so a left-padding row is not empty). Built by the first
        layer that asks and shared by the others (each would keep its own for the backward)."""
        key = (rows.device, dtype, int(rows.numel()))
        if key not in self._masks:
            self._masks[key] = self._build_mask(rows, dtype)
        return self._masks[key]

    def _build_mask(self, rows: torch.Tensor, dtype: Any) -> torch.Tensor:
        device = rows.device
        keys = torch.arange(self.seq, device=device)
        diagonal = keys[None, :] == rows[:, None]
        if self.segments is None:
            assert self.full_mask is not None
            masked = self.full_mask.index_select(2, rows) & ~diagonal
        else:
            seg = self.segments.to(device)
            ok = (seg[rows][:, None] == seg[None, :]) & (keys[None, :] <= rows[:, None])
            masked = (~(ok | diagonal))[None, None]
        return torch.zeros(masked.shape, dtype=dtype, device=device).masked_fill_(
            masked, float("-inf")
        )


class _GatherSequence(torch.autograd.Function):
    """All-gather [s_local, ...] tensors over the CP group into the global order [S, ...];
    the backward sums the ranks' gradients and returns this rank's rows."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, params: ContextParallelParams) -> torch.Tensor:
        ctx.params = params
        parts = [torch.empty_like(t) for _ in range(params.cp_size)]
        dist.all_gather(parts, t.contiguous(), group=params.group)
        order = global_order(params.seq, params.cp_size, t.device)
        return torch.cat(parts, dim=0).index_select(0, order)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        params: ContextParallelParams = ctx.params
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=params.group)
        return total.index_select(0, params.query_index.to(grad.device)), None


def gather_sequence(t: torch.Tensor, params: ContextParallelParams) -> torch.Tensor:
    out: torch.Tensor = _GatherSequence.apply(t, params)
    return out


class _AllToAllHeads(torch.autograd.Function):
    """Ulysses' exchange: [s_local, b, heads, d] with the sequence split -> [S, b, heads/CP,
    d] with the heads split (global order), and back (`inverse`)."""

    @staticmethod
    def forward(
        ctx: Any, t: torch.Tensor, params: ContextParallelParams, inverse: bool
    ) -> torch.Tensor:
        ctx.params, ctx.inverse = params, inverse
        return _heads_exchange(t, params, inverse)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _heads_exchange(grad, ctx.params, not ctx.inverse), None, None


def _heads_exchange(t: torch.Tensor, params: ContextParallelParams, inverse: bool) -> torch.Tensor:
    cp = params.cp_size
    if not inverse:  # send head block j of my tokens to rank j
        sends = [c.contiguous() for c in t.chunk(cp, dim=2)]
        receives = [torch.empty_like(sends[0]) for _ in range(cp)]
        _all_to_all(receives, sends, params.group)
        order = global_order(params.seq, cp, t.device)
        return torch.cat(receives, dim=0).index_select(0, order)
    # [S, b, heads/CP, d]: rank j's tokens of my heads go back to rank j
    sends = [
        t.index_select(0, chunk_index(params.seq, cp, r, t.device)).contiguous() for r in range(cp)
    ]
    receives = [torch.empty_like(sends[0]) for _ in range(cp)]
    _all_to_all(receives, sends, params.group)
    return torch.cat(receives, dim=2)


def _all_to_all(receives: list[torch.Tensor], sends: list[torch.Tensor], group: Any) -> None:
    """gloo has no list all-to-all: one all-gather per source rank's blocks."""
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

    if params.algo == "ulysses_cp_algo":
        kv_heads = key.shape[2]
        if kv_heads % params.cp_size:  # too few key / value heads to split: repeat them
            repeat = query.shape[2] // kv_heads
            key, value = (t.repeat_interleave(repeat, dim=2) for t in (key, value))
        q, k, v = (_AllToAllHeads.apply(t, params, False) for t in (query, key, value))
        rows = torch.arange(params.seq, device=query.device)
    else:
        q = query
        k, v = gather_sequence(key, params), gather_sequence(value, params)
        rows = params.query_index.to(query.device)
    mask = params.allowed(rows, q.dtype)
    out = scaled_dot_product_attention(
        *(t.permute(1, 2, 0, 3) for t in (q, k, v)), attn_mask=mask, dropout_p=dropout, scale=scale
    ).permute(2, 0, 1, 3)  # [rows, b, heads here, d]
    if params.algo == "ulysses_cp_algo":
        out = _AllToAllHeads.apply(out.contiguous(), params, True)
    return out.reshape(out.shape[0], out.shape[1], -1)


def cp_size_rank_group() -> tuple[int, int, Any]:
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 1, 0, None
    return (
        ps.get_context_parallel_world_size(),
        ps.get_context_parallel_rank(),
        ps.get_context_parallel_group(),
    )


def split_micro_batch(
    args: tuple[Any, ...], kwargs: dict[str, Any], algo: str
) -> tuple[tuple[Any, ...], dict[str, Any], ContextParallelParams]:
    """GPTModel's (input_ids, position_ids, attention_mask, ...) cut to this rank's tokens,
    with the layout in `packed_seq_params`."""
    cp, rank, group = cp_size_rank_group()
    names = ("input_ids", "position_ids", "attention_mask")
    values = dict(zip(names, args))
    rest = args[len(names) :]
    values.update({n: kwargs.pop(n) for n in names if n in kwargs})
    input_ids = values["input_ids"]
    packed = kwargs.pop("packed_seq_params", None)
    seq = int(input_ids.shape[1])
    device = input_ids.device
    index = chunk_index(seq, cp, rank, device)
    segments, full_mask = None, None
    positions = index
    if packed is not None:
        if getattr(packed, "qkv_format", None) != "thd":
            raise ValueError(
                f"context parallelism with {type(packed).__name__} is not built "
                "(share_prompt_forward)"
            )
        cu = packed.cu_seqlens_q.to(device)
        seg, pos = segment_positions(cu)
        pad = seq - seg.numel()  # a packed row's tail past its last segment
        segments = torch.cat([seg, seg.new_full((pad,), -1)])
        all_positions = torch.cat([pos, torch.arange(pad, device=device)])
        positions = all_positions[index]
    else:
        full_mask = values["attention_mask"]
        if full_mask is None:
            full_mask = torch.ones(seq, seq, dtype=torch.bool, device=device).triu(1)[None, None]
    params = ContextParallelParams(
        group=group,
        cp_size=cp,
        cp_rank=rank,
        algo=algo,
        seq=seq,
        query_index=index,
        positions=positions,
        segments=segments,
        full_mask=full_mask,
        max_seqlen_q=seq,
        max_seqlen_kv=seq,
    )
    local_mask = None if full_mask is None else full_mask.index_select(2, index)
    position_ids = values.get("position_ids")
    new_args = (
        input_ids.index_select(1, index),
        None if position_ids is None else position_ids.index_select(1, index),
        local_mask,
        *rest,
    )
    kwargs["packed_seq_params"] = params
    return new_args, kwargs, params


def install_context_parallel(model: Any, algo: str) -> None:
    """Make this GPTModel chunk (built at CP > 1, one pipeline stage) split its inputs over
    the CP ranks, attend across them and return the whole sequence's output."""
    if algo not in CP_ALGORITHMS:
        raise ValueError(
            f"context_parallel_algo {algo!r} is not built on megatron's local attention "
            f"(built: {', '.join(CP_ALGORITHMS)})"
        )
    current: list[ContextParallelParams] = []

    def split(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        new_args, new_kwargs, params = split_micro_batch(args, dict(kwargs), algo)
        current[:] = [params]
        return new_args, new_kwargs

    def gather(_module: Any, _args: Any, output: Any) -> Any:
        if isinstance(output, tuple):
            return (gather_sequence(output[0], current[0]), *output[1:])
        return gather_sequence(output, current[0])

    model.register_forward_pre_hook(split, with_kwargs=True)
    model.decoder.register_forward_hook(gather)
    rotary = getattr(model, "rotary_pos_emb", None)
    if rotary is not None:
        original = rotary.forward
        rotary.cp_group = None  # positions are given per token below

        def at_positions(*_args: Any, **_kwargs: Any) -> torch.Tensor:
            params = current[0]
            longest = int(params.positions.max()) + 1
            emb: torch.Tensor = original(max(longest, params.seq))
            return emb[params.positions.to(emb.device)]

        rotary.forward = at_positions
