"""A full disk and a vanished folder: every output write that fails is named in one line and
stops the run; the last complete checkpoint stays the tracked newest and loads.

Each case writes to a real small filesystem (a tmpfs of a few MiB, mounted for the test and
unmounted in its teardown; skipped where mounting is not permitted). The end-to-end case runs
the tiny config with its save folder on a 6 MiB tmpfs: the first checkpoint fits, the second
is refused before it is written (the folder's free space against the first one's size), and
the console's last line is the named error, not a Ray traceback. The others drive the
writers themselves: `CheckpointWriter` with a stand-in actor whose save is a real
`torch.save` (so a write that runs out of space mid-file fails as torch's does, with
``basic_ios::clear: iostream error``), `MetricsLogger` (metrics.jsonl, TensorBoard) and the
driver's log file.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from mindrl.checkpoint.atomic import verify_manifest
from mindrl.config import load_run_config
from mindrl.config.run import RunConfig
from mindrl.logs import driver_log_failure, run_logging
from mindrl.storage import StorageError
from mindrl.trainer.checkpointing import (
    CheckpointWriter,
    checkpoint_bytes_estimate,
    find_resume_point,
)
from mindrl.trainer.metrics import MetricsLogger, iter_step_records
from mindrl.trainer.run_state import CheckpointDirs, RunState, load_run_state
from tests.e2e._run import checkpoint_of_step, read_metrics, run_train

MOUNT_TIMEOUT_S = 30.0
MIB = 1024 * 1024


def _mount_tmpfs(where: Path, size_mib: float) -> None:
    where.mkdir(parents=True, exist_ok=True)
    size = f"size={round(size_mib * 1024)}k"
    cmd = ["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(where)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a small filesystem here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {done.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """`small_disk(mib, where=None)`: a fresh tmpfs of that size (at `where`, or a new folder
    under tmp_path); every one is unmounted afterwards."""
    mounted: list[Path] = []

    def make(size_mib: float, where: Path | None = None) -> Path:
        where = where or tmp_path / f"disk{len(mounted)}"
        _mount_tmpfs(where, size_mib)
        mounted.append(where)
        return where

    try:
        yield make
    finally:
        gc.collect()  # files a failed torch.save left open (held by a caught traceback)
        for where in reversed(mounted):
            done = subprocess.run(["umount", str(where)], timeout=MOUNT_TIMEOUT_S, check=False)
            if done.returncode != 0:  # still busy: detach it now, freed when the last file closes
                subprocess.run(["umount", "-l", str(where)], timeout=MOUNT_TIMEOUT_S, check=False)


def fill(disk: Path, leave_bytes: int = 0) -> None:
    """Write a filler file until only `leave_bytes` are free on `disk`."""
    free = shutil.disk_usage(disk).free - leave_bytes
    with open(disk / "filler.bin", "wb") as fh:
        chunk = b"\0" * MIB
        while free > 0:
            try:
                free -= fh.write(chunk[: min(len(chunk), free)])
                fh.flush()
            except OSError:
                break


class TorchSavingActor:
    """Stands in for the actor role: its checkpoint is one tensor of `nbytes`, written by
    `torch.save` as the workers write theirs."""

    def __init__(self) -> None:
        self.nbytes = 256 * 1024

    def save_checkpoint(self, iter_dir: str) -> None:
        weights = torch.ones(self.nbytes // 4, dtype=torch.float32)
        torch.save({"weights": weights}, Path(iter_dir) / "model.pt")


def tiny_run(save: Path, *overrides: str) -> RunConfig:
    """The tiny config's RunConfig, saving under `save`."""
    run, _ = load_run_config(
        "grpo_tiny_cpu", [f"actor_config.save={save}", *overrides], local_paths=False
    )
    return run


def tiny_run_loading(save: Path) -> RunConfig:
    return tiny_run(save, f"actor_config.load={save}")


def state(step: int) -> RunState:
    return RunState.capture(step, {"epoch": 0, "position": step})


