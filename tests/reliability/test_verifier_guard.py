"""The per-step guard's rules, the config keys that drive them, and the pool's sizing."""

from __future__ import annotations

import math
import os

import pytest

from mindrl.config import ConfigError, load_run_config
from mindrl.config.rl import RewardConfig
from mindrl.rewards.guard import BUDGET_EXHAUSTED, CIRCUIT_OPEN, StepGuard
from mindrl.rewards.pool import default_num_workers
from mindrl.rewards.scorer import RewardScorer
from mindrl.rewards.types import RewardParams
from mindrl.rewards.worker import WorkerLimits

BASE = "r1_zero_qwen25_7b"


def test_breaker_opens_after_consecutive_costly_failures_only():
    guard = StepGuard(max_consecutive_failures=3, budget_s=10.0, start=0.0)
    for costly in (True, True, False, True, True):  # a success ends the streak
        guard.record("v", costly)
    assert guard.blocked("v", now=1.0) is None
    guard.record("v", True)
    assert guard.blocked("v", now=1.0) == CIRCUIT_OPEN
    assert guard.call_deadline("v", 5.0) == -math.inf  # its running calls stop now
    assert guard.blocked("w", now=1.0) is None  # per verifier


def test_breaker_disabled_with_zero():
    guard = StepGuard(max_consecutive_failures=0, budget_s=10.0, start=0.0)
    for _ in range(100):
        guard.record("v", True)
    assert guard.blocked("v", now=1.0) is None


def test_budget_applies_only_to_verifiers_that_failed_costly():
    guard = StepGuard(max_consecutive_failures=3, budget_s=10.0, start=100.0)
    guard.record("slow_but_healthy", False)
    guard.record("broken", True)
    assert guard.blocked("broken", now=109.0) is None
    assert guard.blocked("broken", now=110.0) == BUDGET_EXHAUSTED
    assert guard.blocked("slow_but_healthy", now=500.0) is None
    assert guard.call_deadline("broken", 115.0) == 110.0
    assert guard.call_deadline("slow_but_healthy", 115.0) == 115.0
    assert guard.next_wakeup(105.0) == 110.0 and guard.next_wakeup(111.0) == math.inf


def test_default_pool_size_follows_the_machine():
    cpus = len(os.sched_getaffinity(0))
    assert default_num_workers() == max(2, min(cpus, 16))


def test_config_defaults_match_the_worker_defaults():
    config = RewardConfig()
    assert config.verifier_memory_mb == WorkerLimits().memory_mb
    assert config.verifier_reward_bound == WorkerLimits().reward_bound
    assert config.verifier_parallel == 0  # sized to the machine
    assert config.verifier_step_budget_s is None  # 2 x verifier_timeout
    assert config.verifier_max_consecutive_failures == 3


def test_new_keys_load_from_overrides():
    run, _ = load_run_config(
        BASE,
        [
            "rl_config.verifier_parallel=null",
            "rl_config.verifier_step_budget_s=300",
            "rl_config.verifier_max_consecutive_failures=0",
            "rl_config.verifier_memory_mb=0",
            "rl_config.verifier_reward_bound=1e6",
        ],
        check_paths=False,
    )
    rw = run.rl.reward
    assert rw.verifier_parallel is None and rw.verifier_step_budget_s == 300.0
    assert rw.verifier_max_consecutive_failures == 0 and rw.verifier_memory_mb == 0
    assert rw.verifier_reward_bound == 1e6


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("rl_config.verifier_parallel=-1", "rl_config.verifier_parallel"),
        ("rl_config.verifier_step_budget_s=0", "rl_config.verifier_step_budget_s"),
        ("rl_config.verifier_step_budget_s=60", "below verifier_timeout"),  # timeout is 120
        ("rl_config.verifier_max_consecutive_failures=-1", "verifier_max_consecutive_failures"),
        ("rl_config.verifier_memory_mb=-1", "rl_config.verifier_memory_mb"),
        ("rl_config.verifier_memory_mb=100", "verifier_memory_mb: 100 is below 256"),
        ("rl_config.verifier_reward_bound=0", "rl_config.verifier_reward_bound"),
    ],
)
def test_invalid_values_are_rejected_naming_the_key(override, expected):
    with pytest.raises(ConfigError, match=expected):
        load_run_config(BASE, [override], check_paths=False)


@pytest.mark.multiproc
@pytest.mark.parametrize(("parallel", "expected"), [(0, None), (None, None), (1, 1)])
def test_verifier_parallel_zero_sizes_the_pool_and_explicit_values_are_kept(parallel, expected):
    config = RewardConfig(verifier_function=("acc",), verifier_parallel=parallel)
    with RewardScorer.from_config(config, RewardParams()) as scorer:
        assert scorer.num_workers == (expected or default_num_workers())
        assert len(scorer.worker_pids()) == scorer.num_workers
