"""Partial rollout (`rl_config.partial_rollout_max_split`) on the driver, with the in-process
fakes of the role facades: rounds of at most max_tokens // N tokens, a step trains once
global_batch_size prompts are complete, the rest continue with the next policy, every token
keeps the version that generated it, and the pool survives a checkpoint."""

from __future__ import annotations

import json

import pytest

from mindrl.config import load_run_config
from mindrl.config.errors import ConfigError
from mindrl.rollout.base import RolloutRow
from mindrl.trainer.grpo import grpo_step, partial_rollout, run_state_now
from mindrl.trainer.partial_rollout import (
    STATE_KEY,
    PartialRollout,
    PartialSample,
    finish_reason,
    round_budget,
)
from tests.unit.test_trainer_step import FakeActor, FakeRef, FakeRoles, StatefulSampler, _trainer

SPLITS = 4
MAX_TOKENS = 16
SHORT, LONG = 3, 14  # response lengths of even / odd prompt records


class RoundActor(FakeActor):
    """Generates token 7 until a response reaches its record's length (the record is the
    prompt's first token - 10): SHORT for even records, LONG for odd ones; records every
    budget it was asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.budgets: list[int] = []

    def generate(self, prompts_per_rank, sampling, tools_kwargs_per_rank=None):
        self.calls.append("generate")
        assert sampling.n == 1
        self.budgets.append(sampling.max_tokens)
        out = []
        for prompts in prompts_per_rank:
            rows = []
            for p, ids in enumerate(prompts):
                target = SHORT if (ids[0] - 10) % 2 == 0 else LONG
                so_far = len(ids) - 2
                k = min(sampling.max_tokens, target - so_far)
                reason = "stop" if so_far + k == target else "length"
                rows.append(RolloutRow(p, [7] * k, [-0.5] * k, reason))
            out.append(rows)
        return out


def _partial_trainer(steps: int = 4):
    t, _ = _trainer(
        [
            "rl_config.mini_batch_size=8",
            f"rl_config.partial_rollout_max_split={SPLITS}",
            f"generate_config.sampling_config.max_tokens={MAX_TOKENS}",
            f"megatron_training.train_iters={steps}",
        ]
    )
    actor = RoundActor()
    t.roles = FakeRoles(actor, FakeRef())  # type: ignore[misc]
    t.prompts.sampler = StatefulSampler(t.run.actor.batch.global_batch_size)  # type: ignore[misc]
    return t, actor


def test_round_budgets_and_finishing():
    sample = PartialSample()
    assert round_budget(sample, 16, 4) == 4
    sample.extend([7] * 12, [-1.0] * 12, 0)
    sample.rounds = 3
    assert round_budget(sample, 16, 4) == 4  # the last round: what is left
    assert round_budget(PartialSample(tokens=[7] * 14, rounds=3), 17, 4) == 3
    assert round_budget(PartialSample(), 3, 4) == 1  # never a zero-token round
    assert finish_reason(sample, "stop", 16) == "stop"
    assert finish_reason(sample, "length", 16) is None  # the round's own cut
    sample.extend([7] * 4, [-1.0] * 4, 1)
    assert finish_reason(sample, "length", 16) == "length"
    assert sample.versions == [0] * 12 + [1] * 4


def test_a_step_trains_on_complete_prompts_and_continues_the_rest_with_the_next_policy():
    t, actor = _partial_trainer()
    partial = partial_rollout(t)
    assert isinstance(partial, PartialRollout) and t.run.rl.algorithm.use_tis
    gbs, n = t.run.actor.batch.global_batch_size, t.run.rl.algorithm.n_samples_per_prompt

    metrics, _ = grpo_step(t, 0, partial=partial)
    batch, _ = actor.updates[-1]
    # 2 x gbs prompts joined; one round finished the short (even) ones: they train
    assert metrics["rollout/partial_rounds"] == 1.0 and actor.budgets == [MAX_TOKENS // SPLITS]
    assert batch.size == gbs * n and set(batch.meta["label"]) == {str(i) for i in range(0, 16, 2)}
    assert metrics["rollout/partial_resumed"] == 0.0
    assert metrics["rollout/partial_pool_prompts"] == gbs
    assert actor.calls.count("rollout_mode") == 1 == actor.calls.count("train_mode")

    metrics, _ = grpo_step(t, 1, partial=partial)
    batch, _ = actor.updates[-1]
    # the long ones of step 0 (oldest first) finished with the policy of update 0
    assert set(batch.meta["label"]) == {str(i) for i in range(1, 16, 2)}
    assert batch.meta["policy_version"] == [0] * (gbs * n)
    assert metrics["rollout/partial_resumed"] == 1.0 and metrics["rollout/staleness_max"] == 1.0
    assert all(reason == "stop" for reason in batch.meta["finish_reason"])
    lengths = batch.response_mask.sum(-1)
    assert lengths.eq(LONG).all()
    # rounds until gbs prompts were complete; never more than max_tokens // N in a round but
    # a sample's last
    assert metrics["rollout/partial_rounds"] == 3.0
    assert max(actor.budgets) == MAX_TOKENS // SPLITS


def test_the_pool_survives_a_checkpoint():
    t, _ = _partial_trainer()
    partial = partial_rollout(t)
    grpo_step(t, 0, partial=partial)
    state = run_state_now(t, 1, partial=partial)
    saved = json.loads(json.dumps(state.extra))  # what run_state.json holds
    t2, _ = _partial_trainer()
    t2.resumed_extra = saved
    t2.start_step = 1
    again = partial_rollout(t2)
    assert again.state_dict() == partial.state_dict() and again.version == 1
    assert len(saved[STATE_KEY]["pool"]) == t.run.actor.batch.global_batch_size


def test_the_last_step_draws_no_prompts_it_cannot_train():
    t, _ = _partial_trainer(steps=2)
    partial = partial_rollout(t)
    grpo_step(t, 0, partial=partial)
    grpo_step(t, 1, partial=partial)
    assert t.prompts.sampler.calls == 2  # 2 x gbs at step 0, none at the last step


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["generate_config.sampling_config.max_tokens=3"], "cannot split"),
        (
            ["rl_config.rollout_resource.num_npus=1", "rl_config.rollout_staleness=1"],
            "with partial rollout",
        ),
    ],
)
def test_partial_rollout_refusals(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config("grpo_tiny_cpu", ["rl_config.partial_rollout_max_split=4", *overrides])


def test_an_explicit_use_tis_is_kept():
    run, _ = load_run_config(
        "grpo_tiny_cpu", ["rl_config.partial_rollout_max_split=2", "rl_config.use_tis=false"]
    )
    assert not run.rl.algorithm.use_tis


def test_partial_rollout_with_dynamic_sampling_is_refused():
    with pytest.raises(ConfigError, match="partial_rollout_max_split > 1 with DAPO"):
        load_run_config("dapo_tiny_cpu", ["rl_config.partial_rollout_max_split=4"])
