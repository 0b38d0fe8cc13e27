"""stage ray_dapo in the step, with in-process fakes of the role facades (as
test_trainer_step): dynamic sampling over generation batches, its limit, the overlong
buffer penalty in the scores, and what DAPO's keys mean in the config."""

from __future__ import annotations

import logging

import pytest
import torch

from mindrl.config import ConfigError, load_run_config
from mindrl.config.fates import reset_warnings
from mindrl.config.meaning import meaning_lines
from mindrl.trainer.dynamic_sampling import DynamicSamplingError
from mindrl.trainer.grpo import grpo_step
from tests.unit.test_trainer_step import FakeActor, _row, _trainer

DAPO = [
    "megatron_training.stage=ray_dapo",
    "rl_config.filter_groups_enable=true",
    "rl_config.filter_groups_metric=digit_share",
    "rl_config.filter_groups_train_batch_size=8",
    "rl_config.mini_batch_size=8",
]


class TieOnEvenPrompts(FakeActor):
    """Responses of prompts with an even first token all have 2 tokens (their group's
    scores tie); the others 1..n tokens. Records each call's seed and prompts."""

    seen: list = []

    def generate(self, prompts_per_rank, sampling, tools_kwargs_per_rank=None):
        self.calls.append("generate")
        self.seen.append((sampling.seed, [p[0] for prompts in prompts_per_rank for p in prompts]))
        return [
            [
                _row(i, [7] * (2 if p[0] % 2 == 0 else k + 1))
                for i, p in enumerate(prompts)
                for k in range(sampling.n)
            ]
            for prompts in prompts_per_rank
        ]


def _dapo_trainer(extra: list[str]):
    t, _ = _trainer([*DAPO, *extra])
    actor = TieOnEvenPrompts()
    actor.seen = []
    t.roles.actor = actor  # type: ignore[misc]
    t.roles.ref = None  # type: ignore[misc]
    return t, actor


def test_dynamic_sampling_generates_until_the_train_batch_holds_varied_groups():
    t, actor = _dapo_trainer(["rl_config.filter_groups_max_batches=-1"])
    assert t.run.ref is None  # DAPO: no reference model
    metrics, scored = grpo_step(t, step=2)
    # half of each batch's 8 prompts vary: two batches hold the 8 the step trains on
    assert actor.calls.count("generate") == 2
    assert [len(p) for _, p in actor.seen] == [8, 8]  # global_batch_size prompts each
    assert actor.seen[0][0] != actor.seen[1][0]  # each batch its own seed
    batch, step = actor.updates[0]
    assert step == 2 and batch.size == 8 * 4
    groups = scored.scores.view(-1, 4)
    assert (groups.amax(1) != groups.amin(1)).all()  # only varied groups trained on
    assert metrics["train/num_gen_batches"] == 2.0
    assert (metrics["dapo/kept_prompts"], metrics["dapo/filtered_prompts"]) == (8.0, 8.0)
    assert len(scored.completions) == batch.size
    # the kept prompts are the odd ones of both batches, in generation order
    assert batch.meta["prompt_text"][::4] == ["p1", "p3", "p5", "p7", "p9", "p11", "p13", "p15"]


def test_dynamic_sampling_stops_at_filter_groups_max_batches():
    t, actor = _dapo_trainer(["rl_config.filter_groups_max_batches=1"])
    with pytest.raises(DynamicSamplingError) as info:
        grpo_step(t, step=0)
    text = str(info.value)
    assert "1 generation batch(es) of 8 prompts" in text
    assert "held 4 prompts whose digit_share scores differ" in text
    assert "filter_groups_train_batch_size asks for 8" in text
    assert actor.calls.count("generate") == 1 and not actor.updates


def test_overlong_buffer_penalty_is_added_to_the_rule_scores():
    # responses of 1..4 tokens, max_tokens 16, buffer 14: free up to 2 tokens, then -f/14 each
    t, actor = _trainer(
        [
            "rl_config.n_samples_per_prompt=4",
            "rl_config.overlong_buffer_enable=true",
            "rl_config.overlong_buffer=14",
            "rl_config.overlong_buffer_penalty_factor=0.7",
            "rl_config.rollout_max_tokens=16",
        ]
    )
    metrics, scored = grpo_step(t, step=0)
    expected = [1.0, 2.0, 3.0 - 0.7 / 14, 4.0 - 1.4 / 14]
    assert scored.scores.view(-1, 4)[0].tolist() == pytest.approx(expected)
    assert metrics["reward/overlong_penalty_mean"] == pytest.approx(-2.1 / 14 / 4)


