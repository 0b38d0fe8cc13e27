"""MindSpeed-RL's `use_wandb` / `use_swanlab` through MetricsLogger, with the real libraries.

wandb runs offline (it writes a run folder and never reaches the network); its history is read
back from the run's own `.wandb` transaction log with wandb's protobuf `Record`, so the test
checks what `wandb sync` would upload, not just that files exist.
"""

from __future__ import annotations

import importlib.util
import io
import json
import struct
from pathlib import Path

import pytest

from mindrl.config import load_run_config
from mindrl.config.rl import LoggingConfig
from mindrl.trainer.metrics import METRICS_FILE, MetricsLogger
from mindrl.trainer.trackers import TrackerError, tracker_problems

pytest.importorskip("wandb")

_BLOCK = 32768  # the transaction log's block size; records never straddle a 7-byte header


@pytest.fixture(autouse=True)
def wandb_offline(tmp_path, monkeypatch):
    """No network, nothing written outside tmp_path."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home" / name.lower()))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def read_wandb_log(path: Path) -> list:
    """The protobuf Records of a run's .wandb file (leveldb-style log: 7-byte file header,
    32 KiB blocks, records split FULL/FIRST/MIDDLE/LAST behind a 7-byte header each)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a wandb transaction log"
    pos, pending, out = 7, b"", []
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + chunk)
            out.append(record)
            pending = b""
        elif kind in (2, 3):  # FIRST, MIDDLE
            pending += chunk
    return out


