"""The no-gradient pass over a batch through megatron-core's pipeline schedule: the log-prob
passes (reference, old policy) and full-vocabulary logits.

`forward_only` forms the micro-batches (padded, or by a token budget and packed:
`mindrl.data.packing`), runs megatron's `get_forward_backward_func()` with
``forward_only=True``; the last stage turns each micro-batch's output into log-probs of the
scored tokens only (`mindrl.models.logprobs.scored_log_probs`), and the result is broadcast
over the pipeline group so every rank returns the same tensor. Conventions as in
`mindrl.models.logprobs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mindrl.data.packing import round_up
from mindrl.models.logprobs import (
    causal_attention_mask,
    gather_vocab_parallel_logits,
    micro_selection,
    pad_columns,
    position_ids_from_mask,
    scored_log_probs,
    sequence_multiple,
)

if TYPE_CHECKING:
    import torch

    from mindrl.data.packing import PackingSettings
    from mindrl.models.micro_batches import PromptRows
    from mindrl.models.token_select import TokenSelection


def forward_only_schedule(
    chunks: list[Any], micro_batches: list[Any], step: Any, seq: int, mbs: int
) -> list[Any]:
    """megatron's pipeline schedule over `micro_batches` without gradients (a virtual
    pipeline runs every chunk over the same micro-batches); the last stage's loss outputs."""
    import torch
    from megatron.core.pipeline_parallel import get_forward_backward_func

    iterators: Any = (
        [iter(micro_batches) for _ in chunks] if len(chunks) > 1 else iter(micro_batches)
    )
    with torch.no_grad():
        return get_forward_backward_func()(
            forward_step_func=step,
            data_iterator=iterators,
            model=chunks if len(chunks) > 1 else chunks[0],
            num_microbatches=len(micro_batches),
            seq_length=seq,
            micro_batch_size=mbs,
            forward_only=True,
        )


