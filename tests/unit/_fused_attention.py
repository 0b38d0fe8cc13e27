"""Fresh-process helper for test_packing_layout.py: megatron's local core attention with and
without the fused path (`SegmentedDotProductAttention._fused_ok`), on a left-padded causal
batch with grouped-query heads; outputs and gradients on the real tokens."""

from __future__ import annotations

from typing import Any

from tests.fresh_process import json_main


def main(args: dict[str, Any]) -> dict[str, Any]:
    import torch
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from mindrl.models.logprobs import causal_attention_mask
    from mindrl.models.packed_attention import SegmentedDotProductAttention
    from mindrl.models.parallel import init_parallel

    init_parallel(1, 1, accelerator="cpu", seed=1)
    heads, groups, dim, seq, batch = 4, 2, 16, 12, 3
    config = TransformerConfig(
        num_layers=1,
        hidden_size=heads * dim,
        num_attention_heads=heads,
        num_query_groups=groups,
        params_dtype=torch.float32,
        attention_dropout=0.0,  # as mindrl's models (a training dropout takes megatron's path)
    )
    attention = SegmentedDotProductAttention(
        config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self"
    )
    gen = torch.Generator().manual_seed(0)
    q0 = torch.randn(seq, batch, heads, dim, generator=gen)
    k0 = torch.randn(seq, batch, groups, dim, generator=gen)
    v0 = torch.randn(seq, batch, groups, dim, generator=gen)
    tokens = torch.ones(batch, seq, dtype=torch.long)
    tokens[1, :5] = 0  # left padding
    tokens[2, :9] = 0
    mask = causal_attention_mask(seq, tokens)
    real = tokens.bool().T[..., None]  # [s, b, 1]
    out: dict[str, Any] = {"fused_ok": attention._fused_ok(mask, None)}
    results = {}
    for name in ("fused", "megatron"):
        q, k, v = (t.clone().requires_grad_(True) for t in (q0, k0, v0))
        if name == "fused":
            context = attention(q, k, v, mask)
        else:  # megatron's own path
            context = super(SegmentedDotProductAttention, attention).forward(q, k, v, mask)
        (context * real).square().sum().backward()
        results[name] = (context * real, q.grad, k.grad, v.grad)
    diffs = [(a - b).abs().max().item() for a, b in zip(results["fused"], results["megatron"])]
    out["max_abs_diff"] = max(diffs)
    out["finite"] = all(bool(torch.isfinite(t).all()) for t in results["fused"])
    return out


if __name__ == "__main__":
    json_main(main)
