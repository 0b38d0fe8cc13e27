"""The stop rule for non-finite training: skip streaks counted per role, the run stopped at
the limit with an error naming the step, checkpoints deferred while a streak runs, and the
skip counts on the console line."""

from __future__ import annotations

import pytest

from mindrl.config.rl import LoopConfig
from mindrl.trainer.metrics import console_line
from mindrl.trainer.nonfinite_stop import NonFiniteTrainingError, SkippedUpdateStop
from mindrl.workers.skipped_updates import SkippedUpdates


def counted(pattern: str, start: SkippedUpdates | None = None) -> SkippedUpdates:
    """The counter after updates applied ('a') or skipped ('s'), in order."""
    skips = start or SkippedUpdates()
    for update in pattern:
        skips.applied() if update == "a" else skips.skipped()
    return skips


def test_streak_counts_skips_in_a_row_and_total_over_the_run() -> None:
    assert counted("ass") == SkippedUpdates(total=2, streak=2)
    assert counted("assa") == SkippedUpdates(total=2, streak=0)  # an applied update ends it
    assert counted("ssass") == SkippedUpdates(total=4, streak=2)
    # a resumed run carries the total on and starts its streak at 0
    assert counted("s", SkippedUpdates(total=5)) == SkippedUpdates(total=6, streak=1)
    assert counted("ss").metrics("critic") == {
        "critic/skipped_updates": 2.0,
        "critic/consecutive_skipped_updates": 2.0,
    }


def step_metrics(actor_streak: int, critic_streak: int | None = None) -> dict[str, float]:
    out = SkippedUpdates(total=actor_streak, streak=actor_streak).metrics("actor")
    if critic_streak is not None:
        out.update(SkippedUpdates(total=critic_streak, streak=critic_streak).metrics("critic"))
    return out


def test_run_stops_when_a_streak_reaches_the_limit_naming_the_step() -> None:
    stop = SkippedUpdateStop(limit=3)
    stop.check(4, step_metrics(2))  # below the limit: the run goes on
    with pytest.raises(NonFiniteTrainingError) as err:
        stop.check(5, step_metrics(3))
    assert (err.value.step, err.value.role, err.value.streak) == (5, "actor", 3)
    message = str(err.value)
    assert message.startswith("step 5: 3 actor updates in a row skipped")
    assert "rl_config.max_consecutive_skipped_updates=3" in message and "\n" not in message
    with pytest.raises(NonFiniteTrainingError, match="critic") as err:
        stop.check(6, step_metrics(0, critic_streak=4))  # PPO's critic counts on its own
    assert err.value.step == 6


def test_checkpoints_wait_while_a_streak_runs() -> None:
    stop = SkippedUpdateStop(limit=3)
    assert not stop.defers_checkpoint(step_metrics(0))
    assert stop.defers_checkpoint(step_metrics(1))
    assert stop.defers_checkpoint(step_metrics(0, critic_streak=2))
    assert not stop.defers_checkpoint({"grpo/score": 0.5})  # no trained role reported


def test_limit_zero_turns_the_rule_off() -> None:
    stop = SkippedUpdateStop(limit=0)
    stop.check(9, step_metrics(1000))
    assert not stop.defers_checkpoint(step_metrics(1000))
    with pytest.raises(ValueError, match="max_consecutive_skipped_updates"):
        SkippedUpdateStop(limit=-1)


def test_default_limit_is_small_and_on() -> None:
    assert 0 < LoopConfig().max_consecutive_skipped_updates <= 5


def test_console_line_shows_skips_once_there_are_any() -> None:
    healthy = {"grad_norm": 0.5, **step_metrics(0)}
    assert "skipped" not in console_line(1, 4, healthy, None)
    broken = {"grad_norm": float("nan"), **SkippedUpdates(total=3, streak=2).metrics("actor")}
    line = console_line(2, 4, broken, None)
    assert line.endswith("grad_norm=nan skipped=3 skipped_in_a_row=2")
