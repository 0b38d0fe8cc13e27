"""The weight sync takes a fused vLLM parameter as a view when its members are consecutive
rows of one tensor, and concatenates otherwise (`direct_reload._adjacent_rows`)."""

from __future__ import annotations

import torch

from mindrl.checkpoint.transforms import fuse_qkv, unfuse_qkv
from mindrl.rollout.direct_reload import _adjacent_rows


def _shares(view: torch.Tensor, tensor: torch.Tensor) -> bool:
    return view.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()


def test_unfused_qkv_is_one_view_in_vllm_order():
    groups, q_per_group, head_dim, hidden = 3, 2, 4, 5
    q = torch.randn(groups * q_per_group * head_dim, hidden)
    k = torch.randn(groups * head_dim, hidden)
    v = torch.randn(groups * head_dim, hidden)
    parts = unfuse_qkv(
        fuse_qkv(q, k, v, groups, q_per_group, head_dim), groups, q_per_group, head_dim
    )
    for got, want in zip(parts, (q, k, v)):
        assert torch.equal(got, want)
    view = _adjacent_rows(list(parts))
    assert view is not None and _shares(view, parts[0])
    assert torch.equal(view, torch.cat([q, k, v]))


def test_megatron_gate_up_halves_are_one_view():
    fc1 = torch.randn(2 * 6, 3)
    gate, up = fc1.chunk(2, dim=0)
    view = _adjacent_rows([gate, up])
    assert view is not None and _shares(view, fc1)
    assert torch.equal(view, fc1)


def test_anything_but_consecutive_rows_is_concatenated_instead():
    base = torch.randn(12, 3)
    a, b, c = base[:4], base[4:8], base[8:]
    assert _adjacent_rows([b, a]) is None  # out of order
    assert _adjacent_rows([a, c]) is None  # a gap
    assert _adjacent_rows([a, b.clone()]) is None  # another storage
    wide = torch.randn(4, 6)
    assert _adjacent_rows([wide[:, :3], wide[:, 3:]]) is None  # not contiguous
    assert _adjacent_rows([base[:4], base.view(-1, 4)[3:6]]) is None  # other row width
    assert _adjacent_rows([base[:4], base[4:8].to(torch.float64)]) is None
