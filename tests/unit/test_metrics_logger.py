"""MetricsLogger: crash-safe JSONL, resume truncation, NaN -> null, TensorBoard, console."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from mindrl.trainer.metrics import (
    COMPLETIONS_FILE,
    METRICS_FILE,
    MetricsLogger,
    Timer,
    console_line,
    format_duration,
    progress_prefix,
    summarize,
)


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


class FakeClock:
    """A settable monotonic clock, so step durations in the ETA tests are exact."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_logger(out: Path, **kw) -> MetricsLogger:
    kw.setdefault("use_tensorboard", False)
    kw.setdefault("total_steps", 10)
    kw.setdefault("stream", io.StringIO())
    return MetricsLogger(out, **kw)


def test_jsonl_line_per_step_readable_while_open(tmp_output_dir: Path) -> None:
    path = tmp_output_dir / METRICS_FILE
    with make_logger(tmp_output_dir) as logger:
        logger.log(1, {"grpo/score": 0.25, "actor/pg_loss": -0.5})
        # another reader sees the line before the logger closes (flushed + fsynced)
        rows = read_jsonl(path)
        assert [r["step"] for r in rows] == [1]
        assert rows[0]["grpo/score"] == 0.25 and rows[0]["actor/pg_loss"] == -0.5
        assert isinstance(rows[0]["time"], float) and rows[0]["time"] > 1.6e9
        logger.log(2, {"grpo/score": 0.5})
        assert [r["step"] for r in read_jsonl(path)] == [1, 2]


def test_non_finite_values_are_null(tmp_output_dir: Path) -> None:
    with make_logger(tmp_output_dir) as logger:
        logger.log(1, {"a": float("nan"), "b": float("inf"), "c": -float("inf"), "d": 3})
    text = (tmp_output_dir / METRICS_FILE).read_text()
    assert "NaN" not in text and "Infinity" not in text
    row = json.loads(text)
    assert row["a"] is None and row["b"] is None and row["c"] is None and row["d"] == 3.0


