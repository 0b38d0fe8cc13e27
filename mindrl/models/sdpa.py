"""torch's fused attention (`scaled_dot_product_attention`), at the precision that is fast
for the call on its device.

On CPU, torch's flash-attention backward at bf16 / fp16 runs ~2x slower than at fp32 while
its forward is faster at bf16 (measured, torch 2.13 on a Xeon with AMX, SmolLM2's shapes:
[16 rows, 9 heads, 64 queries, 111 keys] fwd + bwd 29 ms at bf16, 15-18 ms with q, k, v and
the mask in fp32 and the output cast back). So a CPU call that will be differentiated runs in
fp32; the result is returned in the inputs' dtype. The softmax accumulates in fp32 in both
kernels, so the numbers differ by the last bf16 rounding at most. Elsewhere (CUDA, NPU, no
gradient) the call is torch's as is.
"""

from __future__ import annotations

from typing import Any


def scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    *,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Any:
    """`torch.nn.functional.scaled_dot_product_attention`, upcast where that is faster."""
    import torch

    dtype = query.dtype
    upcast = (
        query.device.type == "cpu"
        and dtype in (torch.bfloat16, torch.float16)
        and torch.is_grad_enabled()
        and any(t.requires_grad for t in (query, key, value))
    )
    if upcast:
        query, key, value = query.float(), key.float(), value.float()
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.float()
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale
    )
    return out.to(dtype) if upcast else out
