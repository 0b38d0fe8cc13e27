"""Attention over packed sequences for megatron-core's local (non-TE) layer spec.

megatron hands packed micro-batches (`PackedSeqParams`, `thd` layout: query / key / value
[T, heads, dim] with segment bounds `cu_seqlens`) to Transformer Engine's attention; its own
`DotProductAttention` refuses them. On CPU (and anywhere TE is absent) this subclass runs
causal attention per segment, the segments side by side in one batched call (a
block-diagonal mask over the whole packed length would cost T^2), and everything else in
the layer (rotary positions restarting per segment, the linears) is megatron's own. Without
packed parameters it is megatron's `DotProductAttention` unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from megatron.core.transformer.dot_product_attention import DotProductAttention


class SegmentedDotProductAttention(DotProductAttention):
    """megatron's core attention, plus the `thd` packed layout (causal per segment)."""

    def forward(  # type: ignore[override]
        self,
        query: Any,
        key: Any,
        value: Any,
        attention_mask: Any,
        attn_mask_type: Any = None,
        attention_bias: Any = None,
        packed_seq_params: Any = None,
    ) -> Any:
        if packed_seq_params is None:
            return super().forward(
                query,
                key,
                value,
                attention_mask,
                attn_mask_type=attn_mask_type,
                attention_bias=attention_bias,
            )
        if attention_bias is not None or getattr(self.config, "window_size", None):
            raise ValueError(
                "packed sequences (use_remove_padding) with an attention bias or sliding-window "
                "attention are not built for megatron's local attention"
            )
        return segmented_causal_attention(
            query,
            key,
            value,
            packed_seq_params.cu_seqlens_q,
            scale=self.softmax_scale,
            dropout=self.attention_dropout.p if self.training else 0.0,
        )


def segmented_causal_attention(
    query: Any, key: Any, value: Any, cu_seqlens: Any, *, scale: float, dropout: float = 0.0
) -> Any:
    """Causal attention within each segment of [T, heads, dim] tensors (grouped key / value
    heads repeated to the query heads); returns [T, heads * dim].

    The segments are laid side by side as a [segments, longest, heads, dim] batch for one
    fused attention call (a loop over segments costs a kernel launch per sample and layer):
    attention pays for the padding to the longest segment, the linears around it do not."""
    import torch

    bounds = cu_seqlens.to(device=query.device, dtype=torch.long)
    lengths = bounds[1:] - bounds[:-1]
    n, longest = int(lengths.numel()), int(lengths.max())
    segment = torch.repeat_interleave(torch.arange(n, device=query.device), lengths)
    position = torch.arange(query.shape[0], device=query.device) - bounds[segment]

    def side_by_side(t: Any) -> Any:
        out = t.new_zeros((n, longest, *t.shape[1:]))
        out[segment, position] = t
        if t.shape[1] != query.shape[1]:  # grouped-query attention
            out = out.repeat_interleave(query.shape[1] // t.shape[1], dim=2)
        return out.transpose(1, 2)  # [n, heads, longest, dim]

    q, k, v = side_by_side(query), side_by_side(key), side_by_side(value)
    steps = torch.arange(longest, device=query.device)
    allowed = (steps[None, :] <= steps[:, None])[None] & (steps[None, :] < lengths[:, None])[
        :, None, :
    ]  # [n, query, key]: causal, within the segment
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=allowed[:, None], dropout_p=dropout, scale=scale
    )
    return out.transpose(1, 2)[segment, position].reshape(query.shape[0], -1)


def with_segmented_attention(layer: Any) -> Any:
    """A local layer spec whose core attention also takes packed sequences."""
    subs = layer.submodules
    attention = dataclasses.replace(
        subs.self_attention.submodules, core_attention=SegmentedDotProductAttention
    )
    return dataclasses.replace(
        layer,
        submodules=dataclasses.replace(
            subs, self_attention=dataclasses.replace(subs.self_attention, submodules=attention)
        ),
    )