def _load(extra: list[str]):
    run, _ = load_run_config("grpo_tiny_cpu", [*DAPO, *extra], check_paths=False)
    return run


def test_dapo_keys_become_the_loss_settings_and_drop_the_reference(caplog):
    reset_warnings()
    with caplog.at_level(logging.WARNING):
        run = _load(
            [
                "rl_config.clip_higher_enable=true",
                "rl_config.clip_ratio_low=0.2",
                "rl_config.clip_ratio_high=0.28",
                "rl_config.token_level_loss=false",
            ]
        )
    alg = run.rl.algorithm
    assert (alg.clip_ratio, alg.clip_ratio_high, alg.clip_ratio_c) == (0.2, 0.28, None)
    assert alg.loss_agg_mode == "seq-mean-token-mean" and alg.kl.where == "off"
    assert run.ref is None and run.train_prompts == 8
    assert "no effect with stage ray_dapo" in caplog.text  # the config's KL loss and ref_config
    line = next(x for x in meaning_lines(run) if x.startswith("stage ray_dapo"))
    assert "ratio clipped to [0.8, 1.28]" in line and "dynamic sampling: 8 prompts" in line
    plain = _load(["rl_config.clip_ratio=0.25"])
    assert (plain.rl.algorithm.clip_ratio, plain.rl.algorithm.clip_ratio_high) == (0.25, 0.25)
    assert plain.rl.algorithm.loss_agg_mode == "token-mean"


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        (["rl_config.filter_groups_metric=acc"], "filter_groups_metric: acc must be one of"),
        (
            ["rl_config.filter_groups_train_batch_size=16"],
            "filter_groups_train_batch_size: 16 prompts is above global_batch_size (8)",
        ),
        (
            ["rl_config.overlong_buffer_enable=true", "rl_config.overlong_buffer=4"],
            "rl_config.rollout_max_tokens: 2048 differs from",
        ),
        (
            [
                "rl_config.overlong_buffer_enable=true",
                "rl_config.overlong_buffer=16",
                "rl_config.rollout_max_tokens=16",
            ],
            "rl_config.overlong_buffer: 16 must be above 0 and below",
        ),
        (
            ["rl_config.clip_higher_enable=true", "rl_config.clip_ratio_low=0.3"],
            "clip_ratio_low: 0.3 is above clip_ratio_high (0.1)",
        ),
        (["rl_config.policy_loss=gspo"], "policy_loss: gspo with stage ray_dapo"),
    ],
)
def test_dapo_rules_are_config_errors(extra, text):
    with pytest.raises(ConfigError) as info:
        _load(extra)
    assert text in str(info.value), str(info.value)


def test_dapo_only_keys_are_warned_with_grpo(caplog):
    reset_warnings()
    with caplog.at_level(logging.WARNING):
        run, _ = load_run_config(
            "grpo_tiny_cpu",
            ["rl_config.filter_groups_enable=true", "rl_config.clip_higher_enable=true"],
            check_paths=False,
        )
    assert run.train_prompts == run.actor.batch.global_batch_size
    assert "rl_config.filter_groups_enable: True has no effect with stage ray_grpo" in caplog.text
    assert "rl_config.clip_higher_enable: True has no effect with stage ray_grpo" in caplog.text
    assert run.rl.algorithm.clip_ratio_c == 3.0  # GRPO's loss unchanged


def test_scores_select_and_concat_keep_rows_aligned():
    from mindrl.trainer.scoring import Scored

    a = Scored(torch.tensor([1.0, 2.0]), {}, [{"i": 0}, {"i": 1}], {"f": torch.tensor([5.0, 6.0])})
    b = a.select(torch.tensor([1]))
    both = Scored.concat([a, b], {"m": 1.0})
    assert both.scores.tolist() == [1.0, 2.0, 2.0] and both.per_function["f"].tolist() == [5, 6, 6]
    assert [c["i"] for c in both.completions] == [0, 1, 1] and both.metrics == {"m": 1.0}


@pytest.mark.parametrize("name", ["dapo_tiny_cpu", "dapo_smollm2_cpu"])
def test_shipped_dapo_configs_validate(name):
    run, _ = load_run_config(name, check_paths=False)
    assert run.actor.data.stage == "ray_dapo" and run.ref is None
    dapo = run.rl.dapo
    assert dapo.filter_groups_enable and dapo.overlong_buffer_enable and dapo.clip_higher_enable
    assert dapo.rollout_max_tokens == run.generate.sampling_config.max_tokens
