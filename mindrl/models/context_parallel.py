"""Context parallelism for megatron-core's local attention (CPU over gloo, or wherever
Transformer Engine / MindSpeed do not take it): each sequence split over the CP ranks, laid
out by `mindrl.models.cp_layout` (ring, Ulysses or both, as `context_parallel_algo` says).

Everything in the decoder (embedding, norms, linears, MLP and their activations) runs on the
rank's S / CP tokens; only attention needs the others (`mindrl.models.cp_exchange`). The
last stage's decoder output (after the final norm) is gathered back to the whole sequence
before the output layer, so the log-prob / entropy / loss code sees the sequence it sees
without CP, identical on every CP rank; the gather's backward sums the CP ranks' gradients,
which makes every parameter's gradient summed over the CP ranks CP times the whole
gradient, and megatron's DDP (averaging over data x context parallel ranks) divides it back
out. Pipeline stages pass their S / CP tokens on (megatron's schedule sizes its buffers
S / CP); under sequence parallelism the rank's tokens are further split over TP as megatron
does. Rotary positions follow each token's global position (or its position in its packed
segment). Weights are not split by CP: checkpoints and the weight sync see the ordinary
TP x PP layout.
"""

from __future__ import annotations

from typing import Any

import torch

from mindrl.models.cp_exchange import gather_sequence
from mindrl.models.cp_layout import (
    RING_KV_EXCHANGES,
    ContextParallelParams,
    CPLayout,
    cp_subgroups,
    inverse_permutation,
    segment_positions,
)


def cp_size_rank_group() -> tuple[int, int, Any]:
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 1, 0, None
    return (
        ps.get_context_parallel_world_size(),
        ps.get_context_parallel_rank(),
        ps.get_context_parallel_group(),
    )


def split_micro_batch(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    layout: CPLayout,
    ring_kv: str = "pass",
) -> tuple[tuple[Any, ...], dict[str, Any], ContextParallelParams]:
    """GPTModel's (input_ids, position_ids, attention_mask, ...) cut to this rank's tokens,
    with the layout in `packed_seq_params`."""
    cp, rank, group = cp_size_rank_group()
    if cp != layout.cp_size:
        raise ValueError(f"the CP group has {cp} ranks, the layout {layout.cp_size}")
    names = ("input_ids", "position_ids", "attention_mask")
    values = dict(zip(names, args))
    rest = args[len(names) :]
    values.update({n: kwargs.pop(n) for n in names if n in kwargs})
    input_ids = values["input_ids"]
    packed = kwargs.pop("packed_seq_params", None)
    seq = int(input_ids.shape[1])
    device = input_ids.device
    index = layout.local_index(seq, rank, device)
    ring_rank = rank // layout.ulysses
    ring_rows = layout.ring_index(seq, ring_rank, device)
    ring_order = inverse_permutation(
        torch.cat([layout.ring_index(seq, r) for r in range(layout.ring)])
    ).to(device)
    segments, full_mask = None, None
    positions = index
    if packed is not None:
        if getattr(packed, "qkv_format", None) != "thd":
            raise ValueError(
                f"context parallelism with {type(packed).__name__} is not built "
                "(share_prompt_forward)"
            )
        cu = packed.cu_seqlens_q.to(device)
        seg, pos = segment_positions(cu)
        pad = seq - seg.numel()  # a packed row's tail past its last segment
        segments = torch.cat([seg, seg.new_full((pad,), -1)])
        all_positions = torch.cat([pos, torch.arange(pad, device=device)])
        positions = all_positions[index]
    else:
        full_mask = values["attention_mask"]
        if full_mask is None:
            full_mask = torch.ones(seq, seq, dtype=torch.bool, device=device).triu(1)[None, None]
    ring_group, ulysses_group = cp_subgroups(layout)
    params = ContextParallelParams(
        group=group,
        layout=layout,
        cp_rank=rank,
        seq=seq,
        query_index=index,
        positions=positions,
        ring_rows=ring_rows,
        gather_order=layout.order(seq, device),
        ring_order=ring_order,
        ring_group=ring_group,
        ulysses_group=ulysses_group,
        ring_kv=ring_kv,
        segments=segments,
        full_mask=full_mask,
        max_seqlen_q=seq,
        max_seqlen_kv=seq,
    )
    local_mask = None if full_mask is None else full_mask.index_select(2, index)
    position_ids = values.get("position_ids")
    new_args = (
        input_ids.index_select(1, index),
        None if position_ids is None else position_ids.index_select(1, index),
        local_mask,
        *rest,
    )
    kwargs["packed_seq_params"] = params
    return new_args, kwargs, params


def install_context_parallel(
    model: Any, algo: str, ulysses_degree: int | None = None, ring_kv: str = "pass"
) -> None:
    """Make this GPTModel chunk (built at CP > 1) split its inputs over the CP ranks, attend
    across them and, on the last pipeline stage, return the whole sequence's output."""
    cp, _, _ = cp_size_rank_group()
    layout = CPLayout.of(algo, cp, ulysses_degree)
    if ring_kv not in RING_KV_EXCHANGES:
        raise ValueError(f"ring_kv {ring_kv!r}: one of {', '.join(RING_KV_EXCHANGES)}")
    cp_subgroups(layout)  # collective: made now, while every rank builds its model
    current: list[ContextParallelParams] = []
    sequence_parallel = bool(getattr(model.config, "sequence_parallel", False))

    def split(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        new_args, new_kwargs, params = split_micro_batch(args, dict(kwargs), layout, ring_kv)
        current[:] = [params]
        return new_args, new_kwargs

    def gather(_module: Any, _args: Any, output: Any) -> Any:
        hidden = output[0] if isinstance(output, tuple) else output
        hidden = _gather_decoder_output(hidden, current[0], sequence_parallel)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    model.register_forward_pre_hook(split, with_kwargs=True)
    if model.post_process:  # earlier stages pass their own tokens on
        model.decoder.register_forward_hook(gather)
    rotary = getattr(model, "rotary_pos_emb", None)
    if rotary is not None:
        original = rotary.forward
        rotary.cp_group = None  # positions are given per token below

        def at_positions(*_args: Any, **_kwargs: Any) -> torch.Tensor:
            params = current[0]
            longest = int(params.positions.max()) + 1
            emb: torch.Tensor = original(max(longest, params.seq))
            return emb[params.positions.to(emb.device)]

        rotary.forward = at_positions


def _gather_decoder_output(
    hidden: torch.Tensor, params: ContextParallelParams, sequence_parallel: bool
) -> torch.Tensor:
    """The last stage's [S / CP (/ TP under SP), b, h] -> the whole sequence (its TP share
    under SP, as megatron's output layer expects it)."""
    if not sequence_parallel:
        return gather_sequence(hidden, params)
    from megatron.core.tensor_parallel.mappings import (
        gather_from_sequence_parallel_region,
        scatter_to_sequence_parallel_region,
    )

    # every TP rank ends with the same rows, so the gradient is split back, not summed
    mine = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
    return scatter_to_sequence_parallel_region(gather_sequence(mine, params))
