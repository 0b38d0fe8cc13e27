"""Trained weights to every rollout engine after an update: the hybrid actor streams them
into its own engines; a separate rollout group receives object-store buckets."""

from __future__ import annotations

import time

from mindrl.trainer.roles import Roles


def sync_weights(roles: Roles) -> dict[str, float]:
    if roles.rollout is None:
        return roles.actor.sync_weights()
    start = time.perf_counter()
    moved = roles.rollout.load_weights(roles.actor.pack_weights())
    return {
        "timing/resharding_to_infer": time.perf_counter() - start,
        "resharding/bytes": float(moved),
    }
