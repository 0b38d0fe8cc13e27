"""MoE health in the step metrics, on the real ActorWorker (megatron-core's MoE layer, alltoall
dispatch over gloo, megatron's schedule and optimizer) with the tiny DeepSeek-V3 at EP 2 x DP 2,
the router's sequence aux loss and a z-loss on, 2 optimizer steps: each rank's routers counted
top-k experts for every token it fed in each MoE layer and none in the dense layer; the load
metrics are those of the counts summed over both ranks; the expert-bias metrics are those of
megatron's own bias buffers read before and after each step; the router losses are there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mindrl.models.moe_metrics import expert_bias_metrics, expert_load_metrics
from tests.fresh_process import run_json_ranks
from tests.integration.test_scale_features import TIMEOUT_S

SCRIPT = Path(__file__).with_name("_moe_health_rank.py")
MODEL = "tiny_deepseek_v3"
# two ranks' start-up and two updates: past a minute on a loaded CPU (the arithmetic of the
# metrics is checked in the default tier by tests/unit/test_moe_health_metrics.py)
pytestmark = pytest.mark.slow
TOPK = 4
DENSE_LAYERS = 1


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> list[dict[str, Any]]:
    from mindrl.assets.deepseek import tiny_deepseek_dir

    hf_dir = str(tiny_deepseek_dir())
    overrides = [
        f"model={MODEL}",
        *(f"{sec}.model={MODEL}" for sec in ("megatron_training", "actor_config", "ref_config")),
        f"megatron_training.tokenizer_name_or_path={hf_dir}",
        f"ref_config.load={hf_dir}",
        "++actor_config.expert_model_parallel_size=2",
        f"++model.{MODEL}.moe_z_loss_coeff=0.001",
        "rl_config.n_samples_per_prompt=4",  # the synthetic batch's 4 x 4 rows, one mini-batch
        "rl_config.mini_batch_size=4",
        "actor_config.micro_batch_size=4",
    ]
    args = {"hf_dir": hf_dir, "overrides": overrides, "steps": 2}
    results = run_json_ranks(
        SCRIPT, args, world_size=2, timeout_s=TIMEOUT_S, workdir=tmp_path_factory.mktemp("moe")
    )
    assert results[0]["dp_size"] == 2
    return results


def test_each_rank_counts_topk_experts_per_token_in_its_moe_layers(run):
    for rank in run:
        for step in rank["steps"]:
            per_layer = torch.tensor(step["counts"]).sum(dim=1)
            assert per_layer[:DENSE_LAYERS].sum() == 0
            assert per_layer[DENSE_LAYERS:].tolist() == [TOPK * step["tokens"]] * 2


def test_metrics_are_the_reduced_counts_and_the_bias_buffers(run):
    for i, step in enumerate(run[0]["steps"]):
        metrics = step["metrics"]
        assert metrics == run[1]["steps"][i]["metrics"]  # reduced over the role
        print({k: round(v, 6) for k, v in metrics.items() if k.startswith("moe/")})
        counts = sum(torch.tensor(r["steps"][i]["counts"], dtype=torch.float64) for r in run)
        assert isinstance(counts, torch.Tensor)
        for key, value in expert_load_metrics(counts).items():
            assert metrics[key] == pytest.approx(value, rel=1e-12), key
        assert {"moe/layer_1/load_imbalance", "moe/layer_2/load_min"} <= metrics.keys()
        assert "moe/layer_0/load_imbalance" not in metrics  # the dense layer
        assert 1.0 <= metrics["moe/load_imbalance_max"] <= 8 / TOPK
        layers = sorted(step["bias_before"])
        before = torch.tensor([step["bias_before"][k] for k in layers], dtype=torch.float64)
        after = torch.tensor([step["bias_after"][k] for k in layers], dtype=torch.float64)
        assert not torch.equal(before, after)  # megatron's rule moved them
        for key, value in expert_bias_metrics(before, after).items():
            assert metrics[key] == pytest.approx(value, rel=1e-6), key
        assert 0 < metrics["moe/expert_bias_update"] <= 1e-3 + 1e-9  # megatron's default rate
        assert metrics["moe/seq_aux_loss"] > 0 and metrics["moe/z_loss"] > 0
