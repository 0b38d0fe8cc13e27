"""Non-finite and out-of-range verifier values are invalid: counted, scored 0."""

from __future__ import annotations

import math

import pytest
from _verifier_support import bounded, reward_config

from mindrl.rewards.scorer import RewardScorer
from mindrl.rewards.types import RewardParams
from mindrl.rewards.worker import INVALID, OK, check_value

pytestmark = pytest.mark.multiproc

HARD_LIMIT_S = 60.0
BAD = ["1e30", "-1e30", "nan", "inf", "-inf", "10000.5", "-10000.5"]
GOOD = ["10000", "-10000", "0.25", "0"]


def _scorer(verifier_file, **overrides) -> RewardScorer:
    config = reward_config(verifier_file, ["rel_value", "format"], verifier_parallel=2, **overrides)
    return RewardScorer.from_config(config, RewardParams())


def test_default_bound_rejects_huge_and_non_finite_values(verifier_file):
    with _scorer(verifier_file) as scorer:  # verifier_reward_bound: 1e4 (the default)
        result, _ = bounded(lambda: scorer.score(BAD + GOOD, [""] * 11), HARD_LIMIT_S)
    expected = [0.0] * len(BAD) + [float(v) for v in GOOD]
    assert result.per_function["rel_value"] == expected
    assert result.scores == expected  # `format` scores 0 on these, and runs normally
    m = result.metrics
    assert m["reward/invalid"] == len(BAD)
    assert m["reward/errors"] == m["reward/timeouts"] == m["reward/skipped"] == 0
    assert m["reward/rel_value_circuit_open"] == 0.0  # invalid values cost nothing
    assert all(math.isfinite(v) for v in m.values())


def test_configured_bound(verifier_file):
    with _scorer(verifier_file, verifier_reward_bound=1.0) as scorer:
        result, _ = bounded(lambda: scorer.score(["1", "-1", "1.5", "-2"], [""] * 4), HARD_LIMIT_S)
    assert result.per_function["rel_value"] == [1.0, -1.0, 0.0, 0.0]
    assert result.metrics["reward/invalid"] == 2


def test_check_value_names_the_bound():
    assert check_value(1e30, 1e4) == (INVALID, 0.0, "returned 1e+30, beyond the reward bound 10000")
    assert check_value(1e4, 1e4) == (OK, 1e4, "")
    assert check_value(float("nan"))[0] == INVALID
