"""PPO with a critic, without Ray: the clipped value loss on hand-computed numbers, GAE
through the driver's advantage step (whitened advantages, raw returns), and the config rules
of stage ray_ppo (critic_config as a role with its own devices, GAE only with a critic, the
critic-only keys warned elsewhere)."""

from __future__ import annotations

import logging

import pytest
import torch

from mindrl.algorithms.kl import FixedKLController
from mindrl.algorithms.loss import clipped_value_loss
from mindrl.config import ConfigError, load_run_config
from mindrl.data.batch import build_sample_batch
from mindrl.trainer.advantage_step import compute_step_advantages


def test_clipped_value_loss_hand_example():
    vpreds = torch.tensor([[1.0, 0.2, 0.0]])
    old = torch.tensor([[0.0, 0.0, 0.0]])
    returns = torch.tensor([[0.0, 1.0, 5.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, m = clipped_value_loss(vpreds, old, returns, mask, cliprange_value=0.5, normalizer=2.0)
    # token 0: unclipped (1-0)^2 = 1, clipped (0.5-0)^2 = 0.25 -> 1 (the prediction is not
    # clipped: max keeps the larger error); token 1: (0.2-1)^2 = 0.64 both ways
    assert float(loss) == pytest.approx(0.5 * (1.0 + 0.64) / 2.0)
    assert m["critic/vf_loss"] == pytest.approx(0.41)
    assert m["critic/vf_clipfrac"] == 0.0
    assert m["critic/vpred_mean"] == pytest.approx(0.6)
    # a prediction moved past the clip towards its target keeps the clipped (larger) error
    loss2, m2 = clipped_value_loss(
        torch.tensor([[2.0]]),
        torch.tensor([[0.0]]),
        torch.tensor([[2.0]]),
        torch.tensor([[1]]),
        cliprange_value=0.5,
        normalizer=1.0,
    )
    assert float(loss2) == pytest.approx(0.5 * 1.5**2)
    assert m2["critic/vf_clipfrac"] == 1.0


def test_value_loss_splits_add_up():
    gen = torch.Generator().manual_seed(0)
    v, old, ret = (torch.randn(4, 6, generator=gen) for _ in range(3))
    mask = (torch.rand(4, 6, generator=gen) > 0.3).long()
    whole, _ = clipped_value_loss(v, old, ret, mask, 0.2, float(mask.sum()))
    parts = sum(
        clipped_value_loss(
            v[i : i + 2], old[i : i + 2], ret[i : i + 2], mask[i : i + 2], 0.2, float(mask.sum())
        )[0]
        for i in (0, 2)
    )
    assert float(parts) == pytest.approx(float(whole))


def _ppo(*extra: str):
    run, _ = load_run_config("ppo_tiny_cpu", list(extra), check_paths=False)
    return run


def test_gae_step_whitens_advantages_and_keeps_raw_returns():
    run = _ppo("rl_config.lam=1.0")
    batch = build_sample_batch([[5, 6], [5, 6]], [[7, 8, 9], [7, 8]], 0)
    values = torch.zeros(batch.response_mask.shape)
    scores = torch.tensor([1.0, 0.0])
    adv = compute_step_advantages(
        batch, scores, run.rl.algorithm, FixedKLController(0.0), values=values
    )
    mask = batch.response_mask.bool()
    # gamma = lam = 1, values 0: every token's return is its sample's score
    assert adv.returns[0][mask[0]].tolist() == [1.0, 1.0, 1.0]
    assert adv.returns[1][mask[1]].tolist() == [0.0, 0.0]
    assert float(adv.values[mask].mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(adv.values[mask].std()) == pytest.approx(1.0, abs=1e-5)
    assert adv.metrics["critic/returns_mean"] == pytest.approx(0.6)
    with pytest.raises(ValueError, match="critic's values"):
        compute_step_advantages(batch, scores, run.rl.algorithm, FixedKLController(0.0))


def test_ppo_config_builds_a_critic_role():
    run = _ppo()
    assert run.critic is not None and run.critic.role == "critic"
    assert run.ref is None  # init_kl_coef 0: no reference model
    assert [r.role for r in run.roles] == ["actor", "critic"]
    assert run.rl.algorithm.adv_estimator == "gae"
    run2 = _ppo(
        "rl_config.colocate_all_models=false",
        "+rl_config.critic_resource.num_npus=2",
        "critic_config.tensor_model_parallel_size=2",
    )
    assert run2.critic.num_devices == 2 and run2.critic.tp == 2


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        (["~critic_config"], "critic_config: required with stage ray_ppo"),
        (["rl_config.adv_estimator=group_norm"], "use adv_estimator: gae"),
        (["rl_config.colocate_all_models=false"], "rl_config.critic_resource: required"),
        (["rl_config.cliprange_value=0"], "cliprange_value: 0.0 must be above 0"),
        (["critic_config.train_iters=5"], "critic_config.train_iters: 5 differs"),
        (["megatron_training.stage=ray_grpo"], "adv_estimator: gae needs a critic's values"),
    ],
)
def test_ppo_rules_are_config_errors(extra, text):
    with pytest.raises(ConfigError) as err:
        _ppo(*extra)
    assert text in str(err.value)


def test_ppo_only_keys_are_warned_with_grpo(caplog):
    with caplog.at_level(logging.WARNING):
        load_run_config(
            "grpo_tiny_cpu",
            ["rl_config.cliprange_value=0.2", "rl_config.lam=0.9"],
            check_paths=False,
        )
    assert "rl_config.cliprange_value: 0.2 has no effect with stage ray_grpo" in caplog.text
    assert "rl_config.lam: 0.9 has no effect with stage ray_grpo" in caplog.text
