"""Reading a dist_checkpointing folder tensor group by tensor group, in one process.

megatron -> HF conversion reads whole layers (up to ``LOAD_GROUP_BYTES`` per partial
``dist_checkpointing.load``) so the reader holds about one layer of a large model; each
group's request is built from the TP=1 meta sharded state dict of the architecture.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mindrl.checkpoint.errors import (
    ConversionError,
    CorruptCheckpointError,
    checkpoint_errors,
    short_reason,
)
from mindrl.checkpoint.mapping import BoundRule, bound_rules
from mindrl.config.model_arch import ModelArchConfig

LOAD_GROUP_BYTES = 256 * 1024**2


def _rule_bytes(bound: BoundRule, itemsize: int) -> int:
    total = 0
    for shape in bound.hf_shapes:
        n = itemsize
        for dim in shape:
            n *= dim
        total += n
    return total


def load_groups(arch: ModelArchConfig, itemsize: int) -> list[list[BoundRule]]:
    """Rules grouped for one dist_checkpointing read each: whole layers (and the non-layer
    tensors) up to LOAD_GROUP_BYTES, so the reader holds about one layer of a large model
    while small models are read in a few calls."""
    segments: list[list[BoundRule]] = []
    for bound in bound_rules(arch):  # export order: embedding, layer 0..L-1, norm, output
        if segments and segments[-1][0].layer == bound.layer:
            segments[-1].append(bound)
        else:
            segments.append([bound])
    if not _partial_loads_supported():
        return [[b for rules in segments for b in rules]]
    groups: list[list[BoundRule]] = []
    size = 0
    for rules in segments:
        rules_size = sum(_rule_bytes(b, itemsize) for b in rules)
        if groups and size + rules_size <= LOAD_GROUP_BYTES:
            groups[-1].extend(rules)
            size += rules_size
        else:
            groups.append(list(rules))
            size = rules_size
    return groups


def _partial_loads_supported() -> bool:
    """megatron-core >= 0.14 loads irregular shards (per-shard path); older releases need the
    whole model requested in one load from a single process."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    return hasattr(ShardedTensor, "has_regular_grid")


def _irregular(sh: Any) -> Any:
    """The same shard as a ShardedTensor without prepended axes or a regular grid.

    megatron-core describes a stacked-layer shard on a regular grid over all layers; a world
    of one process that asks for only some layers then trips torch's sharded-tensor metadata
    check (the missing shards would be placed on this same rank). An irregular shard takes the
    newer per-shard path, which reads any subset.
    """
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    shape = (1,) * sh.prepend_axis_num + tuple(sh.local_shape)
    return ShardedTensor(
        key=sh.key,
        data=sh.data.reshape(shape),
        dtype=sh.dtype,
        local_shape=shape,
        global_shape=tuple(sh.global_shape),
        global_offset=tuple(sh.global_offset),
        axis_fragmentations=None,
        replica_id=sh.replica_id,
        prepend_axis_num=0,
        allow_shape_mismatch=sh.allow_shape_mismatch,
    )


def load_group(sharded: dict[str, Any], group: list[BoundRule], iter_dir: Path) -> dict[str, Any]:
    """Read the (TP=1) tensors of one rule group from a dist_checkpointing folder."""
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    request: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for bound in group:
        entry = sharded.get(bound.mcore)
        if isinstance(entry, ShardedTensorFactory):
            # the factory's shards are chunks of one buffer: loading fills it in place
            buffer = torch.empty(entry.data.shape, dtype=entry.data.dtype)
            shards = sorted(
                dataclasses.replace(entry, data=buffer).build(), key=lambda sh: sh.global_offset
            )
        elif isinstance(entry, ShardedTensor):
            buffer = torch.empty(tuple(entry.local_shape), dtype=entry.dtype)
            shards = [dataclasses.replace(entry, data=buffer)]
        else:
            raise ConversionError(f"megatron-core model has no parameter {bound.mcore}")
        out[bound.mcore] = buffer
        for i, sh in enumerate(shards):
            request[f"{bound.mcore}#{i}"] = _irregular(sh) if _partial_loads_supported() else sh
    from mindrl.checkpoint.safe_load import check_dcp_folder

    check_dcp_folder(iter_dir)  # its pickled parts hold plain data only
    try:
        loaded = dist_checkpointing.load(request, str(iter_dir), validate_access_integrity=False)
    except checkpoint_errors() as exc:
        names = list(out)
        what = names[0] if len(names) == 1 else f"{names[0]} (+{len(names) - 1} more)"
        raise CorruptCheckpointError(
            iter_dir, f"cannot read {what} from this megatron checkpoint ({short_reason(exc)})"
        ) from exc
    for key, sh in request.items():
        if loaded[key].data_ptr() != sh.data.data_ptr():  # loaded elsewhere: copy into place
            sh.data.copy_(loaded[key].reshape(sh.data.shape))
    return out
