"""`rule_reward: false`: a reward-model worker group (HF sequence classification) scores the
rollouts instead of the rule verifiers."""

from __future__ import annotations

import pytest

from tests.e2e._run import read_metrics, run_train


@pytest.fixture(scope="module")
def tiny_reward_model(tmp_path_factory, tiny_model_dir):
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path_factory.mktemp("tiny_rm")
    config = AutoConfig.from_pretrained(tiny_model_dir, num_labels=1)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def test_reward_model_scores_the_rollouts(tmp_path, tiny_reward_model):
    out = tmp_path / "rm"
    proc = run_train(
        out,
        "actor_config.train_iters=2",
        "rl_config.rule_reward=false",
        f"reward_config.load={tiny_reward_model}",
        "reward_config.micro_batch_size=16",
        "rl_config.reward_resource.num_npus=1",
        "runtime.ray_num_cpus=2",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "group reward: 1 device(s)" in proc.stdout
    metrics = read_metrics(out)
    assert len(metrics) == 2
    for m in metrics:
        assert m["grpo/score"] == pytest.approx(m["reward_model/mean"], abs=1e-6)
        assert m["grpo/score"] != 0.0  # a random linear head gives non-zero scores
