"""The MoE health metrics' arithmetic on hand-made counts (mindrl/models/moe_metrics.py): the
load imbalance is the busiest expert over the mean, the load minimum the idlest over the mean,
layers without a router are skipped, the expert-bias update is the mean |change|; and megatron's
`moe_layer_freq` gives the number of MoE layers the router losses are averaged over."""

from __future__ import annotations

import pytest
import torch

from mindrl.models.moe_metrics import (
    expert_bias_metrics,
    expert_load_metrics,
    moe_layer_count,
    moe_prefix,
)


def test_load_of_each_router_layer_and_over_the_layers():
    counts = torch.tensor(
        [
            [0.0, 0.0, 0.0, 0.0],  # layer 0: dense, no router
            [10.0, 10.0, 10.0, 10.0],  # even
            [30.0, 10.0, 0.0, 0.0],  # mean 10: the busiest 3x, two idle experts
        ]
    )
    out = expert_load_metrics(counts)
    assert not any(k.startswith("moe/layer_0/") for k in out)
    assert out["moe/layer_1/load_imbalance"] == 1.0 and out["moe/layer_1/load_min"] == 1.0
    assert out["moe/layer_2/load_imbalance"] == 3.0 and out["moe/layer_2/load_min"] == 0.0
    assert out["moe/load_imbalance_max"] == 3.0
    assert out["moe/load_imbalance_mean"] == 2.0
    assert out["moe/load_min"] == 0.0
    assert (out["moe/tokens_per_expert_min"], out["moe/tokens_per_expert_max"]) == (0.0, 30.0)
    assert len(out) == 2 * 2 + 5  # two keys per MoE layer, five summaries


def test_no_routed_tokens_give_no_load_metrics():
    assert expert_load_metrics(torch.zeros(2, 8)) == {}


def test_expert_bias_update_and_range():
    before = torch.tensor([[0.0, 0.1, -0.1, 0.0], [0.2, 0.0, 0.0, 0.0]])
    rate = 1e-3
    step = torch.tensor([[1.0, -1.0, 1.0, 0.0], [-1.0, 1.0, 1.0, -1.0]]) * rate
    out = expert_bias_metrics(before, before + step, prefix="critic/moe/")
    assert out["critic/moe/expert_bias_update"] == pytest.approx(7 / 8 * rate)
    assert out["critic/moe/expert_bias_range"] == pytest.approx(0.2)
    assert expert_bias_metrics(torch.zeros(0, 4), torch.zeros(0, 4)) == {}


def test_moe_layers_and_prefixes():
    assert moe_layer_count(61, [0, 0, 0] + [1] * 58) == 58
    assert moe_layer_count(4, 2) == 2  # layers 0 and 2
    assert moe_layer_count(4, None) == 4
    assert (moe_prefix("actor"), moe_prefix("critic")) == ("moe/", "critic/moe/")
