"""The rollout correction (`mindrl.algorithms.tis`): each level's weights and metrics against
hand computations, mask mode's dropped tokens and sequences in the loss, and its config keys
(verl's names, `use_tis` / `tis_cap`, the default by staleness, no-effect warnings)."""

from __future__ import annotations

import math

import pytest
import torch

from mindrl.algorithms.loss import GRPOLossConfig, grpo_loss
from mindrl.algorithms.tis import RolloutCorrection, rollout_correction

LN = math.log
P = "actor/rollout_is"


def _two_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """old - rollout log ratios: row 0 = [ln 3, ln 0.25, ln 1.5], row 1 = [ln 1.2, pad, pad]."""
    old = torch.tensor([[LN(3.0), LN(0.25), LN(1.5)], [LN(1.2), 5.0, 5.0]])
    rollout = torch.tensor([[0.0, 0.0, 0.0], [0.0, float("-inf"), 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    return old, rollout, mask


def _pop_std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def test_token_truncate_weights_and_metrics() -> None:
    old, rollout, mask = _two_rows()
    out = rollout_correction(old, rollout, mask, RolloutCorrection("token", "truncate", 2.0))
    torch.testing.assert_close(out.weights, torch.tensor([[2.0, 0.25, 1.5], [1.2, 1.0, 1.0]]))
    raw = [3.0, 0.25, 1.5, 1.2]
    m = out.metrics
    assert m[f"{P}_mean"] == pytest.approx(sum(raw) / 4)
    assert m[f"{P}_std"] == pytest.approx(_pop_std(raw))
    assert (m[f"{P}_min"], m[f"{P}_max"]) == pytest.approx((0.25, 3.0))
    assert m[f"{P}_clipfrac"] == pytest.approx(1 / 4)  # ln 3 above the cap
    assert f"{P}_masked_fraction" not in m


def test_sequence_level_is_the_product_of_the_ratios() -> None:
    old, rollout, mask = _two_rows()
    out = rollout_correction(old, rollout, mask, RolloutCorrection("sequence", "truncate", 2.0))
    # row 0: 3 * 0.25 * 1.5 = 1.125 (under the cap); row 1: 1.2; padding 1
    torch.testing.assert_close(out.weights, torch.tensor([[1.125] * 3, [1.2, 1.0, 1.0]]))
    m = out.metrics
    assert m[f"{P}_mean"] == pytest.approx((1.125 + 1.2) / 2)  # one weight per sequence
    assert m[f"{P}_std"] == pytest.approx(_pop_std([1.125, 1.2]))
    assert (m[f"{P}_min"], m[f"{P}_max"], m[f"{P}_clipfrac"]) == pytest.approx((1.125, 1.2, 0.0))
    capped = rollout_correction(old, rollout, mask, RolloutCorrection("sequence", "truncate", 1.1))
    torch.testing.assert_close(capped.weights, torch.tensor([[1.1] * 3, [1.1, 1.0, 1.0]]))
    assert capped.metrics[f"{P}_clipfrac"] == pytest.approx(1.0)  # every valid token


def test_geometric_level_is_the_mean_log_ratio() -> None:
    old, rollout, mask = _two_rows()
    out = rollout_correction(old, rollout, mask, RolloutCorrection("geometric", "truncate", 2.0))
    geo = 1.125 ** (1 / 3)
    torch.testing.assert_close(out.weights, torch.tensor([[geo] * 3, [1.2, 1.0, 1.0]]))
    assert out.metrics[f"{P}_max"] == pytest.approx(1.2)
    assert out.metrics[f"{P}_min"] == pytest.approx(geo)


def test_mask_mode_drops_tokens_and_sequences_outside_the_range() -> None:
    old, rollout, mask = _two_rows()
    token = rollout_correction(old, rollout, mask, RolloutCorrection("token", "mask", 2.0, 0.5))
    # ln 3 > 2 and 0.25 < 0.5 dropped; 1.5 and 1.2 kept with their weight
    torch.testing.assert_close(token.weights, torch.tensor([[0.0, 0.0, 1.5], [1.2, 1.0, 1.0]]))
    assert token.metrics[f"{P}_masked_fraction"] == pytest.approx(2 / 4)
    assert token.metrics[f"{P}_seq_masked_fraction"] == pytest.approx(1 / 2)
    assert f"{P}_clipfrac" not in token.metrics
    seq = rollout_correction(old, rollout, mask, RolloutCorrection("sequence", "mask", 1.15, 0.9))
    # row 0's 1.125 is inside [0.9, 1.15], row 1's 1.2 is not: the whole row goes
    torch.testing.assert_close(seq.weights, torch.tensor([[1.125] * 3, [0.0, 1.0, 1.0]]))
    assert seq.metrics[f"{P}_masked_fraction"] == pytest.approx(1 / 4)
    assert seq.metrics[f"{P}_seq_masked_fraction"] == pytest.approx(1 / 2)


def test_empty_batch_and_bad_settings() -> None:
    zeros = torch.zeros(2, 3)
    out = rollout_correction(zeros, zeros, zeros, RolloutCorrection("sequence", "mask", 2.0, 0.5))
    assert torch.equal(out.weights, torch.ones(2, 3))
    assert all(math.isfinite(v) for v in out.metrics.values())
    for bad in (("batch", "truncate"), ("token", "clip")):
        with pytest.raises(ValueError):
            RolloutCorrection(*bad)
    with pytest.raises(ValueError, match="lower"):
        RolloutCorrection("token", "mask", 2.0, 2.5)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_mask_mode_zeroes_exactly_the_out_of_range_tokens_in_the_loss(level: str) -> None:
    """The gradient of the loss is zero on exactly the dropped tokens (rows, at the sequence
    levels), and the loss equals the unmasked one with those tokens' losses taken out."""
    g = torch.Generator().manual_seed(3)
    b, t = 6, 5
    old = -torch.rand(b, t, generator=g) * 2
    rollout = old + torch.randn(b, t, generator=g) * 0.6
    log_prob = (old + torch.randn(b, t, generator=g) * 0.05).requires_grad_(True)
    adv = torch.randn(b, 1, generator=g).expand(b, t).clone()
    mask = torch.ones(b, t)
    mask[0, 3:] = 0
    cfg = GRPOLossConfig(
        use_tis=True,
        rollout_is_level=level,
        rollout_is_mode="mask",
        rollout_is_threshold=1.3,
        clip_ratio_c=None,
    )
    assert cfg.rollout_is_bounds == pytest.approx((1 / 1.3, 1.3))
    loss, metrics = grpo_loss(cfg, log_prob, old, adv, mask, rollout_log_prob=rollout)
    (grad,) = torch.autograd.grad(loss, log_prob)
    log_r = (old - rollout) * mask
    if level == "token":
        w = log_r.exp()
    elif level == "sequence":
        w = log_r.sum(-1, keepdim=True).exp().expand(b, t)
    else:
        w = (log_r.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)).exp().expand(b, t)
    outside = ((w < 1 / 1.3) | (w > 1.3)) & mask.bool()
    assert 0 < int(outside.sum()) < int(mask.sum())  # the case drops some, keeps some
    assert torch.equal(grad[outside], torch.zeros_like(grad[outside]))
    kept = ~outside & mask.bool()
    assert bool((grad[kept] != 0).all())
    assert metrics[f"{P}_masked_fraction"] == pytest.approx(float(outside.sum() / mask.sum()))
    # by hand: token-mean over every valid token of w * (-A * ratio) on the kept ones
    ratio = (log_prob.detach() - old).exp()
    by_hand = (torch.where(kept, w * -adv * ratio, torch.zeros(())).sum() / mask.sum()).item()
    assert loss.item() == pytest.approx(by_hand, rel=1e-5)


# -- config -----------------------------------------------------------------------------


def test_use_tis_and_tis_cap_map_to_the_rollout_correction_keys() -> None:
    from mindrl.config import load_run_config

    run, _ = load_run_config("grpo_tiny_cpu", ["+rl_config.use_tis=true", "+rl_config.tis_cap=3"])
    alg = run.rl.algorithm
    assert alg.use_tis and alg.rollout_is_threshold == 3.0
    assert (alg.rollout_is_level, alg.rollout_is_mode) == ("token", "truncate")
    run, _ = load_run_config(
        "grpo_tiny_cpu",
        [
            "+rl_config.use_tis=true",
            "+rl_config.rollout_is_level=geometric",
            "+rl_config.rollout_is_mode=mask",
            "+rl_config.rollout_is_threshold=1.01",
            "+rl_config.rollout_is_threshold_lower=0.98",
        ],
    )
    loss = run.rl.algorithm.loss_config()
    assert (loss.rollout_is_level, loss.rollout_is_mode) == ("geometric", "mask")
    assert loss.rollout_is_bounds == (0.98, 1.01)


def test_the_correction_is_on_by_default_one_step_off_only() -> None:
    from mindrl.config import load_run_config

    sync, _ = load_run_config("grpo_tiny_cpu", [])
    assert not sync.rl.algorithm.use_tis
    off = ["rl_config.rollout_staleness=1", "rl_config.rollout_resource.num_npus=1"]
    piped, _ = load_run_config("grpo_tiny_cpu", off)
    alg = piped.rl.algorithm
    assert alg.use_tis and (alg.rollout_is_level, alg.rollout_is_mode) == ("token", "truncate")
    seq, _ = load_run_config("grpo_tiny_cpu", [*off, "+rl_config.rollout_is_level=sequence"])
    assert seq.rl.algorithm.use_tis and seq.rl.algorithm.rollout_is_level == "sequence"


def test_keys_without_effect_are_warned() -> None:
    from mindrl.config import ConfigError, load_run_config
    from mindrl.config.fates import reset_warnings, warned

    reset_warnings()
    load_run_config("grpo_tiny_cpu", ["+rl_config.rollout_is_mode=mask"])
    assert "correction is off" in warned()["rollout_correction.rollout_is_mode"]
    reset_warnings()
    load_run_config(
        "grpo_tiny_cpu", ["+rl_config.use_tis=true", "+rl_config.rollout_is_threshold_lower=0.2"]
    )
    assert "truncate" in warned()["rollout_correction.rollout_is_threshold_lower"]
    reset_warnings()
    with pytest.raises(ConfigError, match="rollout_is_threshold_lower: 3.0 must be below"):
        load_run_config("grpo_tiny_cpu", ["+rl_config.rollout_is_threshold_lower=3.0"])
    with pytest.raises(ConfigError, match="rollout_is_level"):
        load_run_config("grpo_tiny_cpu", ["+rl_config.rollout_is_level=batch"])


@pytest.mark.parametrize(
    "override",
    [
        "+rl_config.rollout_is_veto_threshold=0.0001",
        "+rl_config.rollout_is_batch_normalize=true",
        "+rl_config.rollout_rs=token_k1",
    ],
)
def test_verls_unbuilt_correction_keys_are_refused_with_the_built_equivalent(override) -> None:
    from mindrl.config import ConfigError, load_run_config

    with pytest.raises(ConfigError, match="is refused: verl's"):
        load_run_config("grpo_tiny_cpu", ["+rl_config.use_tis=true", override])