def test_resume_truncates_steps_after_the_checkpoint(tmp_output_dir: Path) -> None:
    path = tmp_output_dir / METRICS_FILE
    with make_logger(tmp_output_dir) as logger:
        for step in range(1, 8):  # logged step 7, then "crashed" before checkpoint 7
            logger.log(step, {"grpo/score": float(step)})
    with open(path, "a") as fh:  # and a torn line from the crash
        fh.write('{"step": 8, "ti')
    with make_logger(tmp_output_dir, start_step=6) as logger:  # resumed from checkpoint 6
        assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3, 4, 5, 6]
        logger.log(7, {"grpo/score": 70.0})
        logger.log(8, {"grpo/score": 80.0})
    rows = read_jsonl(path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [r["grpo/score"] for r in rows] == [1, 2, 3, 4, 5, 6, 70, 80]


def test_fresh_run_starts_file_over(tmp_output_dir: Path) -> None:
    with make_logger(tmp_output_dir) as logger:
        logger.log(0, {"val/score": 0.0})  # validation before training
        logger.log(1, {"x": 1.0})
        logger.log(2, {"x": 2.0})
    with make_logger(tmp_output_dir) as logger:
        logger.log(1, {"x": 10.0})
    rows = read_jsonl(tmp_output_dir / METRICS_FILE)
    assert [(r["step"], r["x"]) for r in rows] == [(1, 10.0)]


def test_log_outside_with_and_reserved_keys_fail(tmp_output_dir: Path) -> None:
    logger = make_logger(tmp_output_dir)
    with pytest.raises(RuntimeError, match="outside"):
        logger.log(1, {"x": 1.0})
    with logger, pytest.raises(ValueError, match="reserved"):
        logger.log(1, {"step": 3.0})


def test_tensorboard_scalars_written_and_nan_skipped(tmp_output_dir: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with make_logger(tmp_output_dir, use_tensorboard=True) as logger:
        for step in (1, 2, 3):
            logger.log(step, {"grpo/score": step / 4, "actor/entropy": float("nan")})
    tb_dir = tmp_output_dir / "tensorboard"
    assert any(p.name.startswith("events.out.tfevents") for p in tb_dir.iterdir())
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    assert acc.Tags()["scalars"] == ["grpo/score"]  # the all-NaN metric never reached TB
    events = acc.Scalars("grpo/score")
    assert [e.step for e in events] == [1, 2, 3]
    assert [e.value for e in events] == pytest.approx([0.25, 0.5, 0.75])


def test_tensorboard_resume_replaces_purged_steps(tmp_output_dir: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with make_logger(tmp_output_dir, use_tensorboard=True) as logger:
        for step in (1, 2, 3):
            logger.log(step, {"grpo/score": float(step)})
    with make_logger(tmp_output_dir, use_tensorboard=True, start_step=2) as logger:
        logger.log(3, {"grpo/score": 30.0})
        logger.log(4, {"grpo/score": 40.0})
    acc = EventAccumulator(str(tmp_output_dir / "tensorboard"))
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("grpo/score")]
    assert got == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def test_progress_prefix_and_eta_math() -> None:
    # 12 of 40 done at 7 s per step: 28 steps left -> 196 s = 3m16s; 12/40 = 30 %
    assert progress_prefix(12, 40, 7.0) == "[12/40  30%] eta 3m16s"
    # percent is floored, so 100 % shows only at the end
    assert progress_prefix(399, 400, 1.0) == "[399/400  99%] eta 1s"
    assert progress_prefix(3, 400, None) == "[  3/400   0%] eta ?"
    assert format_duration(59.4) == "59s"
    assert format_duration(83) == "1m23s"
    assert format_duration(2 * 3600 + 5 * 60 + 7) == "2h05m"


def test_console_line_fields_in_stable_order() -> None:
    metrics = {
        "e2e_tps": 812.345,
        "timing/step": 7.126,
        "grad_norm": 0.5,
        "strict_format_rewards/mean": 0.25,
        "actor/entropy": 1.5,
        "actor/kl_loss": 0.001,
        "actor/pg_loss": -0.0123,
        "response_length/mean": 123.45,
        "base_acc_rewards/mean": 0.5,
        "grpo/score": 0.4375,
        "actor/lr": 1e-6,  # not a console metric
    }
    line = console_line(12, 40, metrics, 7.0)
    assert line == (
        "[12/40  30%] eta 3m16s | score=0.4375 base_acc=0.5000 strict_format=0.2500 "
        "resp_len=123.5 pg_loss=-0.0123 kl_loss=0.001 entropy=1.5 grad_norm=0.5 "
        "step_time=7.13s e2e_tps=812.3"
    )
    assert "\r" not in line


def test_logger_console_eta_uses_mean_step_time(tmp_output_dir: Path) -> None:
    stream, clock = io.StringIO(), FakeClock(100.0)
    with make_logger(tmp_output_dir, total_steps=10, stream=stream, clock=clock) as logger:
        clock.t = 110.0  # step 1 took 10 s (since open)
        logger.log(1, {"grpo/score": 0.5})
        clock.t = 130.0  # step 2 took 20 s
        logger.log(2, {"grpo/score": 0.75})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    # after step 1: mean 10 s x 9 left = 90 s; after step 2: mean 15 s x 8 left = 120 s
    assert lines[0] == "[ 1/10  10%] eta 1m30s | score=0.5000"
    assert lines[1] == "[ 2/10  20%] eta 2m00s | score=0.7500"


def test_first_step_prefers_timing_step_metric(tmp_output_dir: Path) -> None:
    stream, clock = io.StringIO(), FakeClock(0.0)
    with make_logger(tmp_output_dir, total_steps=4, stream=stream, clock=clock) as logger:
        clock.t = 500.0  # includes start-up; the step itself says it took 6 s
        logger.log(1, {"timing/step": 6.0})
        assert logger.mean_step_seconds == 6.0
        clock.t = 504.0
        logger.log(2, {"timing/step": 4.0})
        assert logger.mean_step_seconds == (6.0 + 4.0) / 2


def test_validation_record_of_same_step_adds_no_eta_interval(tmp_output_dir: Path) -> None:
    stream, clock = io.StringIO(), FakeClock(0.0)
    kw = {"total_steps": 10, "stream": stream, "clock": clock, "start_step": 4}
    with make_logger(tmp_output_dir, **kw) as logger:
        clock.t = 30.0  # validation before training at the resume step: no step interval
        logger.log(4, {"val/score": 0.5, "val/base_acc_rewards/mean": 0.5})
        clock.t = 40.0  # step 5: 40 s since open (validation included)
        logger.log(5, {"grpo/score": 0.25, "base_acc_rewards/mean": 0.25})
        clock.t = 70.0  # validation after step 5 (same step): no interval either
        logger.log(5, {"val/score": 0.75, "val/base_acc_rewards/mean": 0.75})
        clock.t = 80.0  # step 6: 40 s since step 5 was first logged
        logger.log(6, {"grpo/score": 0.5})
        assert logger.mean_step_seconds == (40.0 + 40.0) / 2
    lines = stream.getvalue().splitlines()
    assert lines == [
        "[ 4/10  40%] eta ? | val_score=0.5000 val_base_acc=0.5000",
        "[ 5/10  50%] eta 3m20s | score=0.2500 base_acc=0.2500",  # 40 s x 5 left
        "[ 5/10  50%] eta 3m20s | val_score=0.7500 val_base_acc=0.7500",
        "[ 6/10  60%] eta 2m40s | score=0.5000",  # 40 s x 4 left
    ]
    rows = read_jsonl(tmp_output_dir / METRICS_FILE)
    assert [r["step"] for r in rows] == [4, 5, 5, 6]


def test_console_off_prints_nothing(tmp_output_dir: Path) -> None:
    stream = io.StringIO()
    with make_logger(tmp_output_dir, console=False, stream=stream) as logger:
        logger.log(1, {"grpo/score": 1.0})
    assert stream.getvalue() == ""


def test_log_completions_caps_records_and_truncates_on_resume(tmp_output_dir: Path) -> None:
    path = tmp_output_dir / COMPLETIONS_FILE

    def recs(step: int, n: int) -> list[dict]:
        return [
            {
                "prompt": f"p{step}-{i}",
                "response": "é",
                "label": "4",
                "rewards": {"base_acc": 1.0, "strict_format": float("nan")},
            }
            for i in range(n)
        ]

    with make_logger(tmp_output_dir, log_completions=2) as logger:
        assert logger.log_completions(1, recs(1, 5)) == 2
        assert logger.log_completions(2, recs(2, 1)) == 1
    rows = read_jsonl(path)
    assert [(r["step"], r["prompt"]) for r in rows] == [(1, "p1-0"), (1, "p1-1"), (2, "p2-0")]
    assert rows[0]["rewards"] == {"base_acc": 1.0, "strict_format": None}
    assert rows[0]["response"] == "é"
    with make_logger(tmp_output_dir, log_completions=2, start_step=1) as logger:
        logger.log_completions(2, recs(2, 2))
    assert [(r["step"], r["prompt"]) for r in read_jsonl(path)] == [
        (1, "p1-0"),
        (1, "p1-1"),
        (2, "p2-0"),
        (2, "p2-1"),
    ]


def test_log_completions_off_writes_no_file(tmp_output_dir: Path) -> None:
    with make_logger(tmp_output_dir) as logger:
        assert logger.log_completions(1, [{"prompt": "x"}]) == 0
    assert not (tmp_output_dir / COMPLETIONS_FILE).exists()


def test_summarize() -> None:
    vals = [3.0, 10.0, 5.0, 6.0]
    assert summarize(vals, "response_length") == {
        "response_length/mean": (3 + 10 + 5 + 6) / 4,
        "response_length/max": 10.0,
        "response_length/min": 3.0,
    }
    empty = summarize([], "prompt_length")
    assert set(empty) == {"prompt_length/mean", "prompt_length/max", "prompt_length/min"}
    assert all(math.isnan(v) for v in empty.values())


def test_timer_accumulates_per_name() -> None:
    clock = FakeClock(0.0)
    timer = Timer(clock=clock)
    with timer("reward"):
        clock.t += 1.5
    with timer("rollout"):
        clock.t += 4.0
    with timer("reward"):
        clock.t += 0.25
    with pytest.raises(KeyError), timer("update"):  # time counts even when the block raises
        clock.t += 2.0
        raise KeyError("boom")
    assert timer.metrics() == {"timing/reward": 1.75, "timing/rollout": 4.0, "timing/update": 2.0}
    timer.record("reward", 0.25)  # measured elsewhere (overlapping work): added the same way
    assert timer.metrics()["timing/reward"] == 2.0
    timer.reset()
    assert timer.metrics() == {}
