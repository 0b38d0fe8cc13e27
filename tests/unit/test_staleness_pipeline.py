"""The bounded-staleness pipeline (`rl_config.rollout_staleness: k`, k >= 2) on the driver,
with the in-process fakes of the role facades: the batches of the next k steps are in
flight beside training, every sample's policy version is at most k updates behind the step
that trains it, the weights are pushed only once every batch in flight is generated, and a
checkpoint's sampler makes a resumed run train the same prompts."""

from __future__ import annotations

import pytest

from mindrl.config import load_run_config
from mindrl.trainer.grpo import grpo_step, run_state_now
from mindrl.trainer.pipeline import StalenessExceeded, StalenessPipeline, staleness_metrics
from tests.unit.test_trainer_step import (
    FakeDataset,
    FakeRef,
    FakeRoles,
    FakeRolloutGroup,
    PipelineActor,
    StatefulSampler,
    _trainer,
)

STEPS = 6


def _staleness_trainer(k: int, start_step: int = 0, steps: int = STEPS):
    t, _ = _trainer(
        [
            "rl_config.mini_batch_size=8",
            "rl_config.rollout_resource.num_npus=1",
            f"rl_config.rollout_staleness={k}",
            f"megatron_training.train_iters={steps}",
        ]
    )
    log: list[str] = []
    actor, rollout = PipelineActor(log), FakeRolloutGroup(log=log)
    t.roles = FakeRoles(actor, FakeRef(), rollout=rollout)  # type: ignore[misc]
    gbs = t.run.actor.batch.global_batch_size
    t.prompts.dataset = FakeDataset(STEPS * gbs)  # type: ignore[assignment]
    t.prompts.sampler = StatefulSampler(gbs)  # type: ignore[assignment]
    t.start_step = start_step
    return t, actor, rollout


def _run(t, steps):
    pipeline = StalenessPipeline(t)
    metrics, positions = [], []
    for step in steps:
        m, _ = grpo_step(t, step, pipeline=pipeline)
        metrics.append(m)
        positions.append(run_state_now(t, step + 1, pipeline).sampler["position"])
    return metrics, positions


@pytest.mark.parametrize("k", [2, 4])
def test_no_sample_is_older_than_k_updates(k):
    t, actor, _ = _staleness_trainer(k)
    metrics, _ = _run(t, range(STEPS))
    ages = [[step - v for v in batch.meta["policy_version"]] for batch, step in actor.updates]
    assert all(0 <= age <= k for batch_ages in ages for age in batch_ages)
    # synchronous first batch, then one step older each step up to k, then k
    expected = [min(step, k) for step in range(STEPS)]
    assert [batch_ages[0] for batch_ages in ages] == expected
    assert [m["rollout/staleness_max"] for m in metrics] == expected
    assert [m[f"rollout/staleness_share_{k}"] for m in metrics] == [
        1.0 if age == k else 0.0 for age in expected
    ]
    assert all(m["timing/trainer_wait_samples"] >= 0.0 for m in metrics)
    assert "timing/rollout_wait_weights" not in metrics[0]  # nothing generated before step 0
    assert all("timing/rollout_wait_weights" in m for m in metrics[1:])


def test_the_weights_are_pushed_after_every_batch_in_flight_is_generated():
    t, _, rollout = _staleness_trainer(2, steps=4)
    _run(t, range(4))
    seeds = [line for line in rollout.log if line.startswith("dispatch")]
    assert rollout.log == [
        seeds[0],
        "collect",  # step 0's batch: generated synchronously
        seeds[1],
        seeds[2],  # steps 1 and 2 in flight beside update 0
        "update 0",
        "collect",
        "collect",
        "load_weights",
        seeds[3],  # step 3's beside update 1 (step 2's already generated)
        "update 1",
        "collect",
        "load_weights",
        "update 2",  # the last step (3) is in flight already: nothing new
        "load_weights",
        "update 3",
        "load_weights",
    ]
    assert len(set(seeds)) == 4  # each batch has its own step's seed


def test_a_resumed_run_trains_the_same_prompts_as_the_straight_run():
    """A checkpoint after step s records the sampler before the oldest batch in flight (step
    s + 1's): the resumed run regenerates the batches in flight from the same prompts."""
    t, actor, _ = _staleness_trainer(2)
    _, positions = _run(t, range(STEPS))
    gbs = t.run.actor.batch.global_batch_size
    assert positions == [(s + 1) * gbs for s in range(STEPS)]
    straight = [batch.meta["prompt_text"] for batch, _ in actor.updates]

    resumed, resumed_actor, _ = _staleness_trainer(2, start_step=3)
    resumed.prompts.sampler.calls = positions[2] // gbs  # the step-3 checkpoint's sampler
    _, again = _run(resumed, range(3, STEPS))
    assert [batch.meta["prompt_text"] for batch, _ in resumed_actor.updates] == straight[3:]
    assert again == positions[3:]
    # regenerated with the checkpoint's weights: staleness restarts at 0
    assert [b.meta["policy_version"][0] for b, _ in resumed_actor.updates] == [3, 3, 3]


def test_a_sample_older_than_k_is_refused_loudly():
    assert staleness_metrics(5, [3, 4, 5, 5], 2)["rollout/staleness_share_2"] == 0.25
    with pytest.raises(StalenessExceeded, match="outside 0..2"):
        staleness_metrics(5, [2, 5], 2)


@pytest.mark.parametrize(
    "overrides",
    [
        ["rl_config.rollout_resource.num_npus=1"],
        ["+generate_config.server.urls=[127.0.0.1:8000]"],
    ],
)
def test_rollout_staleness_above_one_is_accepted_beside_training(overrides):
    run, _ = load_run_config("grpo_tiny_cpu", [*overrides, "rl_config.rollout_staleness=4"])
    assert run.rl.resources.rollout_staleness == 4
    assert run.rl.algorithm.use_tis
