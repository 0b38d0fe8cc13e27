"""One rank of the context-parallel attention check (tests/integration/test_context_parallel.py):
megatron's parallel state at CP = the world, the same random queries / keys / values on every
rank (seeded), this rank's tokens attended across the CP group by `context_parallel_attention`
and, here alone, the whole sequence attended by torch's causal attention (per packed segment).
Forward outputs and the gradients of this rank's queries, keys and values are compared to
the whole sequence's rows of this rank.

Arguments: {"algo", "packed": bool, "ulysses": Ulysses degree (hybrid_cp_algo), "ring_kv"}. Result: {"out": max difference, "grads": max difference}.
"""

from __future__ import annotations

import os
from typing import Any

from tests.fresh_process import json_main

SEQ, BATCH, HEADS, KV_HEADS, DIM = 24, 2, 4, 2, 8
CU_SEQLENS = (0, 5, 14, 21)  # three packed segments; the row's last 3 tokens are padding
# (padding past the last segment: one more causal segment, as the split lays it out)


def reference(q: Any, k: Any, v: Any, packed: bool) -> Any:
    """Whole-sequence attention [S, b, heads * d]: causal (per segment when packed)."""
    import torch

    from mindrl.models.packed_attention import segmented_causal_attention

    if packed:
        cu = torch.tensor([*CU_SEQLENS, SEQ])
        return segmented_causal_attention(q[:, 0], k[:, 0], v[:, 0], cu, scale=DIM**-0.5)[:, None]
    mask = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
    out = torch.nn.functional.scaled_dot_product_attention(
        *(t.permute(1, 2, 0, 3) for t in (q, k.repeat_interleave(2, 2), v.repeat_interleave(2, 2))),
        attn_mask=mask,
        scale=DIM**-0.5,
    )
    return out.permute(2, 0, 1, 3).reshape(SEQ, q.shape[1], -1)


def main(args: dict[str, Any]) -> dict[str, Any]:
    import torch
    from megatron.core.packed_seq_params import PackedSeqParams

    from mindrl.models.context_parallel import split_micro_batch
    from mindrl.models.cp_exchange import context_parallel_attention
    from mindrl.models.cp_layout import CPLayout
    from mindrl.models.parallel import destroy_parallel, init_parallel

    torch.set_num_threads(1)
    world = int(os.environ["WORLD_SIZE"])
    init_parallel(1, 1, context_parallel_size=world, accelerator="cpu")
    packed = bool(args["packed"])
    batch = 1 if packed else BATCH
    gen = torch.Generator().manual_seed(7)
    q, k, v = (
        torch.randn(SEQ, batch, h, DIM, generator=gen, dtype=torch.float64)
        for h in (HEADS, KV_HEADS, KV_HEADS)
    )
    weight = torch.randn(SEQ, batch, HEADS * DIM, generator=gen, dtype=torch.float64)
    tokens = torch.zeros(batch, SEQ, dtype=torch.long)
    extra: dict[str, Any] = {}
    mask = None
    if packed:
        cu = torch.tensor(CU_SEQLENS, dtype=torch.int32)
        extra["packed_seq_params"] = PackedSeqParams(
            qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=9, max_seqlen_kv=9
        )
    else:
        mask = ~torch.ones(SEQ, SEQ, dtype=torch.bool).tril()[None, None].expand(batch, 1, -1, -1)
    layout = CPLayout.of(args["algo"], world, args.get("ulysses"))
    ring_kv = args.get("ring_kv", "gather")
    _, _, params = split_micro_batch((tokens, None, mask), extra, layout, ring_kv)
    index = params.query_index

    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = reference(*whole, packed)
    (expected * weight).sum().backward()

    local = [t.index_select(0, index).clone().requires_grad_() for t in (q, k, v)]
    out = context_parallel_attention(*local, params, scale=DIM**-0.5)
    (out * weight.index_select(0, index)).sum().backward()
    out_gap = float((out - expected.index_select(0, index)).detach().abs().max())
    grad_gap = max(
        float((mine.grad - full.grad.index_select(0, index)).abs().max())
        for mine, full in zip(local, whole)
    )
    destroy_parallel()
    return {"out": out_gap, "grads": grad_gap}


if __name__ == "__main__":
    json_main(main)