def assert_step_is_newest_and_loads(save: Path, step: int) -> None:
    dirs = CheckpointDirs(save)
    assert dirs.latest() == step and dirs.steps()[-1] == step
    verify_manifest(dirs.iteration_dir(step))
    assert load_run_state(dirs.iteration_dir(step)).step == step
    loaded = torch.load(dirs.iteration_dir(step) / "model.pt", weights_only=True)
    assert float(loaded["weights"].sum()) == loaded["weights"].numel()
    leftovers = [p.name for p in save.iterdir() if p.name.startswith(".iter_")]
    assert leftovers == [], f"partial folders left: {leftovers}"


def test_checkpoint_that_runs_out_of_space_mid_write_is_named(small_disk) -> None:
    """The pre-check passes (the newest checkpoint was small), the write then fills the disk
    inside torch.save: one named error, the earlier checkpoint still the newest."""
    disk = small_disk(6)  # room for the tiny model's estimate before the first save
    writer, actor = CheckpointWriter(tiny_run(disk / "ckpt")), TorchSavingActor()
    writer.save(1, actor, state(1))  # type: ignore[arg-type]
    actor.nbytes = 8 * MIB  # larger than the disk
    with pytest.raises(StorageError) as caught:
        writer.save(2, actor, state(2))  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message
    assert f"no space left for checkpoint iter_0000002 in {disk / 'ckpt'}" in message
    assert "the disk filled up while writing it" in message
    assert_step_is_newest_and_loads(disk / "ckpt", 1)


def test_checkpoint_that_cannot_fit_is_refused_before_writing(small_disk) -> None:
    disk = small_disk(6)  # room for the tiny model's estimate before the first save
    writer, actor = CheckpointWriter(tiny_run(disk / "ckpt")), TorchSavingActor()
    writer.save(1, actor, state(1))  # type: ignore[arg-type]
    fill(disk, leave_bytes=64 * 1024)
    with pytest.raises(StorageError, match=r"no space left for checkpoint iter_0000002 in "):
        writer.save(2, actor, state(2))  # type: ignore[arg-type]
    assert_step_is_newest_and_loads(disk / "ckpt", 1)


def test_save_folder_that_vanished_is_named(tmp_path: Path) -> None:
    writer, actor = CheckpointWriter(tiny_run(tmp_path / "ckpt")), TorchSavingActor()
    writer.save(1, actor, state(1))  # type: ignore[arg-type]
    shutil.rmtree(tmp_path / "ckpt")
    with pytest.raises(StorageError, match=r"the save folder .*ckpt vanished during the run"):
        writer.save(2, actor, state(2))  # type: ignore[arg-type]
    assert not (tmp_path / "ckpt").exists()  # not silently recreated with a fresh history


# TensorBoard's writer thread dies on the failed write (its traceback is the thread's own);
# the next flush raises it in the logger, which is what is checked
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("sink", ["metrics.jsonl", "TensorBoard"])
def test_metrics_write_on_a_full_disk_is_named(small_disk, tmp_path: Path, sink: str) -> None:
    """The sink's folder is the small disk (TensorBoard's alone: metrics.jsonl keeps its
    room)."""
    out = tmp_path / "out"
    disk = small_disk(1, out if sink == "metrics.jsonl" else out / "tensorboard")
    tensorboard = sink == "TensorBoard"
    with MetricsLogger(out, use_tensorboard=tensorboard, total_steps=4, console=False) as m:
        m.log(1, {"grpo/score": 0.5})
        fill(disk)
        many = {f"metric_{i}": 0.5 for i in range(200)}
        with pytest.raises(StorageError) as caught:
            for step in range(2, 200):  # until the file's last page and the buffers are full
                m.log(step, many)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"no space left for {sink}") and f" in {disk}: " in message
    steps = [step for _, _, step in iter_step_records(out / "metrics.jsonl")]
    assert steps[0] == 1  # what was written before stays (a torn last line is skipped)


