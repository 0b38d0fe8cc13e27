"""Where each token of a context-parallel micro-batch lives (MindSpeed's layouts, by
`context_parallel_algo`), the groups its ranks exchange over, and the micro-batch's layout
handed to the core attention (`ContextParallelParams`).

CP = ring x Ulysses ranks; the sequence of S tokens is cut into 2 x ring chunks and ring
rank r holds chunks r and 2 x ring - 1 - r (megatron's load-balanced pairs: causal
attention costs every ring rank the same), and the Ulysses ranks of a ring rank split its
tokens into equal consecutive parts. `megatron_cp_algo` (ring attention) is Ulysses 1,
`ulysses_cp_algo` ring 1 (a plain consecutive split), `hybrid_cp_algo` Ulysses
`ulysses_degree_in_cp` inside ring CP / that; CP rank c is ring rank c // Ulysses, Ulysses
rank c % Ulysses (MindSpeed's groups: Ulysses groups of consecutive CP ranks, ring groups
strided).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

CP_ALGORITHMS = ("megatron_cp_algo", "ulysses_cp_algo", "hybrid_cp_algo")
RING_KV_EXCHANGES = ("pass", "gather")


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


@dataclass(frozen=True)
class CPLayout:
    """How CP ranks split a sequence: `ring` x `ulysses` = `cp_size`."""

    cp_size: int
    ulysses: int

    @property
    def ring(self) -> int:
        return self.cp_size // self.ulysses

    @classmethod
    def of(cls, algo: str, cp_size: int, ulysses_degree: int | None = None) -> CPLayout:
        if algo not in CP_ALGORITHMS:
            raise ValueError(
                f"context_parallel_algo {algo!r} is not built on megatron's local attention "
                f"(built: {', '.join(CP_ALGORITHMS)})"
            )
        if algo == "megatron_cp_algo":
            return cls(cp_size, 1)
        if algo == "ulysses_cp_algo":
            return cls(cp_size, cp_size)
        u = ulysses_degree or 0
        if not (1 < u < cp_size and cp_size % u == 0):
            raise ValueError(
                f"hybrid_cp_algo: ulysses_degree_in_cp ({ulysses_degree}) must divide "
                f"context_parallel_size ({cp_size}) and leave a ring of 2 or more"
            )
        return cls(cp_size, u)

    def ring_index(self, seq: int, ring_rank: int, device: Any = None) -> torch.Tensor:
        """Global positions of ring rank `ring_rank`'s tokens ([S / ring])."""
        if seq % (2 * self.cp_size):
            raise ValueError(
                f"sequence length {seq} is not a multiple of 2 x CP = {2 * self.cp_size}"
            )
        return chunk_index(seq, self.ring, ring_rank, device)

    def local_index(self, seq: int, cp_rank: int, device: Any = None) -> torch.Tensor:
        """Global positions of CP rank `cp_rank`'s tokens ([S / CP])."""
        ring_rank, ulysses_rank = divmod(cp_rank, self.ulysses)
        return self.ring_index(seq, ring_rank, device).chunk(self.ulysses)[ulysses_rank]

    def order(self, seq: int, device: Any = None) -> torch.Tensor:
        """For the CP ranks' tokens concatenated in rank order, the index of each global
        position in that concatenation."""
        ranks = torch.cat([self.local_index(seq, r) for r in range(self.cp_size)])
        return inverse_permutation(ranks).to(device)


def inverse_permutation(permutation: torch.Tensor) -> torch.Tensor:
    n = permutation.numel()
    return torch.empty_like(permutation).index_copy_(0, permutation, torch.arange(n))


_SUBGROUPS: dict[tuple[tuple[int, ...], int], tuple[Any, Any]] = {}


