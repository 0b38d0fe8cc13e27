"""A verifier that hangs on every call costs one step budget, not one timeout per sample.

Bounds are derived from the configured values only. A step's clock starts when `score` is
called, on a pool whose workers are already up (the trainer builds it before step 1), and
replacement workers start inside the step's budget. After the budget ends the pool only
kills the hung workers (SIGKILL + reap) and marks the queue skipped, so the allowance on
top of the budget is a fraction of the timeout: KILL_ALLOWANCE x verifier_timeout.
"""

from __future__ import annotations

import pytest
from _verifier_support import assert_gone, bounded, reward_config

from mindrl.rewards.scorer import RewardScorer
from mindrl.rewards.types import RewardParams

pytestmark = pytest.mark.multiproc

TIMEOUT_S = 1.0
SAMPLES = 64
KILL_ALLOWANCE = 0.5  # x verifier_timeout: SIGKILL + reap of the hung workers, no start-up
HARD_LIMIT_S = 60.0  # the test fails instead of hanging; far above every asserted bound


def _scorer(verifier_file, functions, **overrides) -> RewardScorer:
    config = reward_config(verifier_file, functions, verifier_timeout=TIMEOUT_S, **overrides)
    return RewardScorer.from_config(config, RewardParams())


@pytest.mark.parametrize("parallel", [1, 2])
def test_always_hanging_verifier_step_ends_within_the_budget(verifier_file, parallel):
    # Fewer workers than verifier_max_consecutive_failures (3): the breaker cannot open in
    # the first wave, so the step budget (default 2 x timeout) is what ends the step.
    with _scorer(verifier_file, ["rel_hang"], verifier_parallel=parallel) as scorer:
        assert scorer.num_workers == parallel
        budget_s = 2 * TIMEOUT_S
        before = scorer.worker_pids()
        result, wall = bounded(lambda: scorer.score(["x"] * SAMPLES, ["1"] * SAMPLES), HARD_LIMIT_S)
        print(f"parallel={parallel}: {SAMPLES}-sample step with a hanging verifier: {wall:.2f} s")
        assert wall < budget_s + KILL_ALLOWANCE * TIMEOUT_S
        m = result.metrics
        assert result.scores == [0.0] * SAMPLES
        # every call either ran into its timeout / the budget, or was never started
        assert m["reward/timeouts"] + m["reward/skipped"] == SAMPLES
        assert 1 <= m["reward/timeouts"] <= 2 * parallel  # at most two waves ran
        assert m["reward/budget_exhausted"] == 1.0
        assert m["reward/errors"] == m["reward/invalid"] == 0
        assert m["reward/worker_restarts"] == m["reward/timeouts"]
        assert_gone(before)  # hung workers were killed, not leaked
        assert len(scorer.worker_pids()) == parallel


def test_breaker_stops_a_hanging_verifier_after_one_timeout(verifier_file):
    # As many workers as verifier_max_consecutive_failures: the first wave of timeouts opens
    # the circuit, so the step costs one timeout, not the budget.
    with _scorer(
        verifier_file, ["rel_hang"], verifier_parallel=3, verifier_max_consecutive_failures=3
    ) as scorer:
        result, wall = bounded(lambda: scorer.score(["x"] * SAMPLES, ["1"] * SAMPLES), HARD_LIMIT_S)
        print(f"parallel=3 breaker: {SAMPLES}-sample step with a hanging verifier: {wall:.2f} s")
        assert wall < TIMEOUT_S + KILL_ALLOWANCE * TIMEOUT_S
        m = result.metrics
        assert m["reward/rel_hang_circuit_open"] == 1.0
        assert m["reward/timeouts"] == 3 and m["reward/skipped"] == SAMPLES - 3
        assert m["reward/budget_exhausted"] == 0.0


def test_every_step_is_bounded_and_the_breaker_resets(verifier_file):
    # The breaker is per step: a verifier that recovers is called again the next step.
    with _scorer(verifier_file, ["rel_hang_marked"], verifier_parallel=2) as scorer:
        for _ in range(2):
            result, wall = bounded(
                lambda: scorer.score(["HANG"] * SAMPLES, ["1"] * SAMPLES), HARD_LIMIT_S
            )
            assert wall < 2 * TIMEOUT_S + KILL_ALLOWANCE * TIMEOUT_S
            assert result.scores == [0.0] * SAMPLES
        result, _ = bounded(lambda: scorer.score(["ok"] * SAMPLES, ["1"] * SAMPLES), HARD_LIMIT_S)
        assert result.scores == [1.0] * SAMPLES
        assert result.metrics["reward/skipped"] == 0
        assert result.metrics["reward/rel_hang_marked_circuit_open"] == 0.0


def test_healthy_verifier_beside_a_hanging_one_scores_normally(verifier_file):
    responses = [rf"\boxed{{{i % 7}}}" for i in range(SAMPLES)]
    labels = [str(i % 5) for i in range(SAMPLES)]
    expected_acc = [1.0 if i % 7 == i % 5 else 0.0 for i in range(SAMPLES)]
    with _scorer(verifier_file, ["lenient_acc", "rel_hang"], verifier_parallel=2) as scorer:
        result, wall = bounded(lambda: scorer.score(responses, labels), HARD_LIMIT_S)
    print(f"acc + hanging verifier, {SAMPLES} samples: {wall:.2f} s")
    m = result.metrics
    assert result.per_function["lenient_acc"] == expected_acc  # every acc call ran, none skipped
    assert result.scores == expected_acc  # rel_hang contributes 0 everywhere
    assert m["lenient_acc_rewards/mean"] == pytest.approx(sum(expected_acc) / SAMPLES)
    assert m["reward/lenient_acc_circuit_open"] == 0.0
    assert m["reward/timeouts"] + m["reward/skipped"] == SAMPLES  # all rel_hang calls
    # acc's own calls take milliseconds; the hanging one is cut at the budget
    assert wall < 2 * TIMEOUT_S + KILL_ALLOWANCE * TIMEOUT_S


def test_a_verifier_hanging_on_some_samples_keeps_the_others(verifier_file):
    # One hang among healthy calls: parallel workers score the rest while it hangs.
    responses = ["ok"] * SAMPLES
    responses[5] = "HANG"
    with _scorer(verifier_file, ["rel_hang_marked"], verifier_parallel=2) as scorer:
        result, wall = bounded(lambda: scorer.score(responses, ["1"] * SAMPLES), HARD_LIMIT_S)
    assert result.scores == [0.0 if i == 5 else 1.0 for i in range(SAMPLES)]
    assert result.metrics["reward/timeouts"] == 1 and result.metrics["reward/skipped"] == 0
    assert wall < TIMEOUT_S + KILL_ALLOWANCE * TIMEOUT_S
