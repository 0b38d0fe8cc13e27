"""`mindrl.models.sdpa`: torch's fused attention; a differentiated bf16 call on CPU keeps what
torch's bf16 kernel keeps and runs its backward at fp32. Outputs and gradients are torch's own
(to bf16 rounding), and the tensors kept for the backward are the same ones, at bf16."""

from __future__ import annotations

import pytest
import torch

from mindrl.models.sdpa import scaled_dot_product_attention


def _inputs(dtype: torch.dtype, grad: bool, boolean_mask: bool = False):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 2, 5, 8, generator=gen)
    k, v = (torch.randn(3, 2, 7, 8, generator=gen) for _ in "kv")
    q, k, v = (t.to(dtype).requires_grad_(grad) for t in (q, k, v))
    allowed = torch.ones(5, 7, dtype=torch.bool).tril(2)
    allowed[1, 4:] = True  # not only causal: any pattern
    if boolean_mask:
        return q, k, v, allowed.expand(3, 1, 5, 7)
    mask = torch.zeros(3, 1, 5, 7, dtype=dtype).masked_fill(~allowed, float("-inf"))
    return q, k, v, mask


def _saved_bytes(run) -> tuple[int, set[torch.dtype], torch.Tensor]:
    """Bytes and dtypes of the distinct storages autograd keeps for the backward of `run()`."""
    seen: dict[int, int] = {}
    dtypes: set[torch.dtype] = set()

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        dtypes.add(t.dtype)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    return sum(seen.values()), dtypes, out


@pytest.mark.parametrize("boolean_mask", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_same_outputs_and_gradients_as_torch(dtype, boolean_mask):
    q, k, v, mask = _inputs(dtype, True, boolean_mask)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    expected.float().square().sum().backward()
    expected_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    assert out.dtype == dtype and out.requires_grad
    tol = 1e-6 if dtype == torch.float32 else 2.0**-7  # bf16: the output's last rounding
    assert float((out.detach().float() - expected.detach().float()).abs().max()) <= tol
    out.float().square().sum().backward()
    for got, want in zip((q.grad, k.grad, v.grad), expected_grads):
        assert got.dtype == dtype
        scale = max(1.0, float(want.float().abs().max()))
        assert float((got.float() - want.float()).abs().max()) <= 4 * tol * scale


def test_bf16_backward_runs_at_fp32_keeping_what_torch_keeps(monkeypatch):
    q, k, v, mask = _inputs(torch.bfloat16, True)
    ops = torch.ops.aten
    real = ops._scaled_dot_product_flash_attention_for_cpu_backward
    backward_dtypes: list[torch.dtype] = []

    def recording(grad_out, *args, **kwargs):
        backward_dtypes.append(grad_out.dtype)
        return real(grad_out, *args, **kwargs)

    torch_bytes, torch_dtypes, _ = _saved_bytes(
        lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    )
    ours_bytes, ours_dtypes, out = _saved_bytes(
        lambda: scaled_dot_product_attention(q, k, v, attn_mask=mask)
    )
    assert ours_bytes == torch_bytes
    assert ours_dtypes == torch_dtypes == {torch.bfloat16, torch.float32}  # fp32: log-sum-exp
    monkeypatch.setattr(ops, "_scaled_dot_product_flash_attention_for_cpu_backward", recording)
    out.sum().backward()
    assert backward_dtypes == [torch.float32]


@pytest.mark.parametrize(
    ("grad", "dropout"), [(False, 0.0), (True, 0.5)], ids=["no-grad", "dropout"]
)
def test_other_calls_are_torchs_own(grad, dropout):
    q, k, v, mask = _inputs(torch.bfloat16, grad)
    torch.manual_seed(3)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout
    )
    torch.manual_seed(3)
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
    assert torch.equal(out, expected)
    assert (out.grad_fn is None) == (not grad)
    if grad:
        assert type(out.grad_fn).__name__ == type(expected.grad_fn).__name__


def _grouped_inputs(dtype: torch.dtype, grad: bool):
    """6 query heads over 2 key / value heads (grouped-query attention), a non-causal mask."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 6, 5, 8, generator=gen)
    k, v = (torch.randn(2, 2, 7, 8, generator=gen) for _ in "kv")
    q, k, v = (t.to(dtype).requires_grad_(grad) for t in (q, k, v))
    allowed = torch.ones(5, 7, dtype=torch.bool).tril(2)
    allowed[0, 5] = True
    mask = torch.zeros(2, 1, 5, 7, dtype=dtype).masked_fill(~allowed, float("-inf"))
    return q, k, v, mask


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no-grad"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_grouped_query_heads_match_repeated_heads(dtype, grad):
    """Fewer key / value heads: the same outputs and gradients as torch's attention over the
    heads repeated to the query heads (head h reads key / value head h // 3)."""
    q, k, v, mask = _grouped_inputs(dtype, grad)
    repeated = [t.repeat_interleave(3, dim=1) for t in (k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(q, *repeated, attn_mask=mask)
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    tol = 1e-6 if dtype == torch.float32 else 2.0**-7
    assert out.shape == expected.shape == (2, 6, 5, 8)
    assert float((out.detach().float() - expected.detach().float()).abs().max()) <= tol
    if not grad:
        assert out.grad_fn is None
        return
    expected.float().square().sum().backward()
    expected_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    out.float().square().sum().backward()
    for got, want in zip((q.grad, k.grad, v.grad), expected_grads):
        assert got.shape == want.shape and got.dtype == dtype
        scale = max(1.0, float(want.float().abs().max()))
        assert float((got.float() - want.float()).abs().max()) <= 4 * tol * scale


def test_grouped_query_heads_are_kept_once():
    """The backward keeps the key / value heads as given, not repeated to the query heads."""
    q, k, v, mask = _grouped_inputs(torch.bfloat16, True)
    repeated = [t.repeat_interleave(3, dim=1) for t in (k, v)]
    grouped_bytes, _, _ = _saved_bytes(
        lambda: scaled_dot_product_attention(q, k, v, attn_mask=mask)
    )
    repeated_bytes, _, _ = _saved_bytes(
        lambda: scaled_dot_product_attention(q, *repeated, attn_mask=mask)
    )
    kv_bytes = sum(t.numel() * t.element_size() for t in (k, v))
    assert repeated_bytes - grouped_bytes == 2 * kv_bytes  # 3 copies of each head -> 1


def test_key_and_value_heads_must_divide_the_query_heads():
    q, k, v, mask = _grouped_inputs(torch.float32, False)
    with pytest.raises(ValueError, match="divide the query heads"):
        scaled_dot_product_attention(q[:, :5], k, v, attn_mask=mask)
    with pytest.raises(ValueError, match="must be equal"):
        scaled_dot_product_attention(q, k, v[:, :1], attn_mask=mask)
