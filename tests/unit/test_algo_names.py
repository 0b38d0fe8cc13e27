"""Every variant name a config can select is implemented: dispatch on it works.

The names live once, in `mindrl.algorithms.names`; config validation reads them without
torch, the implementations dispatch on them.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mindrl.algorithms import names
from mindrl.algorithms.advantages import compute_advantages
from mindrl.algorithms.aggregation import aggregate_loss
from mindrl.algorithms.kl import (
    AdaptiveKLController,
    KLControlConfig,
    kl_penalty,
    make_kl_controller,
)
from mindrl.algorithms.loss import GRPOLossConfig

MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.float32)


def test_names_and_config_validation_import_no_torch():
    code = (
        "import sys, mindrl.algorithms.names, mindrl.config.validate; print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "name", [n for n in names.ADV_ESTIMATOR_NAMES if n not in names.CRITIC_ESTIMATORS]
)
def test_every_advantage_estimator_dispatches(name):
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.25])
    adv = compute_advantages(name, rewards, group_size=2, response_mask=MASK)
    assert adv.shape == MASK.shape and torch.isfinite(adv).all()
    assert (adv[MASK == 0] == 0).all()
    assert adv.abs().sum() > 0


def test_aliases_name_an_implemented_estimator():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.25])
    for alias, target in names.ADV_ALIASES.items():
        assert target in names.ADV_ESTIMATORS
        same = compute_advantages(target, rewards, 2, MASK)
        assert torch.equal(compute_advantages(alias, rewards, 2, MASK), same)


@pytest.mark.parametrize("kl_type", names.KL_TYPES)
def test_every_kl_type_dispatches(kl_type):
    log_prob = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    ref = torch.tensor([[-1.5, -1.0], [-0.5, -2.0]])
    kl = kl_penalty(log_prob, ref, kl_type)
    assert kl.shape == log_prob.shape and torch.isfinite(kl).all()
    canonical = names.KL_ALIASES.get(kl_type)
    if canonical is not None:
        assert torch.equal(kl, kl_penalty(log_prob, ref, canonical))


@pytest.mark.parametrize("mode", names.LOSS_AGG_MODES)
def test_every_loss_agg_mode_dispatches(mode):
    loss = torch.arange(12, dtype=torch.float32).view(4, 3)
    value = aggregate_loss(loss, MASK, mode)
    assert value.dim() == 0 and torch.isfinite(value)
    assert GRPOLossConfig(loss_agg_mode=mode).loss_agg_mode == mode


@pytest.mark.parametrize("kl_type", names.KL_TYPES)
def test_every_kl_type_is_a_valid_kl_loss(kl_type):
    assert GRPOLossConfig(kl_penalty=kl_type).kl_penalty == kl_type


@pytest.mark.parametrize("ctrl_type", names.KL_CTRL_TYPES)
def test_every_kl_controller_type_dispatches(ctrl_type):
    controller = make_kl_controller(KLControlConfig(type=ctrl_type, kl_coef=0.1))
    controller.update(current_kl=0.2, n_steps=4)
    assert isinstance(controller, AdaptiveKLController) == (ctrl_type == "adaptive")


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown adv_estimator"):
        compute_advantages("ppo", torch.zeros(4), 2, MASK)
    with pytest.raises(ValueError, match="unknown kl type"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
    with pytest.raises(ValueError, match="unknown loss_agg_mode"):
        aggregate_loss(torch.zeros(4, 3), MASK, "seq-sum")
    with pytest.raises(ValueError, match="kl_ctrl.type"):
        KLControlConfig(type="pid")
