"""Packed micro-batches on megatron-core: the groups every rank of a pass agrees on, the
pipeline's fixed packed length, and megatron's `PackedSeqParams` for a packed row.

The planning itself (`mindrl.data.packing`) is torch-only; this module adds what needs
megatron's parallel state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mindrl.data.packing import PackedRows, PackingSettings, plan_micro_batches, round_up

if TYPE_CHECKING:
    import torch


def pipeline_split() -> bool:
    from megatron.core import parallel_state as ps

    return ps.model_parallel_is_initialized() and ps.get_pipeline_model_parallel_world_size() > 1


def dp_max(n: int) -> int:
    """The largest `n` over the data-parallel group (n itself outside megatron)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized() or ps.get_data_parallel_world_size() == 1:
        return n
    t = torch.tensor([n], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ps.get_data_parallel_group())
    return int(t.item())


def schedule_loss_scale(micro_batches: int) -> float:
    """What each micro-batch's loss (normalised over the whole mini-batch) is multiplied by
    so that megatron leaves the mini-batch's gradient: its schedule divides the loss by the
    micro-batch count and multiplies it by CP, and DDP averages over DP x CP ranks. Every CP
    rank computes the whole sequence's loss (`mindrl.models.context_parallel`), so CP
    cancels out here."""
    from megatron.core import parallel_state as ps

    return float(micro_batches * ps.get_data_parallel_world_size()) / (
        ps.get_context_parallel_world_size()
    )


@dataclass(frozen=True)
class PromptRows:
    """The rows' prompts, for passes that run a shared prompt once (`share_prompts`)."""

    input_ids: torch.Tensor  # [B, S]
    prompt_lengths: torch.Tensor  # [B]


def pass_groups(
    attention_mask: torch.Tensor,
    settings: PackingSettings,
    micro_batch_size: int,
    prompts: PromptRows | None = None,
) -> list[list[int]]:
    """This rank's micro-batches (row indices) for one pass; with dynamic batch sizes every
    data-parallel rank runs as many as the rank that needs most (expert parallelism
    exchanges tokens at every forward, and DDP expects one schedule). `prompts` (with
    `settings.share_prompts`): budgets count a shared prompt once."""
    lengths = attention_mask.long().sum(-1).tolist()

    def plan(min_parts: int = 1) -> list[list[int]]:
        if prompts is not None and settings.share_prompts:
            from mindrl.data.prefix_sharing import plan_shared_micro_batches

            return plan_shared_micro_batches(
                prompts.input_ids,
                attention_mask,
                prompts.prompt_lengths,
                settings,
                micro_batch_size,
                min_parts,
            )
        return plan_micro_batches(lengths, settings, micro_batch_size, min_parts)

    groups = plan()
    if settings.dynamic_bsz:
        needed = dp_max(len(groups))
        if needed > len(groups):
            groups = plan(min_parts=needed)
    return groups  # ranks hold equal row counts, so `needed` never exceeds this rank's rows


def fixed_packed_length(
    attention_mask: torch.Tensor,
    groups: list[list[int]],
    multiple: int,
    prompts: PromptRows | None = None,
) -> int | None:
    """One packed length for every micro-batch under pipeline parallelism (its
    point-to-point buffers have one shape), else None (each packs to its own length).
    `prompts`: the rows run their shared prompts once."""
    if not pipeline_split():
        return None
    if prompts is None:
        lengths = attention_mask.long().sum(-1).tolist()
        return round_up(max(sum(lengths[i] for i in g) for g in groups), multiple)
    from mindrl.data.prefix_sharing import shared_group_tokens

    fed = shared_group_tokens(prompts.input_ids, attention_mask, prompts.prompt_lengths, groups)
    return round_up(max(fed), multiple)


def check_shared_prefix_chunks(chunks: list[Any]) -> None:
    """The model can run rows sharing a prompt: megatron's local attention with mindrl's
    segmented core attention, plain RoPE or learned positions, no context parallelism."""
    from mindrl.models.packed_attention import SegmentedDotProductAttention
    from mindrl.models.shared_prefix import check_shared_prefix_model

    for chunk in chunks:
        check_shared_prefix_model(chunk)
        cores = [m for name, m in chunk.named_modules() if name.endswith("core_attention")]
        wrong = [type(m).__name__ for m in cores if not isinstance(m, SegmentedDotProductAttention)]
        if wrong:
            raise ValueError(
                "rl_config.share_prompt_forward runs on megatron's local attention "
                f"(SegmentedDotProductAttention); this model's layers use {wrong[0]}"
            )


def packed_seq_params(packed: PackedRows, device: Any) -> Any:
    """megatron's `thd` parameters for one packed row (TE's attention reads them natively;
    `SegmentedDotProductAttention` on the local spec)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = packed.cu_seqlens.to(device)
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        max_seqlen_q=packed.max_seqlen,
        max_seqlen_kv=packed.max_seqlen,
    )
