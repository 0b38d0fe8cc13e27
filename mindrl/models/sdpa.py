"""torch's fused attention (`scaled_dot_product_attention`), with a faster backward for bf16 on
CPU.

On CPU, torch's flash-attention backward is slower at bf16 than at fp32, while its forward
is not. So a differentiated bf16 call on CPU runs torch's bf16 forward kernel and keeps what
that kernel keeps (bf16 query, key, value, output and mask, fp32 log-sum-exp: the activations
the memory plan counts), and its backward casts them to fp32 for the duration of one call to
torch's fp32 backward kernel. Both kernels accumulate the softmax in fp32, so the gradients
differ from torch's own bf16 backward by bf16 rounding.
Every other call (fp32, CUDA, NPU, no gradient, dropout) is torch's as is.

Grouped-query attention (fewer key / value heads than query heads) goes to torch's CPU
kernels as it is: they read each key / value head for its group of query heads, forward and
backward, where repeating the heads first costs the copies and, in the backward, a strided sum
over each group (same outputs, gradients within fp32 rounding). Other devices get the heads
repeated, as before.

The packed and shared-prompt attentions also gather each layer's queries, keys, values and
outputs by token index, several times per layer and micro-batch, so the gather's backward
matters as much as the kernel's: `gather_rows` is that gather.
"""

from __future__ import annotations

import functools
from typing import Any


def _fused_cpu_backward_applies(query: Any, key: Any, value: Any, dropout_p: float) -> bool:
    import torch

    return (
        query.device.type == "cpu"
        and query.dtype == torch.bfloat16
        and key.dtype == value.dtype == query.dtype
        and dropout_p == 0.0
        and all(t.dim() == 4 and t.stride(-1) == 1 for t in (query, key, value))
        and torch.is_grad_enabled()
        and any(t.requires_grad for t in (query, key, value))
    )


def _additive(mask: Any, dtype: Any) -> Any:
    """torch's flash kernel takes an additive mask of the query's dtype (True = attend)."""
    import torch

    if mask is None or mask.dtype == dtype:
        return mask
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            ~mask, float("-inf")
        )
    return mask.to(dtype)


@functools.cache
def _make_function() -> Any:
    import torch

    ops = torch.ops.aten

    class _Bf16AttentionFp32Backward(torch.autograd.Function):
        """torch's bf16 flash forward; its backward at fp32 on the saved bf16 tensors."""

        @staticmethod
        def forward(ctx: Any, query: Any, key: Any, value: Any, mask: Any, scale: Any) -> Any:
            out, logsumexp = ops._scaled_dot_product_flash_attention_for_cpu(
                query, key, value, 0.0, False, attn_mask=mask, scale=scale
            )
            ctx.save_for_backward(query, key, value, out, logsumexp, mask)
            ctx.scale = scale
            return out

        @staticmethod
        def backward(ctx: Any, grad_out: Any) -> Any:
            query, key, value, out, logsumexp, mask = ctx.saved_tensors
            as_fp32 = [t.float() for t in (grad_out, query, key, value, out)]
            grads = ops._scaled_dot_product_flash_attention_for_cpu_backward(
                *as_fp32,
                logsumexp,
                0.0,
                False,
                attn_mask=None if mask is None else mask.float(),
                scale=ctx.scale,
            )
            dq, dk, dv = (g.to(t.dtype) for g, t in zip(grads, (query, key, value)))
            return dq, dk, dv, None, None

    return _Bf16AttentionFp32Backward


def scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    *,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Any:
    """`torch.nn.functional.scaled_dot_product_attention` ([batch, heads, seq, dim] inputs, a
    boolean (True = attend) or additive mask), with the fp32 backward where that is faster.
    `key` and `value` may hold fewer heads than `query` (grouped-query attention: query head
    h reads key / value head h // (query heads / key heads))."""
    import torch

    groups = _query_heads_per_kv_head(query, key, value)
    if groups > 1 and query.device.type != "cpu":
        key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
        groups = 1
    if not _fused_cpu_backward_applies(query, key, value, dropout_p):
        return torch.nn.functional.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            scale=scale,
            **({"enable_gqa": True} if groups > 1 else {}),
        )
    return _make_function().apply(query, key, value, _additive(attn_mask, query.dtype), scale)


def _query_heads_per_kv_head(query: Any, key: Any, value: Any) -> int:
    heads, kv_heads = query.shape[1], key.shape[1]
    if value.shape[1] != kv_heads or kv_heads < 1 or heads % kv_heads:
        raise ValueError(
            f"attention heads: {heads} query, {kv_heads} key, {value.shape[1]} value; the key "
            "and value heads must be equal and divide the query heads"
        )
    return heads // kv_heads


def gather_rows(t: Any, index: Any) -> Any:
    """`t[index]` for an integer `index` of any shape into `t`'s first dimension, as one
    `index_select`. Advanced indexing (`t[index]`) is differentiated by an accumulating
    `index_put` into a fresh zeroed tensor, which runs serially on CPU; `index_select`'s
    backward adds the gradient rows with `index_add` (summing a row gathered several times,
    as a prompt's keys are), which does not, and its bf16 sums stay closer to an fp64
    reference when rows repeat."""
    import torch

    return torch.index_select(t, 0, index.reshape(-1)).view(*index.shape, *t.shape[1:])
