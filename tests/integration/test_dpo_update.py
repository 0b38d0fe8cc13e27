"""DPO on megatron-core over gloo: the ActorWorker's DPO updater (stage dpo) at TP 2 takes
real steps whose metrics carry TRL's names and move the right way, and on the toy pairs of
`dpo_tiny_cpu` held-out preference accuracy rises from chance to >= 0.9."""

from __future__ import annotations

from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("_dpo_rank.py")
TIMEOUT_S = 600.0
TRL_NAMES = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


def test_two_dpo_steps_at_tp2(fresh_process):
    args = {"overrides": ["megatron_training.tensor_model_parallel_size=2"], "steps": 2, "batch": 8}
    results = fresh_process.ranks(SCRIPT, args, world_size=2, timeout_s=TIMEOUT_S)
    assert results[0]["metrics"] == results[1]["metrics"]  # TP ranks agree
    first, second = results[0]["metrics"]
    for name in TRL_NAMES:
        assert name in first and name in second
    # step 0: the policy is the reference, every margin is 0 and the sigmoid loss is log 2
    assert first["rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert first["dpo/loss"] == pytest.approx(0.693147, abs=1e-4)
    assert first["grad_norm"] > 0
    # after one step on these pairs the chosen side gained on the rejected one
    assert second["rewards/margins"] > 0
    assert second["dpo/loss"] < first["dpo/loss"]


def test_held_out_preference_accuracy_rises(fresh_process):
    args = {"overrides": [], "steps": 30, "batch": 16}
    (result,) = fresh_process.ranks(SCRIPT, args, world_size=1, timeout_s=TIMEOUT_S)
    assert 0.25 <= result["accuracy_before"] <= 0.75, result
    assert result["accuracy_after"] >= 0.9, result
    assert result["metrics"][-1]["rewards/accuracies"] >= 0.9


def test_packed_pairs_give_the_padded_losses(fresh_process):
    """use_remove_padding: each micro-batch's pairs packed into one sequence, same numbers."""
    runs = []
    for extra in ([], ["rl_config.use_remove_padding=true"]):
        args = {"overrides": extra, "steps": 2, "batch": 8}
        (result,) = fresh_process.ranks(SCRIPT, args, world_size=1, timeout_s=TIMEOUT_S)
        runs.append(result["metrics"])
    padded, packed = runs
    for a, b in zip(padded, packed, strict=True):
        for name in (*TRL_NAMES, "dpo/loss"):
            assert b[name] == pytest.approx(a[name], rel=1e-4, abs=1e-5), name


def test_pp2_takes_the_same_steps_as_one_stage(fresh_process):
    """The pairs go through megatron's pipeline schedule: two stages, the same DPO steps."""
    base = {"steps": 2, "batch": 8}
    (one,) = fresh_process.ranks(
        SCRIPT, {**base, "overrides": []}, world_size=1, timeout_s=TIMEOUT_S
    )
    staged = fresh_process.ranks(
        SCRIPT,
        {**base, "overrides": ["megatron_training.pipeline_model_parallel_size=2"]},
        world_size=2,
        timeout_s=TIMEOUT_S,
    )
    last_stage = staged[-1]["metrics"]
    for expected, got in zip(one["metrics"], last_stage):
        for name in (*TRL_NAMES, "dpo/loss"):
            assert got[name] == pytest.approx(expected[name], rel=1e-4, abs=1e-5), name
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-4)
