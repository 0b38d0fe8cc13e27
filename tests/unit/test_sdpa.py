"""`mindrl.models.sdpa`: torch's fused attention, run in fp32 on CPU for a bf16 call that will
be differentiated (torch's CPU flash-attention backward is ~2x slower at bf16), in the given
dtype otherwise; the same outputs and gradients as torch's own call either way."""

from __future__ import annotations

import pytest
import torch

import mindrl.models.head_log_probs as head
from mindrl.models.sdpa import scaled_dot_product_attention


def _inputs(dtype: torch.dtype, grad: bool):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 5, 8, generator=gen).to(dtype).requires_grad_(grad) for _ in "qkv")
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    mask = torch.zeros(3, 1, 5, 5, dtype=dtype).masked_fill(~allowed, float("-inf"))
    return q, k, v, mask


def _kernel_dtypes(monkeypatch) -> list[torch.dtype]:
    seen: list[torch.dtype] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def recording(q, *args, **kwargs):
        seen.append(q.dtype)
        return real(q, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return seen


@pytest.mark.parametrize(
    ("dtype", "grad", "kernel_dtype"),
    [
        (torch.bfloat16, True, torch.float32),  # training at bf16: the fp32 kernel
        (torch.bfloat16, False, torch.bfloat16),  # forward only: bf16 is the faster one
        (torch.float32, True, torch.float32),
    ],
)
def test_attention_runs_at_the_faster_precision_with_the_same_results(
    dtype, grad, kernel_dtype, monkeypatch
):
    q, k, v, mask = _inputs(dtype, grad)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    if grad:
        expected.float().square().sum().backward()
        expected_grads = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
    seen = _kernel_dtypes(monkeypatch)
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    assert seen == [kernel_dtype]
    assert out.dtype == dtype and out.requires_grad == grad
    tol = 1e-6 if dtype == torch.float32 else 2.0**-7  # bf16: the output's last rounding
    assert float((out.float() - expected.float()).abs().max()) <= tol
    if grad:
        out.float().square().sum().backward()
        for got, want in zip((q.grad, k.grad, v.grad), expected_grads):
            assert got.dtype == dtype
            scale = max(1.0, float(want.float().abs().max()))
            assert float((got.float() - want.float()).abs().max()) <= 4 * tol * scale


def test_bf16_added_into_fp32_a_block_of_rows_at_a_time(monkeypatch):
    monkeypatch.setattr(head, "MIXED_ADD_ROWS", 3)  # 10 rows: blocks of 3, 3, 3, 1
    gen = torch.Generator().manual_seed(1)
    dst = torch.randn(10, 4, generator=gen)
    src = torch.randn(10, 4, generator=gen).bfloat16()
    expected = dst + src.float()
    head.add_mixed_(dst, src)
    assert torch.equal(dst, expected)
