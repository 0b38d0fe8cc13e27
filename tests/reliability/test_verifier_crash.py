"""Verifiers that kill their worker cost a few restarts per step, not one per sample; ones
that raise are counted and cost nothing else.

Bounds come from the configuration: a verifier that loses its worker is "broken" for the
step, so the step budget (2 x verifier_timeout) caps it even if restarts were slow; the
circuit breaker usually ends it much sooner (after verifier_max_consecutive_failures).
"""

from __future__ import annotations

import pytest
from _verifier_support import assert_gone, bounded, reward_config

from mindrl.rewards.scorer import RewardScorer
from mindrl.rewards.types import RewardParams

pytestmark = pytest.mark.multiproc

TIMEOUT_S = 2.0
SAMPLES = 64
PARALLEL = 2
MAX_FAILURES = 3
KILL_ALLOWANCE = 0.5  # x verifier_timeout, as in test_verifier_hang
HARD_LIMIT_S = 60.0


def _scorer(verifier_file, functions) -> RewardScorer:
    config = reward_config(
        verifier_file,
        functions,
        verifier_timeout=TIMEOUT_S,
        verifier_parallel=PARALLEL,
        verifier_max_consecutive_failures=MAX_FAILURES,
    )
    return RewardScorer.from_config(config, RewardParams())


@pytest.mark.parametrize("verifier", ["rel_exit", "rel_segv"])
def test_worker_killing_verifier_opens_its_circuit(verifier_file, verifier):
    with _scorer(verifier_file, [verifier]) as scorer:
        before = scorer.worker_pids()
        result, wall = bounded(lambda: scorer.score(["x"] * SAMPLES, ["1"] * SAMPLES), HARD_LIMIT_S)
        print(f"{verifier}: {SAMPLES}-sample step: {wall:.2f} s")
        m = result.metrics
        assert result.scores == [0.0] * SAMPLES
        assert m[f"reward/{verifier}_circuit_open"] == 1.0
        # it ran until MAX_FAILURES crashes in a row; calls still running then were cut
        assert MAX_FAILURES <= m["reward/errors"] <= MAX_FAILURES + PARALLEL - 1
        assert m["reward/errors"] + m["reward/timeouts"] + m["reward/skipped"] == SAMPLES
        assert m["reward/skipped"] >= SAMPLES - MAX_FAILURES - PARALLEL
        assert m["reward/worker_restarts"] == m["reward/errors"] + m["reward/timeouts"]
        assert wall < 2 * TIMEOUT_S + KILL_ALLOWANCE * TIMEOUT_S
        assert_gone(before)
        assert len(scorer.worker_pids()) == PARALLEL


def test_raising_verifier_is_counted_without_restarts_or_skips(verifier_file):
    # An exception costs no time and no worker: every call runs (a verifier that raises on
    # some inputs still scores the others), each counted as an error.
    with _scorer(verifier_file, ["rel_raise"]) as scorer:
        pids = scorer.worker_pids()
        result, _ = bounded(lambda: scorer.score(["x"] * SAMPLES, ["1"] * SAMPLES), HARD_LIMIT_S)
        m = result.metrics
        assert result.scores == [0.0] * SAMPLES
        assert m["reward/errors"] == SAMPLES
        assert m["reward/skipped"] == m["reward/timeouts"] == m["reward/worker_restarts"] == 0
        assert m["reward/rel_raise_circuit_open"] == 0.0
        assert scorer.worker_pids() == pids


def test_healthy_verifier_beside_a_crashing_one_scores_normally(verifier_file):
    responses = [rf"\boxed{{{i % 3}}}" for i in range(SAMPLES)]
    labels = ["1"] * SAMPLES
    expected = [1.0 if i % 3 == 1 else 0.0 for i in range(SAMPLES)]
    with _scorer(verifier_file, ["lenient_acc", "rel_exit"]) as scorer:
        result, wall = bounded(lambda: scorer.score(responses, labels), HARD_LIMIT_S)
    assert result.per_function["lenient_acc"] == expected
    assert result.scores == expected
    assert result.metrics["reward/lenient_acc_circuit_open"] == 0.0
    assert result.metrics["reward/rel_exit_circuit_open"] == 1.0
    assert wall < 2 * TIMEOUT_S + KILL_ALLOWANCE * TIMEOUT_S
