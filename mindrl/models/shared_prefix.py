"""megatron-core's side of rows that share a prompt (`mindrl.data.prefix_sharing`).

A shared-prompt micro-batch is one sequence [1, T] of blocks (a prompt once, then its rows'
responses). megatron reads it in its ordinary `sbhd` layout with batch 1; two things differ
from an ordinary sequence, and both are supplied here:
- rotary positions: a response token's position is the one it has in its own row, not its
  index in the packed sequence. `rope_at_positions` makes the model's rotary embedding
  return the angles of those positions (megatron applies them token by token);
- attention: within a block, a prompt token sees the earlier prompt tokens, a response token
  the whole prompt and its own response's earlier tokens. `SharedPrefixParams` rides in
  megatron's `packed_seq_params` argument to the core attention
  (`SegmentedDotProductAttention`), which megatron hands through untouched for a layout
  other than `thd`, and carries the attention's layout (`mindrl.models.
  shared_prefix_attention`) once it is built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from mindrl.data.prefix_sharing import SharedPrefixRows
    from mindrl.models.shared_prefix_attention import SharedPrefixLayout


@dataclass
class SharedPrefixParams:
    """What megatron reads of `packed_seq_params` (`qkv_format`, `cp_group`, the rotary
    length `max_seqlen_q/kv`) and what the core attention needs (block bounds, segments)."""

    block_bounds: torch.Tensor  # [blocks + 1] int32
    segments: torch.Tensor  # [T] int64: 0 = the block's prompt, k = its k-th response
    positions: torch.Tensor  # [T] int64: each token's rotary position
    max_seqlen_q: int  # positions 0..max_seqlen_q-1 cover every token
    max_seqlen_kv: int
    qkv_format: str = "sbhd"  # megatron's ordinary layout: it squeezes / re-slices nothing
    cp_group: Any = None
    _layouts: dict[tuple[Any, Any], Any] = field(default_factory=dict, repr=False, compare=False)

    def attention_layout(self, device: Any, dtype: Any) -> SharedPrefixLayout:
        """The attention's index and mask tensors, built by the first layer that asks and
        shared by the others (and by a recomputation)."""
        from mindrl.models.shared_prefix_attention import SharedPrefixLayout

        key = (device, dtype)
        if key not in self._layouts:
            self._layouts[key] = SharedPrefixLayout.build(
                self.block_bounds, self.segments, device, dtype
            )
        return self._layouts[key]


def shared_prefix_params(rows: SharedPrefixRows, device: Any) -> SharedPrefixParams:
    return SharedPrefixParams(
        block_bounds=rows.block_bounds.to(device),
        segments=rows.segments.to(device),
        positions=rows.position_ids[0].to(device),
        max_seqlen_q=rows.rope_length,
        max_seqlen_kv=rows.rope_length,
    )


def _gpt_model(model: Any) -> Any:
    inner = model
    while hasattr(inner, "module") and not hasattr(inner, "position_embedding_type"):
        inner = inner.module
    return inner


def check_shared_prefix_model(model: Any) -> None:
    """Refuse what the shared-prompt layout does not cover: rotary variants other than
    megatron's plain RoPE (or learned absolute positions), latent attention, context
    parallelism."""
    gpt = _gpt_model(model)
    kind = getattr(gpt, "position_embedding_type", None)
    config = gpt.config
    if kind not in ("rope", "learned_absolute") or config.multi_latent_attention:
        raise ValueError(
            f"share_prompt_forward is built for RoPE or learned positions, not "
            f"position_embedding_type={kind!r} (multi_latent_attention="
            f"{config.multi_latent_attention})"
        )
    from megatron.core import parallel_state as ps

    cp = ps.get_context_parallel_world_size() if ps.model_parallel_is_initialized() else 1
    if max(config.context_parallel_size, cp) > 1:
        raise ValueError("share_prompt_forward with context parallelism is not built")


@contextlib.contextmanager
def rope_at_positions(model: Any, params: Any) -> Iterator[None]:
    """Within the block, the model's rotary embedding returns the angles of `params.positions`
    ([T, 1, 1, dim]) instead of those of 0..T-1. No-op unless `params` (a micro-batch's
    `packed_seq_params`, or None) is `SharedPrefixParams`, and for a model without rotary
    embedding (learned positions read `position_ids` themselves)."""
    shared = isinstance(params, SharedPrefixParams)
    rotary = getattr(_gpt_model(model), "rotary_pos_emb", None) if shared else None
    if rotary is None:
        yield
        return
    original = rotary.forward
    positions = params.positions

    def at_positions(*args: Any, **kwargs: Any) -> torch.Tensor:
        return original(*args, **kwargs)[positions.to(rotary.inv_freq.device)]

    rotary.forward = at_positions  # the instance's own, removed below
    try:
        yield
    finally:
        del rotary.forward
