"""End to end with the tiny DeepSeek-V3 at expert parallel 2: `cli/train_grpo.py --config-name
grpo_tiny_deepseek_cpu` (multi-latent attention, a shared expert, sigmoid routing with an expert
bias over groups of experts, a dense first layer; two actor ranks over gloo, 4 of the 8 experts
each) learns grpo_tiny_cpu's toy task with the rollout engine `rollout_backend: auto` picks,
keeps the engine's log-probs of its sampled tokens equal to the training model's after every
weight sync, logs the experts' load, the router's losses and the expert-bias updates every
step, and exports a DeepSeek-V3 HF folder."""

from __future__ import annotations

import json

from tests.e2e._run import read_metrics, run_train

STEPS = 40


def test_tiny_deepseek_v3_grpo_at_ep2_learns_and_logs_moe_health(tmp_path):
    out = tmp_path / "deepseek"
    proc = run_train(out, config="grpo_tiny_deepseek_cpu")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "model family deepseek_v3" in proc.stdout + proc.stderr
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    scores = [m["grpo/score"] for m in metrics]
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    print(f"grpo/score {first:.3f} (steps 1-5) -> {last:.3f} (steps {STEPS - 4}-{STEPS})")
    assert last >= first + 0.3, (first, last)
    drift = max(m["rollout/logprob_abs_diff_max"] for m in metrics)
    print(f"rollout/logprob_abs_diff_max over the run: {drift:.2e}")
    assert drift < 1e-4
    for m in metrics:  # layer 0 is dense; layers 1 and 2 route over 8 experts, top-4
        assert "moe/layer_0/load_imbalance" not in m
        assert 1.0 <= m["moe/layer_1/load_imbalance"] <= 2.0
        assert 1.0 <= m["moe/load_imbalance_max"] <= 2.0
        assert 0 < m["moe/expert_bias_update"] <= 1e-3 + 1e-9
        assert m["moe/seq_aux_loss"] > 0
    ranges = [m["moe/expert_bias_range"] for m in metrics]
    print(f"moe/expert_bias_range {ranges[0]:.4f} (step 1) -> {ranges[-1]:.4f} (step {STEPS})")
    exported = json.loads((out / "ckpt" / "hf_final" / "config.json").read_text())
    assert (exported["model_type"], exported["n_routed_experts"]) == ("deepseek_v3", 8)
    assert (exported["kv_lora_rank"], exported["head_dim"]) == (512, 64)
