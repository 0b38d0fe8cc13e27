"""Attention over packed sequences for megatron-core's local (non-TE) layer spec.

megatron hands packed micro-batches (`PackedSeqParams`, `thd` layout: query / key / value
[T, heads, dim] with segment bounds `cu_seqlens`) to Transformer Engine's attention; its own
`DotProductAttention` refuses them. On CPU (and anywhere TE is absent) this subclass runs
causal attention per segment, the segments side by side in one batched call (a
block-diagonal mask over the whole packed length would cost T^2), and everything else in
the layer (rotary positions restarting per segment, the linears) is megatron's own. Padded
batches take torch's fused attention too where nothing megatron-only is asked for
(`_fused_ok`), else megatron's `DotProductAttention` unchanged. Rows sharing a prompt
(`SharedPrefixParams`, `share_prompt_forward`) take `mindrl.models.shared_prefix_attention`:
each response over its prompt and itself.

`segment_positions` says where each packed token sits (its segment and its position in it):
the attention lays the segments side by side by these two indices, and the fused rope
(`models/fused_rope.py`) rotates each token by the angle of its position within its own
sequence. Context parallelism (`ContextParallelParams`) takes `mindrl.models.
cp_exchange`: this rank's queries over the whole sequence's keys.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention

from mindrl.models.cp_exchange import context_parallel_attention
from mindrl.models.cp_layout import ContextParallelParams, segment_positions
from mindrl.models.sdpa import gather_rows, scaled_dot_product_attention
from mindrl.models.shared_prefix import SharedPrefixParams


class SegmentedDotProductAttention(DotProductAttention):
    """megatron's core attention, plus the `thd` packed layout (causal per segment).

    Multi-latent attention hands its key and value head widths (`k_channels`, `v_channels`:
    they differ); megatron's own local attention does not take them, so MLA runs the fused
    and packed paths here only, which read the widths off the tensors."""

    def __init__(
        self, *args: Any, k_channels: int | None = None, v_channels: int | None = None, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self.mla_widths = (k_channels, v_channels) if k_channels is not None else None

    def forward(
        self,
        query: Any,
        key: Any,
        value: Any,
        attention_mask: Any,
        attn_mask_type: Any = None,
        attention_bias: Any = None,
        packed_seq_params: Any = None,
    ) -> Any:
        if isinstance(packed_seq_params, ContextParallelParams):
            self._check_packable(attention_bias)
            return context_parallel_attention(
                query,
                key,
                value,
                packed_seq_params,
                scale=self.softmax_scale,
                dropout=self.attention_dropout.p if self.training else 0.0,
            )
        if isinstance(packed_seq_params, SharedPrefixParams):
            self._check_packable(attention_bias)
            layout = packed_seq_params.attention_layout(query.device, query.dtype)
            out = layout.attend(
                query[:, 0],
                key[:, 0],
                value[:, 0],
                self.softmax_scale,
                self.attention_dropout.p if self.training else 0.0,
            )
            return out.unsqueeze(1)  # [T, b=1, heads * dim]
        if packed_seq_params is None:
            if self._fused_ok(attention_mask, attention_bias):
                return self._fused_padded(query, key, value, attention_mask)
            if self.mla_widths is not None:
                raise ValueError(
                    "multi-latent attention with an attention bias, a non-boolean mask, "
                    "query-key layer scaling or attention dropout: not built for megatron's "
                    "local attention"
                )
            return super().forward(
                query,
                key,
                value,
                attention_mask,
                attn_mask_type=attn_mask_type,
                attention_bias=attention_bias,
            )
        self._check_packable(attention_bias)
        return segmented_causal_attention(
            query,
            key,
            value,
            packed_seq_params.cu_seqlens_q,
            scale=self.softmax_scale,
            dropout=self.attention_dropout.p if self.training else 0.0,
        )

    def _check_packable(self, attention_bias: Any) -> None:
        if attention_bias is not None or getattr(self.config, "window_size", None):
            raise ValueError(
                "packed sequences (use_remove_padding) with an attention bias or sliding-window "
                "attention are not built for megatron's local attention"
            )

    def _fused_ok(self, attention_mask: Any, attention_bias: Any) -> bool:
        """Whether the padded batch can take torch's fused attention: a boolean mask, and
        none of what only megatron's unfused path does (bias, softmax offset, query-key
        layer scaling, attention dropout while training, sliding window)."""
        return (
            attention_bias is None
            and attention_mask is not None
            and attention_mask.dtype == torch.bool
            and getattr(self, "softmax_offset", None) is None
            and not self.config.apply_query_key_layer_scaling
            and not getattr(self.config, "window_size", None)
            and not (self.training and self.attention_dropout.p > 0)
        )

    def _fused_padded(self, query: Any, key: Any, value: Any, attention_mask: Any) -> Any:
        """megatron's attention over a padded [s, b, heads, dim] batch in one fused call
        (`scaled_dot_product_attention`): megatron's unfused path materialises and saves the
        [b, heads, s, s] scores and probabilities, several passes over them on CPU and the
        largest part of an update's activations at a few hundred tokens. A query whose keys
        are all masked (a left-padding position) attends to itself only, so no row is empty
        (an empty row gives NaN, which a zero weight would not stop); real tokens never see
        those rows."""

        # [b, heads, s, dim]; grouped-query key / value heads as they are
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        seq = q.shape[2]
        out = scaled_dot_product_attention(
            q, k, v, attn_mask=_additive_mask(attention_mask, q.dtype), scale=self.softmax_scale
        )
        return out.permute(2, 0, 1, 3).reshape(seq, q.shape[0], -1)


_ADDITIVE: list[Any] = []  # [megatron's mask, dtype, its additive form]: the last one built


def _additive_mask(attention_mask: Any, dtype: Any) -> Any:
    """megatron's boolean mask (True = masked) as an additive one (0 / -inf) with the
    diagonal always allowed. Every layer of a forward gets the same mask object: it is
    converted once and the layers share one tensor (a boolean mask would be converted by
    each attention call and kept by each for the backward pass)."""
    if _ADDITIVE and _ADDITIVE[0] is attention_mask and _ADDITIVE[1] == dtype:
        return _ADDITIVE[2]
    seq = attention_mask.shape[-1]
    eye = torch.eye(seq, dtype=torch.bool, device=attention_mask.device)
    additive = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
    additive.masked_fill_(attention_mask & ~eye, float("-inf"))
    _ADDITIVE[:] = [attention_mask, dtype, additive]
    return additive


def segmented_causal_attention(
    query: Any,
    key: Any,
    value: Any,
    cu_seqlens: Any,
    *,
    scale: float,
    dropout: float = 0.0,
) -> Any:
    """Causal attention within each segment of [T, heads, dim] tensors (grouped-query key /
    value heads: fewer, each read by its group of query heads); returns [T, heads * dim].

    The segments are laid side by side as a [segments, longest, heads, dim] batch for one
    fused attention call (a loop over segments costs a kernel launch per sample and layer):
    attention pays for the padding to the longest segment, the linears around it do not."""
    bounds = cu_seqlens.to(device=query.device, dtype=torch.long)
    lengths = bounds[1:] - bounds[:-1]
    n, longest = int(lengths.numel()), int(lengths.max())
    segment, position = segment_positions(bounds)

    def side_by_side(t: Any) -> Any:
        out = t.new_zeros((n, longest, *t.shape[1:]))
        out[segment, position] = t
        return out.transpose(1, 2)  # [n, heads (grouped-query: as they are), longest, dim]

    q, k, v = side_by_side(query), side_by_side(key), side_by_side(value)
    steps = torch.arange(longest, device=query.device)
    allowed = (steps[None, :] <= steps[:, None])[None] & (steps[None, :] < lengths[:, None])[
        :, None, :
    ]  # [n, query, key]: causal, within the segment
    out = scaled_dot_product_attention(
        q, k, v, attn_mask=allowed[:, None], dropout_p=dropout, scale=scale
    )
    # each token's row of the [segments * longest] slots (`gather_rows`: a fast backward on CPU)
    slots = out.transpose(1, 2).reshape(n * longest, out.shape[1], out.shape[3])
    return gather_rows(slots, segment * longest + position).reshape(query.shape[0], -1)


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
