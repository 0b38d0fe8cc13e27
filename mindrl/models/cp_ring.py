"""Ring attention proper: keys and values travel round the ring group a block at a time.

Each ring rank starts with its own tokens' keys / values; at every step it attends its
queries to the block it holds while passing that block on to the next ring rank and
receiving the previous rank's (send / receive over the ring group), so it never holds more
than two blocks of S / ring tokens. The blocks' partial results are merged by their
log-sum-exp (the online softmax): out = sum_j exp(lse_j - lse) out_j. The backward goes
round again with the saved log-sum-exp: each block's key / value gradients travel with the
block and reach their owner after one more pass. The gather in `cp_exchange.gather_ring`
(all blocks at once, S tokens of keys / values per rank) stays for attention dropout.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from mindrl.models.cp_layout import ContextParallelParams


def ring_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    params: ContextParallelParams,
    *,
    scale: float,
) -> torch.Tensor:
    """This ring rank's queries [s, b, heads, d] over every ring rank's keys / values
    [s, b, kv heads, d] (its own given); returns [s, b, heads, d]."""
    out: torch.Tensor = _RingAttention.apply(query, key, value, params, scale)
    return out


class _Ring:
    """This rank's neighbours in the ring group, and one step of passing tensors on."""

    def __init__(self, params: ContextParallelParams) -> None:
        group = params.ring_group
        size = params.ring_size
        self.group, self.size = group, size
        self.rank = params.cp_rank // params.ulysses_size
        self.next = dist.get_global_rank(group, (self.rank + 1) % size)
        self.previous = dist.get_global_rank(group, (self.rank - 1) % size)

    def source(self, step: int) -> int:
        """The ring rank whose block this rank holds at `step`."""
        return (self.rank - step) % self.size

    def start_pass(self, tensors: list[torch.Tensor]) -> _Passing:
        """Send `tensors` to the next ring rank and receive the previous rank's, in the
        background; `_Passing.received()` waits for them."""
        tensors = [t.contiguous() for t in tensors]
        received = [torch.empty_like(t) for t in tensors]
        requests = [dist.isend(t, self.next, group=self.group) for t in tensors]
        requests += [dist.irecv(r, self.previous, group=self.group) for r in received]
        return _Passing(received, requests)


class _Passing:
    def __init__(self, received: list[torch.Tensor], requests: list[Any]) -> None:
        self._received, self._requests = received, requests

    def received(self) -> list[torch.Tensor]:
        for request in self._requests:
            request.wait()
        return self._received


def _scores(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, scale: float, groups: int
) -> torch.Tensor:
    """[b, heads, s, s_block] scores of `q` [b, heads, s, d] over `k` [b, kv, s_k, d], in
    at least fp32."""
    k = k.repeat_interleave(groups, dim=1) if groups > 1 else k
    wide = _wide(q.dtype)
    return torch.matmul(q.to(wide), k.to(wide).transpose(-1, -2)) * scale + mask.to(wide)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        params: ContextParallelParams,
        scale: float,
    ) -> torch.Tensor:
        ring = _Ring(params)
        rows = params.ring_rows.to(query.device)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        groups = q.shape[1] // k.shape[1]
        wide = _wide(q.dtype)
        out = torch.zeros(q.shape, dtype=wide, device=q.device)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=wide, device=q.device)
        block = [k, v]
        for step in range(ring.size):  # the next block arrives while this one is attended
            passing = ring.start_pass(block) if step < ring.size - 1 else None
            mask = params.allowed(rows, wide, ring.source(step))
            scores = _scores(q, block[0], mask, scale, groups)
            block_lse = torch.logsumexp(scores, dim=-1)
            probs = torch.exp(scores - _finite(block_lse)[..., None])
            vb = block[1].repeat_interleave(groups, dim=1) if groups > 1 else block[1]
            partial = torch.matmul(probs, vb.to(wide))
            merged = torch.logaddexp(lse, block_lse)
            base = _finite(merged)
            out = (
                out * torch.exp(lse - base)[..., None]
                + partial * torch.exp(block_lse - base)[..., None]
            )
            lse = merged
            block = passing.received() if passing is not None else block
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.params, ctx.scale, ctx.groups = params, scale, groups
        return out.to(query.dtype).permute(2, 0, 1, 3)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        params: ContextParallelParams = ctx.params
        scale, groups = ctx.scale, ctx.groups
        ring = _Ring(params)
        rows = params.ring_rows.to(q.device)
        wide = out.dtype
        dout = grad.permute(1, 2, 0, 3).to(wide)  # [b, heads, s, d]
        delta = (dout * out).sum(-1, keepdim=True)
        dq = torch.zeros(q.shape, dtype=wide, device=q.device)
        block = [k, v, torch.zeros(k.shape, dtype=wide, device=k.device)]
        block.append(torch.zeros(v.shape, dtype=wide, device=v.device))
        gradients = block[2:]
        for step in range(ring.size):
            kb, vb, dk, dv = block
            # keys / values on ahead while this block is attended; their gradients follow
            passing = ring.start_pass([kb, vb]) if step < ring.size - 1 else None
            mask = params.allowed(rows, wide, ring.source(step))
            probs = torch.exp(_scores(q, kb, mask, scale, groups) - lse[..., None])
            kr = kb.repeat_interleave(groups, dim=1) if groups > 1 else kb
            vr = vb.repeat_interleave(groups, dim=1) if groups > 1 else vb
            dscores = probs * (torch.matmul(dout, vr.to(wide).transpose(-1, -2)) - delta)
            dq += torch.matmul(dscores, kr.to(wide)) * scale
            dk = dk + _per_kv_head(torch.matmul(dscores.transpose(-1, -2), q.to(wide)), groups)
            dv = dv + _per_kv_head(torch.matmul(probs.transpose(-1, -2), dout), groups)
            gradients = ring.start_pass([dk, dv]).received()
            if passing is not None:
                block = [*passing.received(), *gradients]
        dk, dv = gradients  # after the last pass each block's gradients are home
        dk = dk * scale
        return (
            dq.to(q.dtype).permute(2, 0, 1, 3),
            dk.to(k.dtype).permute(2, 0, 1, 3),
            dv.to(v.dtype).permute(2, 0, 1, 3),
            None,
            None,
        )


def _wide(dtype: torch.dtype) -> torch.dtype:
    """What the blocks' softmax and sums are computed in: fp32, or fp64 for fp64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """A log-sum-exp with rows that saw no key yet (-inf) at 0, so exp(x - it) stays 0."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def _per_kv_head(t: torch.Tensor, groups: int) -> torch.Tensor:
    """[b, heads, s, d] -> [b, kv heads, s, d]: the query heads of a group summed."""
    if groups == 1:
        return t
    b, heads, s, d = t.shape
    return t.view(b, heads // groups, groups, s, d).sum(dim=2)