def history(records: list) -> dict[int, dict[str, float]]:
    """step -> the logged values (wandb's own `_step`/`_runtime`/`_timestamp` dropped)."""
    rows = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {
                (i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item
            }
            rows[r.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return rows


def one_run(save_dir: Path) -> Path:
    runs = sorted((save_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    return runs[0]


def run_record(records: list):
    return next(r.run for r in records if r.WhichOneof("record_type") == "run")


def exit_code(records: list) -> int:
    return next(r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit")


def jsonl_values(out: Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl merged per step, nulls dropped (what the trackers get)."""
    merged: dict[int, dict[str, float]] = {}
    for line in (out / METRICS_FILE).read_text().splitlines():
        record = json.loads(line)
        step = record.pop("step")
        record.pop("time")
        merged.setdefault(step, {}).update({k: v for k, v in record.items() if v is not None})
    return merged


def log_three_steps(out: Path, tracking: LoggingConfig, **kw) -> None:
    with MetricsLogger(
        out, use_tensorboard=False, total_steps=3, stream=io.StringIO(), tracking=tracking, **kw
    ) as logger:
        for step in (1, 2, 3):
            logger.log(
                step,
                {
                    "grpo/score": step / 4,
                    "actor/pg_loss": -0.5 * step,
                    "acc_rewards/mean": float("nan") if step == 2 else 1.0,
                    "timing/step": 0.25,
                },
            )
        logger.log(3, {"val/score": 0.75})  # a second record for the same step


def test_offline_run_holds_every_logged_metric(tmp_path):
    out, save_dir = tmp_path / "out", tmp_path / "wb"
    tracking = LoggingConfig(
        use_wandb=True, wandb_project="proj", wandb_exp_name="exp", wandb_save_dir=str(save_dir)
    )
    log_three_steps(out, tracking, run_config={"rl_config": {"use_wandb": True}})
    records = read_wandb_log(next(one_run(save_dir).glob("run-*.wandb")))
    assert history(records) == jsonl_values(out)  # same names, steps and values
    assert history(records)[3]["val/score"] == 0.75
    assert "acc_rewards/mean" not in history(records)[2]  # NaN -> null -> skipped
    run = run_record(records)
    assert (run.project, run.display_name) == ("proj", "exp")
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert config["rl_config"] == {"use_wandb": True}
    assert exit_code(records) == 0  # finished cleanly


def test_defaults_and_no_wandb_mode(tmp_path, monkeypatch):
    """Without WANDB_MODE the run is offline; the folder goes into the output dir, the
    project is `mindrl` and the run is named after the output folder."""
    monkeypatch.delenv("WANDB_MODE")
    out = tmp_path / "my_run"
    log_three_steps(out, LoggingConfig(use_wandb=True))
    records = read_wandb_log(next(one_run(out).glob("run-*.wandb")))
    run = run_record(records)
    assert (run.project, run.display_name) == ("mindrl", "my_run")
    assert sorted(history(records)) == [1, 2, 3]


def test_a_failed_loop_marks_the_run_failed(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="boom"):
        with MetricsLogger(
            out, use_tensorboard=False, total_steps=2, console=False,
            tracking=LoggingConfig(use_wandb=True),
        ) as logger:  # fmt: skip
            logger.log(1, {"grpo/score": 0.5})
            raise RuntimeError("boom")
    records = read_wandb_log(next(one_run(out).glob("run-*.wandb")))
    assert history(records) == {1: {"grpo/score": 0.5}}
    assert exit_code(records) == 1


def test_unwritable_save_dir_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    tracking = LoggingConfig(use_wandb=True, wandb_save_dir=str(blocker / "wb"))
    logger = MetricsLogger(
        tmp_path / "out", use_tensorboard=False, total_steps=1, tracking=tracking
    )
    with pytest.raises(TrackerError, match="rl_config.wandb_save_dir") as info:
        logger.open()
    assert "\n" not in str(info.value)
    assert logger._metrics_fh is None  # the files opened before it are closed again


def test_config_accepts_mindspeed_tracker_keys():
    overrides = [
        "rl_config.use_wandb=true",
        "rl_config.wandb_project=p",
        "rl_config.wandb_exp_name=e",
        "rl_config.wandb_save_dir=/tmp/x",
        "rl_config.swanlab_mode=local",
    ]
    run, _ = load_run_config("grpo_tiny_cpu", overrides, check_paths=False)
    logging_config = run.rl.logging
    assert logging_config.use_wandb and logging_config.wandb_project == "p"
    assert tracker_problems(logging_config) == []


def test_swanlab_config_problems():
    problems = tracker_problems(LoggingConfig(use_swanlab=True, swanlab_mode="clod"))
    bad_mode = (
        "rl_config.swanlab_mode: 'clod' is not one of offline, local, cloud, online, disabled"
    )
    assert bad_mode in problems
    missing = importlib.util.find_spec("swanlab") is None
    assert any("needs the swanlab package" in p for p in problems) == missing
    assert len(problems) == 1 + missing


@pytest.mark.slow
def test_training_run_logs_to_wandb(tmp_path, tiny_model_dir):
    """Through cli/train_grpo.py (the trainer's setup passes rl_config to MetricsLogger): two
    grpo_tiny_cpu steps, every metrics.jsonl value in the offline run, which ends cleanly."""
    from tests.e2e._run import run_train

    out = tmp_path / "run"
    proc = run_train(
        out,
        "actor_config.train_iters=2",
        "megatron_training.save_interval=2",
        "rl_config.use_wandb=true",
        "rl_config.wandb_project=mindrl_e2e",
        "rl_config.wandb_exp_name=tiny2",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = read_wandb_log(next(one_run(out).glob("run-*.wandb")))
    assert history(records) == jsonl_values(out) and sorted(history(records)) == [1, 2]
    assert "actor/pg_loss" in history(records)[2]
    assert {i.key for i in run_record(records).config.update} >= {"actor_config", "rl_config"}
    assert exit_code(records) == 0
    assert "wandb sync" in proc.stderr


def test_swanlab_offline_run(tmp_path, monkeypatch):
    if importlib.util.find_spec("swanlab") is None:
        pytest.skip("swanlab is not installed (not in the dev extra: it requires protobuf<7)")
    monkeypatch.delenv("SWANLAB_MODE", raising=False)
    out, save_dir = tmp_path / "out", tmp_path / "sl"
    tracking = LoggingConfig(
        use_swanlab=True, swanlab_project="p", swanlab_exp_name="e", swanlab_save_dir=str(save_dir)
    )
    log_three_steps(out, tracking)
    runs = sorted(save_dir.glob("run-*"))
    assert len(runs) == 1
    data = b"".join(p.read_bytes() for p in runs[0].glob("*.swanlab"))
    for name in ("grpo/score", "actor/pg_loss", "val/score"):
        assert name.encode() in data