def test_metrics_folder_that_vanished_is_named(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with MetricsLogger(out, use_tensorboard=False, total_steps=4, console=False) as m:
        m.log(1, {"grpo/score": 0.5})
        shutil.rmtree(out)
        with pytest.raises(
            StorageError, match=r"cannot write metrics.jsonl: the folder .*out vanished"
        ):
            m.log(2, {"grpo/score": 0.5})


def test_driver_log_write_on_a_full_disk_is_named(small_disk) -> None:
    disk = small_disk(1)
    with run_logging(disk, "warning"):  # the lines below go to the file, not the console
        assert driver_log_failure() is None
        fill(disk)
        for _ in range(64):  # more than the file's buffer
            logging.getLogger("mindrl.test").info("x" * 4096)
        failure = driver_log_failure()
    assert failure is not None
    assert str(failure).startswith(f"no space left for driver.log in {disk / 'logs'}")
    os.remove(disk / "filler.bin")


# ---------------------------------------------------------------------------- whole runs
def _last_console_line(stderr: str) -> str:
    return [line for line in stderr.splitlines() if line.strip()][-1]


@pytest.mark.slow
@pytest.mark.multiproc
def test_run_whose_next_checkpoint_cannot_fit_stops_named_and_resumes(
    small_disk, tmp_path: Path
) -> None:
    """Save folder on a 6 MiB tmpfs: step 1's checkpoint fits, step 2's is refused before
    it is written; the run's last line names the folder, its free space and the need, and
    step 1 stays the tracked newest, complete, and a run resumes from it."""
    disk = small_disk(6)
    out, save = tmp_path / "out", disk / "ckpt"
    done = run_train(
        out,
        f"actor_config.save={save}",
        "megatron_training.train_iters=3",
        "megatron_training.save_interval=1",
    )
    assert done.returncode == 1, done.stderr[-3000:]
    last = _last_console_line(done.stderr)
    assert last.startswith(f"error: no space left for checkpoint iter_0000002 in {save}: "), last
    assert " free; it needs about " in last
    assert "Traceback" not in done.stderr
    assert CheckpointDirs(save).latest() == 1
    assert sorted(p.name for p in save.iterdir()) == [
        "iter_0000001",
        "latest_checkpointed_iteration.txt",
    ]  # no partial folder a resume could take
    resume_from = find_resume_point(tiny_run_loading(save))
    assert resume_from is not None and resume_from.state.step == 1

    again = tmp_path / "resumed"
    copy = checkpoint_of_step(save, 1, tmp_path / "resume_ckpt")
    resumed = run_train(
        again,
        f"actor_config.load={copy}",
        f"actor_config.save={copy}",
        "megatron_training.train_iters=2",
        "megatron_training.save_interval=1",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [m["step"] for m in read_metrics(again)] == [2]


@pytest.mark.slow
@pytest.mark.multiproc
def test_run_whose_checkpoint_fills_the_disk_while_writing_is_named(
    small_disk, tmp_path: Path
) -> None:
    """A tmpfs just above the parameter-count estimate of the tiny model's checkpoint and
    below its real size: the check before the save passes, the workers' torch writes fail
    (torch says ``basic_ios::clear: iostream error`` inside a Ray traceback), and the run's
    last line names the disk; the partial folder is gone."""
    estimate = checkpoint_bytes_estimate(tiny_run(tmp_path / "unused"))
    disk = small_disk((estimate + 48 * 1024) / MIB)
    out, save = tmp_path / "out", disk / "ckpt"
    done = run_train(
        out,
        f"actor_config.save={save}",
        "megatron_training.train_iters=1",
        "megatron_training.save_interval=1",
    )
    assert done.returncode == 1, done.stderr[-3000:]
    last = _last_console_line(done.stderr)
    assert last.startswith(f"error: no space left for checkpoint iter_0000001 in {save}: "), last
    assert "the disk filled up while writing it" in last
    assert "Traceback" not in done.stderr
    assert CheckpointDirs(save).latest() is None
    assert list(save.iterdir()) == []  # no partial folder
