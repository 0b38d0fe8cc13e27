"""A memory-hungry verifier hits the worker's cap (RLIMIT_DATA), fails with MemoryError,
is counted, and its worker is replaced; it never grows past the cap on the host."""

from __future__ import annotations

import logging
import time

import psutil
import pytest
from _verifier_support import assert_gone, bounded, reward_config

from mindrl.config.rl import MIN_VERIFIER_MEMORY_MB
from mindrl.rewards.scorer import RewardScorer
from mindrl.rewards.types import RewardParams

pytestmark = pytest.mark.multiproc

CAP_MB = MIN_VERIFIER_MEMORY_MB  # the smallest cap a config may set
TIMEOUT_S = 10.0  # filling ~200 MB takes ~0.1 s idle, seconds on a loaded 2-core box
SAMPLES = 16
PARALLEL = 2
KILL_ALLOWANCE = 0.5  # x verifier_timeout, as in test_verifier_hang
HARD_LIMIT_S = 60.0
STARTUP_WAIT_S = 30.0  # a replacement worker loading, on a busy machine


def _scorer(verifier_file, memory_mb: int) -> RewardScorer:
    config = reward_config(
        verifier_file,
        ["rel_memory"],
        verifier_timeout=TIMEOUT_S,
        verifier_parallel=PARALLEL,
        verifier_memory_mb=memory_mb,
    )
    return RewardScorer.from_config(config, RewardParams())


def test_workers_run_under_the_configured_cap(verifier_file):
    with _scorer(verifier_file, CAP_MB) as scorer:
        for pid in scorer.worker_pids():
            assert psutil.Process(pid).rlimit(psutil.RLIMIT_DATA) == (CAP_MB << 20, CAP_MB << 20)
        # a verifier using memory well inside the cap is unaffected
        result, _ = bounded(lambda: scorer.score(["x"] * 4, [str(CAP_MB // 4)] * 4), HARD_LIMIT_S)
        assert result.scores == [1.0] * 4 and result.metrics["reward/errors"] == 0


def test_memory_hungry_verifier_fails_and_is_counted(verifier_file, caplog):
    # Each call asks for 4 x the cap (it stops there if nothing stops it, and returns 1.0).
    labels = [str(4 * CAP_MB)] * SAMPLES
    with _scorer(verifier_file, CAP_MB) as scorer:
        before = scorer.worker_pids()
        with caplog.at_level(logging.WARNING, logger="mindrl.rewards.scorer"):
            result, wall = bounded(lambda: scorer.score(["x"] * SAMPLES, labels), HARD_LIMIT_S)
        print(f"memory-hungry verifier, {SAMPLES} samples: {wall:.2f} s")
        m = result.metrics
        assert result.scores == [0.0] * SAMPLES  # no call got its 4 x cap
        assert m["reward/errors"] >= 3  # verifier_max_consecutive_failures (default 3)
        assert m["reward/rel_memory_circuit_open"] == 1.0
        assert m["reward/errors"] + m["reward/timeouts"] + m["reward/skipped"] == SAMPLES
        assert m["reward/worker_restarts"] == m["reward/errors"] + m["reward/timeouts"]
        assert "MemoryError" in caplog.text
        assert wall < 2 * TIMEOUT_S + KILL_ALLOWANCE * TIMEOUT_S
        assert_gone(before)  # a worker that hit MemoryError is replaced, not reused
        # the replacements score normally, under the same cap
        result, _ = bounded(lambda: scorer.score(["x"] * 4, ["32"] * 4), HARD_LIMIT_S)
        assert result.scores == [1.0] * 4
        deadline = time.monotonic() + STARTUP_WAIT_S
        while time.monotonic() < deadline and not all(
            psutil.Process(pid).rlimit(psutil.RLIMIT_DATA)[0] == CAP_MB << 20
            for pid in scorer.worker_pids()
        ):
            time.sleep(0.05)  # a replacement sets its cap once loaded
        for pid in scorer.worker_pids():
            assert psutil.Process(pid).rlimit(psutil.RLIMIT_DATA)[0] == CAP_MB << 20


def test_no_cap_when_zero(verifier_file):
    with _scorer(verifier_file, 0) as scorer:
        for pid in scorer.worker_pids():
            soft, _ = psutil.Process(pid).rlimit(psutil.RLIMIT_DATA)
            assert soft == psutil.Process().rlimit(psutil.RLIMIT_DATA)[0]


def test_cap_below_a_loaded_worker_fails_at_start_naming_the_key(verifier_file):
    with pytest.raises(RuntimeError, match="verifier_memory_mb=8 is not above"):
        bounded(lambda: _scorer(verifier_file, 8), HARD_LIMIT_S)
