"""DPO losses against literal hand computations on fixed numbers (TRL's formulas as its docs
write them: sigmoid -log sigmoid(beta z), cDPO's smoothing, hinge relu(1 - beta z), IPO
(z - 1/(2 beta))^2 on length-averaged log-probs; MindSpeed-LLM's pref_ftx SFT term)."""

from __future__ import annotations

import math

import pytest
import torch

from mindrl.algorithms.dpo import dpo_loss, pair_losses, sequence_log_probs
from mindrl.algorithms.dpo_config import DPOLossConfig
from mindrl.algorithms.names import DPO_LOSS_TYPES

# One pair. Chosen: two scored tokens of -0.5 (sum -1.0); rejected: four tokens summing to -3.0.
CHOSEN_TOKENS = torch.tensor([[-0.5, -0.5, -7.0, -7.0]])
CHOSEN_MASK = torch.tensor([[1, 1, 0, 0]])
REJECTED_TOKENS = torch.tensor([[-1.0, -1.0, -0.5, -0.5]])
REJECTED_MASK = torch.tensor([[1, 1, 1, 1]])
REF_CHOSEN = torch.tensor([-2.0])
REF_REJECTED = torch.tensor([-2.5])
# z = (-1 - -3) - (-2 - -2.5) = 1.5; with beta 0.1, beta * z = 0.15.


def _loss(**knobs: object) -> tuple[float, dict[str, float]]:
    out = dpo_loss(
        DPOLossConfig(**knobs),  # type: ignore[arg-type]
        CHOSEN_TOKENS,
        REJECTED_TOKENS,
        REF_CHOSEN,
        REF_REJECTED,
        CHOSEN_MASK,
        REJECTED_MASK,
    )
    return float(out.loss), out.metric_sums


def test_sequence_log_probs_sum_masked_tokens():
    sums, lengths = sequence_log_probs(CHOSEN_TOKENS, CHOSEN_MASK)
    assert sums.tolist() == [-1.0] and lengths.tolist() == [2.0]


def test_sigmoid_is_minus_log_sigmoid_of_beta_z():
    loss, metrics = _loss(dpo_beta=0.1)
    assert loss == pytest.approx(math.log(1.0 + math.exp(-0.15)), abs=1e-6)
    assert metrics["rewards/chosen"] == pytest.approx(0.1 * (-1.0 + 2.0))
    assert metrics["rewards/rejected"] == pytest.approx(0.1 * (-3.0 + 2.5))
    assert metrics["rewards/margins"] == pytest.approx(0.15)
    assert metrics["rewards/accuracies"] == 1.0
    assert metrics["logps/chosen"] == -1.0 and metrics["logps/rejected"] == -3.0


def test_label_smoothing_is_cdpo_mixture():
    loss, _ = _loss(dpo_beta=0.1, dpo_label_smoothing=0.2)
    expected = 0.8 * math.log(1.0 + math.exp(-0.15)) + 0.2 * math.log(1.0 + math.exp(0.15))
    assert loss == pytest.approx(expected, abs=1e-6)


def test_hinge_is_relu_one_minus_beta_z():
    loss, _ = _loss(dpo_beta=0.1, dpo_loss_type="hinge")
    assert loss == pytest.approx(0.85, abs=1e-6)
    big, _ = _loss(dpo_beta=1.0, dpo_loss_type="hinge")  # beta z = 1.5 > 1: no loss
    assert big == 0.0


def test_ipo_reads_length_averaged_log_probs():
    loss, metrics = _loss(dpo_beta=0.1, dpo_loss_type="ipo")
    # Averages: policy -0.5 / -0.75, reference -1.0 / -0.625: z = 0.25 + 0.375 = 0.625.
    assert loss == pytest.approx((0.625 - 5.0) ** 2, abs=1e-5)
    assert metrics["rewards/chosen"] == pytest.approx(0.1 * 0.5)
    assert metrics["rewards/rejected"] == pytest.approx(0.1 * -0.125)


def test_pref_ftx_adds_chosen_mean_nll():
    base, _ = _loss(dpo_beta=0.1)
    with_sft, metrics = _loss(dpo_beta=0.1, pref_ftx=0.5)
    assert with_sft == pytest.approx(base + 0.5 * (1.0 / 2), abs=1e-6)
    assert metrics["sft_loss"] == pytest.approx(0.5)


def test_normalizer_makes_split_batches_add_up():
    cfg = DPOLossConfig(dpo_beta=0.5)
    torch.manual_seed(0)
    pc, pr = torch.randn(4, 5), torch.randn(4, 5)
    mask = torch.ones(4, 5)
    rc, rr = torch.randn(4), torch.randn(4)
    whole = dpo_loss(cfg, pc, pr, rc, rr, mask, mask).loss
    halves = sum(
        dpo_loss(cfg, pc[i], pr[i], rc[i], rr[i], mask[i], mask[i], normalizer=4).loss
        for i in (slice(0, 2), slice(2, 4))
    )
    assert float(halves) == pytest.approx(float(whole), abs=1e-6)


def test_gradient_raises_chosen_and_lowers_rejected():
    cfg = DPOLossConfig(dpo_beta=0.1)
    chosen = torch.tensor([-1.0], requires_grad=True)
    rejected = torch.tensor([-3.0], requires_grad=True)
    losses, _, _ = pair_losses(cfg, chosen, rejected, REF_CHOSEN, REF_REJECTED)
    losses.sum().backward()
    assert chosen.grad is not None and rejected.grad is not None
    assert float(chosen.grad) < 0 < float(rejected.grad)


@pytest.mark.parametrize("knobs", [{"dpo_loss_type": "kto_pair"}, {"dpo_beta": 0.0}])
def test_bad_knobs_are_refused(knobs):
    with pytest.raises(ValueError):
        DPOLossConfig(**knobs)


def test_smoothing_outside_sigmoid_is_refused():
    with pytest.raises(ValueError, match="sigmoid only"):
        DPOLossConfig(dpo_loss_type="ipo", dpo_label_smoothing=0.1)


@pytest.mark.parametrize("loss_type", DPO_LOSS_TYPES)
def test_every_named_loss_is_implemented(loss_type):
    loss, _ = _loss(dpo_loss_type=loss_type)
    assert math.isfinite(loss)