def cp_subgroups(layout: CPLayout) -> tuple[Any, Any]:
    """(ring group, Ulysses group) of this rank inside megatron's CP group (None where that
    size is 1). Sub-groups are made once per CP group and layout, by every rank of the world
    together (`new_group` is collective), so the first call is a collective too."""
    from megatron.core import parallel_state as ps

    cp_group = ps.get_context_parallel_group()
    if layout.ulysses == 1:
        return cp_group, None
    if layout.ring == 1:
        return None, cp_group
    mine = tuple(ps.get_context_parallel_global_ranks())
    key = (mine, layout.ulysses)
    if key not in _SUBGROUPS:
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        ring_group = ulysses_group = None
        u = layout.ulysses
        for ranks in sorted(set(every)):
            for part in [ranks[i : i + u] for i in range(0, len(ranks), u)]:
                group = dist.new_group(list(part))
                ulysses_group = (
                    group if ranks == mine and dist.get_rank() in part else ulysses_group
                )
            for start in range(u):
                part = ranks[start::u]
                group = dist.new_group(list(part))
                ring_group = group if ranks == mine and dist.get_rank() in part else ring_group
        _SUBGROUPS[key] = (ring_group, ulysses_group)
    return _SUBGROUPS[key]


def forget_cp_subgroups() -> None:
    """Drop the sub-groups (megatron's parallel state was destroyed with their parents)."""
    _SUBGROUPS.clear()


@dataclass
class ContextParallelParams:
    """One micro-batch's CP layout, riding in megatron's `packed_seq_params` argument
    (format `sbhd`: megatron hands it to the core attention untouched).

    `query_index`: this rank's tokens' global positions; `ring_rows`: its ring rank's (the
    queries after Ulysses' exchange). `segments`: every global token's packed segment (None:
    one padded sequence per row, masked by `full_mask`). `positions`: this rank's tokens'
    rotary positions. `gather_order` / `ring_order`: the global order of the CP group's /
    ring group's tokens concatenated by rank. `ring_kv`: how keys / values cross the ring
    (`RING_KV_EXCHANGES`)."""

    group: Any
    layout: CPLayout
    cp_rank: int
    seq: int
    query_index: torch.Tensor  # [S / CP]
    positions: torch.Tensor  # [S / CP]
    ring_rows: torch.Tensor  # [S / ring]
    gather_order: torch.Tensor  # [S]
    ring_order: torch.Tensor  # [S]
    ring_group: Any = None
    ulysses_group: Any = None
    ring_kv: str = "pass"
    segments: torch.Tensor | None = None  # [S] packed: segment of each token, -1 = padding
    full_mask: torch.Tensor | None = None  # [b, 1, S, S] padded: megatron's (True = masked)
    qkv_format: str = "sbhd"
    cp_group: Any = None  # what megatron reads (rotary: none, positions come from here)
    max_seqlen_q: int = 0
    max_seqlen_kv: int = 0
    _masks: dict[Any, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    @property
    def cp_size(self) -> int:
        return self.layout.cp_size

    @property
    def ring_size(self) -> int:
        return self.layout.ring

    @property
    def ulysses_size(self) -> int:
        return self.layout.ulysses

    def allowed(self, rows: torch.Tensor, dtype: Any, source: int | None = None) -> torch.Tensor:
        """Additive mask [b or 1, 1, len(rows), keys] for queries at global positions `rows`
        over every key (or, with `source`, over ring rank `source`'s keys): causal within a
        packed segment, or megatron's padded mask (the diagonal always allowed, so a
        left-padding row is not empty). Built by the first layer that asks and shared by the
        others (each would keep its own for the backward)."""
        key = (rows.device, dtype, int(rows.numel()), source)
        if key not in self._masks:
            keys = torch.arange(self.seq, device=rows.device)
            if source is not None:
                keys = self.layout.ring_index(self.seq, source, rows.device)
            self._masks[key] = self._build_mask(rows, keys, dtype)
        return self._masks[key]

    def _build_mask(self, rows: torch.Tensor, keys: torch.Tensor, dtype: Any) -> torch.Tensor:
        device = rows.device
        diagonal = keys[None, :] == rows[:, None]
        if self.segments is None:
            assert self.full_mask is not None
            masked = self.full_mask.index_select(2, rows).index_select(3, keys) & ~diagonal
        else:
            seg = self.segments.to(device)
            ok = (seg[rows][:, None] == seg[keys][None, :]) & (keys[None, :] <= rows[:, None])
            masked = (~(ok | diagonal))[None, None]
        return torch.zeros(masked.shape, dtype=dtype, device=device).masked_fill_(
            masked, float("-inf")
        )