def last_stage_output(
    parts: list[torch.Tensor],
    shape: tuple[int, ...],
    device: Any,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """The last pipeline stage's per-micro-batch outputs, concatenated (row `rows[i]` of the
    batch is entry i when the micro-batches regrouped the rows), returned on every stage of
    the pipeline (broadcast from the last; the others pass no `parts`)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if ps.is_pipeline_last_stage(ignore_virtual=True):
        result = torch.cat(parts, dim=0)
        if rows is not None:
            result = torch.empty_like(result).index_copy_(0, rows.to(result.device), result)
    else:
        result = torch.empty(shape, dtype=torch.float32, device=device)
    if ps.get_pipeline_model_parallel_world_size() > 1:
        dist.broadcast(
            result,
            src=ps.get_pipeline_model_parallel_last_rank(),
            group=ps.get_pipeline_model_parallel_group(),
        )
    return result


def forward_only(
    model_chunks: Sequence[Any] | Any,
    input_ids: torch.Tensor,
    *,
    vocab_size: int,
    attention_mask: torch.Tensor | None = None,
    micro_batch_size: int | None = None,
    output: str = "log_probs",
    temperature: float = 1.0,
    response_mask: torch.Tensor | None = None,
    packing: PackingSettings | None = None,
    prompt_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run the model over `input_ids` without gradients through megatron's pipeline schedule.

    output="log_probs": [B, S-1] fp32 per-token log-probs of the next token, computed only
    where `response_mask` ([B, S-1]; default: every real token) is set and 0 elsewhere: the
    output layer runs on those tokens alone, and without pipeline parallelism a
    micro-batch's trailing padding is not fed to the model. `packing` (log-probs only) forms
    the micro-batches by a token budget and / or packs each into one sequence
    (`mindrl.data.packing`); with `packing.share_prompts` the rows of one prompt run it
    once (`prompt_lengths` [B] says where each row's prompt ends).
    output="logits": [B, S, vocab_size] full-vocabulary logits (gathered over TP).
    Every rank of the pipeline returns the same tensor (broadcast from the last stage).
    """
    import torch

    from mindrl.models.token_select import OutputHead, select_tokens

    if output not in ("log_probs", "logits"):
        raise ValueError(f"output must be 'log_probs' or 'logits', not {output!r}")
    chunks: list[Any] = (
        list(model_chunks) if isinstance(model_chunks, (list, tuple)) else [model_chunks]
    )
    device = next(chunks[0].parameters()).device
    batch, asked_seq = input_ids.shape
    multiple = sequence_multiple(chunks)
    seq = round_up(asked_seq, multiple)
    mbs = micro_batch_size or batch
    if batch % mbs:
        raise ValueError(f"batch size {batch} is not a multiple of micro_batch_size {mbs}")
    input_ids = input_ids.to(device)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    attention_mask = attention_mask.to(device)
    if output == "log_probs" and response_mask is None:
        response_mask = attention_mask[:, 1:]
    if seq != asked_seq:
        input_ids, attention_mask = pad_columns(input_ids, seq), pad_columns(attention_mask, seq)
        if response_mask is not None:
            response_mask = pad_columns(response_mask, seq - 1)
    if output == "log_probs" and packing is not None and packing.active:
        assert response_mask is not None
        prompts = None
        if packing.share_prompts:
            from mindrl.models.micro_batches import PromptRows, check_shared_prefix_chunks

            if prompt_lengths is None:
                raise ValueError("sharing prompts needs the rows' prompt_lengths")
            check_shared_prefix_chunks(chunks)
            prompts = PromptRows(input_ids, prompt_lengths)
        groups, micro_batches = packed_log_prob_inputs(
            input_ids, attention_mask, response_mask.to(device), packing, mbs, multiple, prompts
        )
        rows: torch.Tensor | None = torch.tensor(sum(groups, []), dtype=torch.long)
        schedule_seq, schedule_mbs = micro_batches[0]["tokens"].shape[1], 1
        if not packing.remove_padding:
            schedule_seq, schedule_mbs = seq, len(groups[0])
    else:
        rows, schedule_seq, schedule_mbs = None, seq, mbs
        micro_batches = padded_inputs(
            input_ids,
            attention_mask,
            response_mask if output == "log_probs" else None,
            [list(range(i, i + mbs)) for i in range(0, batch, mbs)],
            multiple,
            device,
        )

    def step(data_iterator: Any, model: Any) -> tuple[torch.Tensor, Any]:
        from mindrl.models.shared_prefix import rope_at_positions

        mb = next(data_iterator)
        selection: TokenSelection | None = mb["selection"]
        packed = mb.get("packed")
        extra = {"packed_seq_params": packed} if packed is not None else {}
        head = OutputHead()
        if selection is None:
            out = model(mb["tokens"], mb["position_ids"], mb["mask"], **extra)
        else:
            with select_tokens(model, selection, hidden_only=True) as head:
                with rope_at_positions(model, packed):
                    out = model(mb["tokens"], mb["position_ids"], mb["mask"], **extra)

        def finish(output_tensor: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            if selection is not None:
                picked, _ = scored_log_probs(
                    output_tensor,
                    head,
                    selection,
                    mb["tokens"],
                    vocab_size=vocab_size,
                    temperature=temperature,
                )
                grid = selection.scatter(picked)
                res = torch.nn.functional.pad(grid, (0, seq - 1 - grid.shape[1]))
            else:
                res = gather_vocab_parallel_logits(output_tensor, vocab_size).float()
            return output_tensor.new_zeros((), dtype=torch.float32), {"out": res}

        return out, finish

    results = forward_only_schedule(chunks, micro_batches, step, schedule_seq, schedule_mbs)
    shape = (batch, seq - 1) if output == "log_probs" else (batch, seq, vocab_size)
    result = last_stage_output([r["out"] for r in results], shape, device, rows)
    return result[:, : asked_seq - 1] if output == "log_probs" else result[:, :asked_seq]


def padded_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor | None,
    groups: list[list[int]],
    multiple: int,
    device: Any,
) -> list[dict[str, Any]]:
    """One padded micro-batch per group of rows: trailing padding cut to the group's last
    needed column (without PP), a causal mask that hides padded keys."""
    import torch

    seq = input_ids.shape[1]
    micro_batches = []
    for group in groups:
        index = torch.tensor(group, dtype=torch.long, device=device)
        length, selection = seq, None
        if response_mask is not None:
            selection = micro_selection(response_mask[index].to(device), multiple)
            length = selection.seq
        m = attention_mask[index, :length]
        micro_batches.append(
            {
                "tokens": input_ids[index, :length],
                "position_ids": position_ids_from_mask(m),
                "mask": causal_attention_mask(length, m),
                "selection": selection,
            }
        )
    return micro_batches


def packed_log_prob_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    packing: PackingSettings,
    mbs: int,
    multiple: int,
    prompts: PromptRows | None = None,
) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """The pass's row groups and their micro-batches: each group packed into one sequence
    (remove_padding; with `prompts`, a shared prompt once) or padded to its longest row
    (dynamic batch sizes only)."""
    import torch

    from mindrl.data.packing import pack_rows
    from mindrl.models.micro_batches import (
        fixed_packed_length,
        packed_seq_params,
        pass_groups,
        pipeline_split,
    )

    device = input_ids.device
    groups = pass_groups(attention_mask, packing, mbs, prompts)
    if not packing.remove_padding:
        if pipeline_split() and len({len(g) for g in groups}) > 1:
            raise ValueError(
                "use_dynamic_bsz under pipeline parallelism needs use_remove_padding: true "
                "(the pipeline sends one micro-batch shape)"
            )
        return groups, padded_inputs(
            input_ids, attention_mask, response_mask, groups, multiple, device
        )
    fixed = fixed_packed_length(attention_mask, groups, multiple, prompts)
    micro_batches = []
    for group in groups:
        index = torch.tensor(group, dtype=torch.long, device=device)
        if prompts is not None:
            micro_batches.append(
                shared_prompt_inputs(
                    input_ids[index],
                    attention_mask[index],
                    prompts.prompt_lengths[index.cpu()],
                    response_mask[index],
                    multiple,
                    fixed,
                )
            )
            continue
        packed = pack_rows(input_ids[index], attention_mask[index], multiple, fixed)
        micro_batches.append(
            {
                "tokens": packed.tokens,
                "position_ids": packed.position_ids,
                "mask": None,
                "packed": packed_seq_params(packed, device),
                "selection": packed.selection(response_mask[index]),
            }
        )
    return groups, micro_batches


def shared_prompt_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_lengths: torch.Tensor,
    response_mask: torch.Tensor,
    multiple: int,
    length: int | None,
) -> dict[str, Any]:
    """One micro-batch of rows packed with each shared prompt once
    (`mindrl.data.prefix_sharing`)."""
    from mindrl.data.prefix_sharing import pack_shared
    from mindrl.models.shared_prefix import shared_prefix_params

    rows = pack_shared(input_ids, attention_mask, prompt_lengths, multiple, length)
    return {
        "tokens": rows.tokens,
        "position_ids": rows.position_ids,
        "mask": None,
        "packed": shared_prefix_params(rows, input_ids.device),
        "selection": rows.selection(response_mask, input_ids),
    }
