"""Training layout -> inference layout: full HF-named tensors from megatron's TP/PP shards.

The same declarative mapping table the checkpoint converter uses (`mindrl.checkpoint.mapping`)
turns each parameter's TP shards (fused QKV, fused gate/up, padded vocab) back into HF tensors.
Tensors are produced one parameter at a time, so a caller that streams them into the rollout
engine in buckets holds about one bucket of extra memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from mindrl.config.model_arch import ModelArchConfig

if TYPE_CHECKING:
    import torch


def local_params_by_global_name(model_chunks: Sequence[Any]) -> tuple[dict[str, Any], list[int]]:
    """This rank's parameters keyed by mcore name with *global* layer numbers, and its layers."""
    from mindrl.checkpoint.online import _LAYER, global_layer_numbers
    from mindrl.models.gpt import unwrap_model

    params: dict[str, Any] = {}
    my_layers: list[int] = []
    for chunk in model_chunks:
        gpt = unwrap_model(chunk)
        layers = global_layer_numbers(gpt)
        for name, p in gpt.named_parameters():
            m = _LAYER.match(name)
            if m:
                name = _LAYER.sub(f"decoder.layers.{layers[int(m.group(1))]}.", name, count=1)
            params[name] = p
        my_layers.extend(layers)
    return params, my_layers


def iter_hf_tensors(
    model_chunks: Sequence[Any], arch: ModelArchConfig, *, to_tp_rank0_only: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """Collective over the role's ranks: yield (HF name, full tensor) on the first TP rank of
    the first pipeline stage of every data-parallel replica (every rank of the replica when
    `to_tp_rank0_only` is false). Every rank must exhaust the iterator."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from mindrl.checkpoint.mapping import bound_rules
    from mindrl.checkpoint.online import _gather_to_hf, _owner_stage

    params, my_layers = local_params_by_global_name(model_chunks)
    tp_group = ps.get_tensor_model_parallel_group()
    tp_size = ps.get_tensor_model_parallel_world_size()
    tp_rank = ps.get_tensor_model_parallel_rank()
    pp_size = ps.get_pipeline_model_parallel_world_size()
    pp_rank = ps.get_pipeline_model_parallel_rank()
    pp_group = ps.get_pipeline_model_parallel_group()
    pp_ranks = dist.get_process_group_ranks(pp_group)
    stage_layers: list[Any] = [None] * pp_size
    dist.all_gather_object(stage_layers, my_layers, group=pp_group)
    dtype = next(iter(params.values())).dtype
    device = next(iter(params.values())).device

    for bound in bound_rules(arch):
        owner = _owner_stage(bound, stage_layers)
        tensors: dict[str, torch.Tensor] | None = None
        if pp_rank == owner:
            tensors = _gather_to_hf(bound, params, arch, tp_group, tp_size, tp_rank)
        if pp_size > 1 and tp_rank == 0:  # the owner stage's TP rank 0 sends to the others
            if tensors is None:
                tensors = {
                    name: torch.empty(shape, dtype=dtype, device=device)
                    for name, shape in zip(bound.hf, bound.hf_shapes)
                }
            for t in tensors.values():
                dist.broadcast(t, src=pp_ranks[owner], group=pp_group)
        if not to_tp_rank0_only and tp_size > 1:
            if tensors is None:
                tensors = {
                    name: torch.empty(shape, dtype=dtype, device=device)
                    for name, shape in zip(bound.hf, bound.hf_shapes)
                }
            src = dist.get_process_group_ranks(tp_group)[0]
            for t in tensors.values():
                dist.broadcast(t, src=src, group=tp_group)
        wanted = not to_tp_rank0_only or (tp_rank == 0 and pp_rank == 0)
        if wanted and tensors is not None:
            yield from tensors.items()
