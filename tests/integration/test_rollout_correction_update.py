"""The rollout correction in a real update (ActorWorker on megatron-core, its sampled batch):
the weight statistics and the masked fraction reach the update's metrics, reduced over
micro- and mini-batches to the whole batch's minimum and maximum."""

from __future__ import annotations

from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("_actor_rollout_correction.py")
P = "actor/rollout_is"


def test_sequence_mask_metrics_reach_the_update_metrics(fresh_process, tiny_model_dir):
    overrides = [
        "+rl_config.use_tis=true",
        "+rl_config.rollout_is_level=sequence",
        "+rl_config.rollout_is_mode=mask",
        "+rl_config.rollout_is_threshold=1.5",
    ]
    out = fresh_process(SCRIPT, {"overrides": overrides}, timeout_s=300.0)
    m, weights = out["metrics"], out["seq_weights"]
    # grpo_tiny_cpu: several micro-batches in two mini-batches; min / max are the batch's
    assert m[f"{P}_min"] == pytest.approx(min(weights), rel=1e-4)
    assert m[f"{P}_max"] == pytest.approx(max(weights), rel=1e-4)
    assert m[f"{P}_min"] <= m[f"{P}_mean"] <= m[f"{P}_max"] and m[f"{P}_std"] > 0
    dropped = sum(not 1 / 1.5 <= w <= 1.5 for w in weights) / len(weights)
    assert 0 < dropped < 1  # the shift put some sequences out of range, not all
    assert m[f"{P}_seq_masked_fraction"] == pytest.approx(dropped, abs=1e-6)  # equal micro-batches
    assert 0 < m[f"{P}_masked_fraction"] < 1
    assert f"{P}_clipfrac" not in m
