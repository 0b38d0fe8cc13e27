"""The reference as a weight snapshot in the actor's processes (rl_config.reference_in_actor)
on megatron-core over gloo (fp32, TP 1 and TP 2): the reference's log-probs are the start
weights' before and after training, swapping it in and out between updates leaves training
bit for bit as it was without it, and a resumed actor still holds the loaded reference, not
the checkpoint's policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).with_name("_reference_snapshot_rank.py")
TIMEOUT_S = 300.0
SNAPSHOT = ["rl_config.reference_in_actor=true"]


def _train(fresh_process, hf_dir: str, world: int, overrides: list[str], **extra: Any) -> dict:
    args = {"hf_dir": hf_dir, "overrides": overrides, "steps": 3, "ref_passes": True, **extra}
    return fresh_process.ranks(SCRIPT, args, world_size=world, timeout_s=TIMEOUT_S)[0]


def _max_gap(a: list, b: list) -> float:
    import torch

    return float((torch.tensor(a) - torch.tensor(b)).abs().max())


@pytest.mark.parametrize("world", [1, 2], ids=["tp1", "tp2"])
def test_the_snapshot_is_the_start_weights_and_leaves_training_untouched(
    fresh_process, tiny_model_dir, world
):
    overrides = [f"actor_config.tensor_model_parallel_size={world}"]
    held = _train(fresh_process, str(tiny_model_dir), world, overrides + SNAPSHOT)
    plain = _train(fresh_process, str(tiny_model_dir), world, overrides)
    assert plain["ref_before"] is None  # no snapshot without reference_in_actor
    # the reference is the loaded weights: the policy's log-probs before training, exactly
    assert held["ref_before"] == held["policy_before"]
    assert held["ref_after"] == held["ref_before"]
    assert _max_gap(held["policy"], held["policy_before"]) > 1e-3  # training moved the policy
    # reference passes between updates change nothing in training
    assert held["metrics"] == plain["metrics"]
    assert held["policy"] == plain["policy"]


def test_a_resumed_actor_holds_the_loaded_reference(fresh_process, tiny_model_dir, tmp_path):
    save = tmp_path / "ckpt"
    first = _train(
        fresh_process, str(tiny_model_dir), 1, SNAPSHOT, save=str(save), save_unfused=True
    )
    resumed = _train(fresh_process, str(tiny_model_dir), 1, SNAPSHOT, resume=str(save), steps=0)
    assert resumed["policy"] == first["policy"]  # the checkpoint's policy
    # torch's host Adam steps with its fused kernel, also resumed from a checkpoint whose
    # saved group options say otherwise
    assert first["adam_fused"] and all(first["adam_fused"])
    assert resumed["adam_fused"] == first["adam_fused"]
    assert resumed["ref_before"] == first["ref_before"]  # the reference is not the checkpoint
