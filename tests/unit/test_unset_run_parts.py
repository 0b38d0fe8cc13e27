"""A run part the driver needs but the config left unset is an error naming the key to set, at
the point it is first needed, never a None handed on: a config loaded with `check_paths=False`
(a dry run, tools) may leave the data and tokenizer paths unset; a role the plan names must have
a worker class; the reward-model worker needs `reward_config` and its `load`."""

from __future__ import annotations

import pytest

from mindrl.config import load_run_config
from mindrl.config.errors import ConfigError
from mindrl.trainer.roles import role_worker
from mindrl.trainer.setup import load_prompts
from mindrl.workers.reward import RewardWorker


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("megatron_training.data_path=null", "megatron_training.data_path: required"),
        ("actor_config.tokenizer_name_or_path=null", "tokenizer_name_or_path: required"),
    ],
)
def test_prompts_name_the_unset_path(override, message):
    run, _ = load_run_config("grpo_tiny_cpu", [override], check_paths=False)
    with pytest.raises(ConfigError, match=message):
        load_prompts(run)


def test_an_unknown_role_names_the_known_ones():
    run, _ = load_run_config("grpo_tiny_cpu", [], check_paths=False)
    with pytest.raises(ValueError, match=r"'critc'.*actor, ref, rollout, reward, critic"):
        role_worker("critc", run)
    worker_class, args = role_worker("actor", run)
    assert worker_class.__name__ == "ActorWorker"
    assert args == (run, run.hybrid_rollout)


def test_the_reward_worker_needs_a_reward_model():
    run, _ = load_run_config("grpo_tiny_cpu", [], check_paths=False)
    assert run.reward is None  # rule rewards only
    with pytest.raises(ConfigError, match="reward_config: required"):
        RewardWorker(run)
    run, _ = load_run_config("grpo_qwen25_7b", ["reward_config.load=null"], check_paths=False)
    with pytest.raises(ConfigError, match="reward_config.load: required"):
        RewardWorker(run)
