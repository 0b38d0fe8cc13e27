"""Rule-reward scoring of a batch: `rl_config.verifier_function` x `verifier_weight`.

The final reward of sample i is sum_k weight_k * score_k(i), as in MindSpeed-RL. Every
verifier call runs in a worker process (`VerifierPool`, calls in parallel) under `timeout_s`
and a memory cap; a call that hangs, raises, kills its process, runs out of memory or
returns a non-number, non-finite or out-of-bound value scores 0 and is counted in
`reward/timeouts`, `reward/errors` or `reward/invalid`, and training goes on. A verifier
that keeps hanging or crashing is stopped for the rest of the step (circuit breaker, step
budget): its remaining calls score 0 and are counted in `reward/skipped`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from mindrl.rewards import registry
from mindrl.rewards.pool import (
    ERROR,
    INVALID,
    OK,
    SKIPPED,
    TIMEOUT,
    Call,
    Outcome,
    StartMethod,
    VerifierPool,
    default_num_workers,
)
from mindrl.rewards.types import RewardParams, SampleMeta
from mindrl.rewards.worker import WorkerLimits

if TYPE_CHECKING:
    from mindrl.config.rl import RewardConfig

logger = logging.getLogger(__name__)


class ScoreResult(NamedTuple):
    scores: list[float]  # weighted sum per sample
    per_function: dict[str, list[float]]  # unweighted, 0.0 where the call failed
    metrics: dict[str, float]


class RewardScorer:
    """Scores batches with named verifiers in a process pool; close() or use `with`.

    functions / weights: `rl_config.verifier_function` / `verifier_weight` (weights default
    to 1.0 each). verifier_files: custom verifier files to load (files loaded earlier
    through `registry.load_verifier_file` are passed to the workers as well). num_workers:
    0 or None sizes the pool to the machine (`default_num_workers`). step_budget_s,
    max_consecutive_failures, memory_mb, reward_bound: see `VerifierPool` / `WorkerLimits`
    (`rl_config.verifier_step_budget_s` / `verifier_max_consecutive_failures` /
    `verifier_memory_mb` / `verifier_reward_bound`).
    """

    def __init__(
        self,
        functions: Sequence[str],
        weights: Sequence[float] | None = None,
        num_workers: int | None = None,
        timeout_s: float = 10.0,
        params: RewardParams | None = None,
        verifier_files: Sequence[str | Path] = (),
        start_method: StartMethod = "forkserver",
        *,
        step_budget_s: float | None = None,
        max_consecutive_failures: int = 3,
        memory_mb: int = WorkerLimits.memory_mb,
        reward_bound: float = WorkerLimits.reward_bound,
    ):
        functions = list(functions)
        weights = [1.0] * len(functions) if weights is None else [float(w) for w in weights]
        if not functions:
            raise ValueError("at least one verifier function is required")
        if len(set(functions)) != len(functions):
            raise ValueError(f"verifier functions repeat a name: {functions}")
        if len(weights) != len(functions):
            raise ValueError(
                f"{len(functions)} verifier functions but {len(weights)} verifier weights"
            )
        if not all(math.isfinite(w) for w in weights):
            raise ValueError(f"verifier weights must be finite: {weights}")
        params = params if params is not None else RewardParams()
        for path in verifier_files:
            registry.load_verifier_file(path)
        self._fns = {name: registry.get_verifier(name) for name in functions}  # KeyError if unknown
        if "soft_overlong" in functions and params.soft_cache_length is None:
            raise ValueError("verifier 'soft_overlong' needs soft_cache_length")
        self.functions = functions
        self.weights = weights
        self.params = params
        self._lock = threading.Lock()
        self._pool = VerifierPool(
            functions,
            num_workers=num_workers or default_num_workers(),
            timeout_s=timeout_s,
            params=params,
            verifier_files=registry.loaded_verifier_files(),
            start_method=start_method,
            step_budget_s=step_budget_s,
            max_consecutive_failures=max_consecutive_failures,
            limits=WorkerLimits(memory_mb=memory_mb, reward_bound=reward_bound),
        )

    @property
    def num_workers(self) -> int:
        """Worker processes in the pool (the resolved `verifier_parallel`)."""
        return self._pool.num_workers

    def worker_pids(self) -> list[int]:
        return self._pool.pids()

    @classmethod
    def from_config(cls, reward: RewardConfig, params: RewardParams) -> RewardScorer:
        """The scorer `rl_config` asks for (verifier_function / verifier_weight /
        verifier_parallel / verifier_timeout / verifier_files / verifier_step_budget_s /
        verifier_max_consecutive_failures / verifier_memory_mb / verifier_reward_bound)."""
        return cls(
            list(reward.verifier_function),
            list(reward.verifier_weight),
            num_workers=reward.verifier_parallel,
            timeout_s=reward.verifier_timeout,
            params=params,
            verifier_files=list(reward.verifier_files),
            step_budget_s=reward.verifier_step_budget_s,
            max_consecutive_failures=reward.verifier_max_consecutive_failures,
            memory_mb=reward.verifier_memory_mb,
            reward_bound=reward.verifier_reward_bound,
        )

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_metas(self, metas: Sequence[SampleMeta]) -> None:
        """A missing length is the caller's bug, not a verifier failure: say so loudly."""
        for name, fn in self._fns.items():
            for attr in getattr(fn, "required_meta", ()):
                if any(getattr(meta, attr) is None for meta in metas):
                    raise ValueError(f"verifier {name!r} needs SampleMeta.{attr} for every sample")

    def score(
        self,
        responses: Sequence[str],
        labels: Sequence[str],
        metas: Sequence[SampleMeta] | None = None,
    ) -> ScoreResult:
        """Weighted rule reward of each response; see ScoreResult."""
        n = len(responses)
        metas = list(metas) if metas is not None else [SampleMeta() for _ in range(n)]
        if not (len(labels) == n == len(metas)):
            raise ValueError(f"{n} responses, {len(labels)} labels, {len(metas)} metas")
        self._check_metas(metas)
        calls = [
            Call(name, responses[i], str(labels[i]), metas[i])
            for i in range(n)
            for name in self.functions
        ]
        start = time.perf_counter()
        with self._lock:
            run = self._pool.run(calls)
        elapsed = time.perf_counter() - start
        outcomes = run.outcomes

        k = len(self.functions)
        per_function = {
            name: [
                outcomes[i * k + j].value if outcomes[i * k + j].status == OK else 0.0
                for i in range(n)
            ]
            for j, name in enumerate(self.functions)
        }
        scores = [
            sum(w * per_function[name][i] for name, w in zip(self.functions, self.weights))
            for i in range(n)
        ]
        counts = Counter(o.status for o in outcomes)
        metrics: dict[str, float] = {
            f"{name}_rewards/mean": _mean(values) for name, values in per_function.items()
        }
        metrics.update(
            {
                "reward/mean": _mean(scores),
                "reward/timeouts": float(counts[TIMEOUT]),
                "reward/errors": float(counts[ERROR]),
                "reward/invalid": float(counts[INVALID]),
                "reward/skipped": float(counts[SKIPPED]),
                "reward/budget_exhausted": float(run.budget_exhausted),
                "reward/worker_restarts": float(run.restarts),
                "reward/score_time_s": elapsed,
            }
        )
        metrics.update(
            {
                f"reward/{name}_circuit_open": float(name in run.open_circuits)
                for name in self.functions
            }
        )
        self._log_failures(calls, outcomes, run.open_circuits)
        return ScoreResult(scores, per_function, metrics)

    def _log_failures(
        self, calls: Sequence[Call], outcomes: Sequence[Outcome], open_circuits: frozenset[str]
    ) -> None:
        """One warning per step that names what failed, how often, and the first reason."""
        for name in sorted(open_circuits):
            logger.warning(
                "rule reward: verifier %r timed out or crashed %d times in a row; its other "
                "calls in this step were skipped (scored 0)",
                name,
                self._pool.max_consecutive_failures,
            )
        failed = [(calls[i].name, o) for i, o in enumerate(outcomes) if o.status != OK]
        if failed:
            by_kind = Counter(f"{name}:{o.status}" for name, o in failed)
            logger.warning(
                "rule reward: %d of %d verifier calls failed or were skipped and scored 0 "
                "(%s); first: %s",
                len(failed),
                len(calls),
                ", ".join(f"{key} x{count}" for key, count in sorted(by_kind.items())),
                failed[0][1].detail,
            )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
