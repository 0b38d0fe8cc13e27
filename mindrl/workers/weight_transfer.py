"""Trained weights to rollout engines, in HF naming and in bounded buckets.

Two paths: into engines on the same ranks (the hybrid engine: every rank streams the
all-gathered tensors into its own engine), and through Ray's object store to a separate
rollout group (one sender packs numpy buckets; each rollout worker fetches them one at a
time, so memory in flight stays one bucket).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from mindrl.config.model_arch import ModelArchConfig
from mindrl.rollout.base import RolloutEngine, iter_buckets, tensor_nbytes


def stream_weights(
    model_chunks: list[Any],
    arch: ModelArchConfig,
    engine: RolloutEngine | None,
    bucket_bytes: int,
) -> dict[str, float]:
    """Collective over the role: HF-named full tensors into `engine` (every rank that holds
    one; all ranks take part in the gathers)."""
    from mindrl.checkpoint.online import iter_hf_tensors

    start = time.perf_counter()
    moved = 0
    tensors = iter_hf_tensors(model_chunks, arch, to_tp_rank0_only=engine is None)
    for bucket in iter_buckets(tensors, bucket_bytes):
        moved += sum(tensor_nbytes(t) for _, t in bucket)
        if engine is not None:
            engine.update_weights(bucket)
    return {
        "timing/resharding_to_infer": time.perf_counter() - start,
        "resharding/bytes": float(moved),
    }


def pack_weight_buckets(
    model_chunks: list[Any], arch: ModelArchConfig, bucket_bytes: int, *, sender: bool
) -> list[Any]:
    """Collective: the HF-named weights as object-store buckets of numpy arrays (numpy
    travels through Ray far faster than torch tensors); empty unless `sender`."""
    import ray

    from mindrl.checkpoint.online import iter_hf_tensors

    refs = []
    tensors = iter_hf_tensors(model_chunks, arch, to_tp_rank0_only=True)
    for bucket in iter_buckets(tensors, bucket_bytes):
        if sender:
            refs.append(ray.put([(n, t.detach().cpu().numpy()) for n, t in bucket]))
    return refs


def fetch_weight_buckets(bucket_refs: list[Any]) -> Iterator[list[tuple[str, Any]]]:
    """The packed buckets as named torch tensors, fetched one at a time (bounded memory)."""
    import ray
    import torch

    for ref in bucket_refs:
        yield [(name, torch.from_numpy(array)) for name, array in ray.get(ref)]


def load_weight_buckets(engine: RolloutEngine, bucket_refs: list[Any]) -> int:
    """Fetch packed buckets one at a time into `engine`; bytes moved."""
    moved = 0
    for bucket in fetch_weight_buckets(bucket_refs):
        engine.update_weights(bucket)
        moved += sum(tensor_nbytes(t) for _, t in bucket)
    return moved
