"""A fused rotary embedding for MindSpeed's `use_fused_rotary_pos_emb` off the NPU.

MindSpeed hands the switch to torch_npu's rope kernel; on GPU megatron-core takes transformer
engine's. Without either (CPU, a GPU without TE), megatron's unfused rope slices the input,
negates and concatenates its halves, multiplies twice, adds, concatenates the pass-through
part back and, for packed sequences, gathers the angles sequence by sequence; its backward
retraces all of that. Here the rotation is one autograd node: each half of the output (and
of the input's gradient) is one multiply and one multiply-subtract or -add over the halves,
and only the angles' cos / sin are kept for the backward. The arithmetic is megatron's term
for term, so outputs and gradients equal the unfused path's bit for bit
(`tests/unit/test_fused_rope.py`).

It goes into megatron-core's own slots for a fused rope (`rope_utils.fused_apply_rotary_pos_emb`
and `..._thd`, which transformer engine fills where it is installed), and the role's
TransformerConfig sets `apply_rope_fusion` (`models/scale.py`, `models/gpt.py`). Anything it does not cover
(interleaved or partial rotary dims, context parallelism) runs megatron's unfused code.
"""

from __future__ import annotations

import torch

from mindrl.models.packed_attention import segment_positions


def install_fused_rope() -> None:
    """Fill megatron-core's fused-rope slots with this module's kernels where they are empty
    (transformer engine's stay), so that a TransformerConfig with `apply_rope_fusion` builds."""
    from megatron.core.models.common.embeddings import rope_utils

    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = fused_rope_bshd
    if rope_utils.fused_apply_rotary_pos_emb_thd is None:
        rope_utils.fused_apply_rotary_pos_emb_thd = fused_rope_thd


def fused_rope_bshd(
    t: torch.Tensor, freqs: torch.Tensor, interleaved: bool = False
) -> torch.Tensor:
    """Rotate `t` ([s, b, h, d]) by the angles `freqs` ([s, 1 or b, 1, d])."""
    if interleaved or freqs.shape[-1] != t.shape[-1] or t.shape[-1] % 2:
        from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

        return _apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=interleaved)
    return _RotateHalves.apply(t, torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype))


def fused_rope_thd(
    t: torch.Tensor,
    cu_seqlens: torch.Tensor,
    freqs: torch.Tensor,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> torch.Tensor:
    """Rotate packed sequences `t` ([tokens, h, d], boundaries `cu_seqlens`): each token by
    the angle of its position in its own sequence, or, where `freqs` has one row per token
    (megatron's exact-offset case), by its own row."""
    if cp_size > 1:
        from megatron.core import parallel_state
        from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_thd

        group = parallel_state.get_context_parallel_group()
        return _apply_rotary_pos_emb_thd(t, cu_seqlens, freqs, cp_group=group)
    if freqs.shape[0] != t.shape[0]:
        freqs = freqs[segment_positions(cu_seqlens)[1]]
    return fused_rope_bshd(t.unsqueeze(1), freqs).squeeze(1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: int) -> torch.Tensor:
    """[x1, x2] -> [x1*c1 - sign*x2*s1, x2*c2 + sign*x1*s2] in x's dtype: sign +1 is
    megatron's forward `x*cos + rotate_half(x)*sin`, -1 its backward (the transposed rotation)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    out = torch.empty_like(x)
    first, second = out[..., :half], out[..., half:]
    torch.mul(x1, cos[..., :half], out=first)
    torch.mul(x2, cos[..., half:], out=second)
    if sign > 0:
        first.sub_(x2 * sin[..., :half])
        second.add_(x1 * sin[..., half:])
    else:
        first.add_(x2 * sin[..., half:])
        second.sub_(x1 * sin[..., :half])
    return out


class _RotateHalves(torch.autograd.Function):
    """The rotation as one autograd node: keeps cos and sin, nothing of the input."""

    @staticmethod
    def forward(ctx, t, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(t, cos, sin, +1)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rotate(grad.contiguous(), cos, sin, -1), None, None
