"""RunState round trip (exact RNG continuation) and atomic megatron-style checkpoint folders."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from mindrl.trainer.run_state import (
    RUN_STATE_FILE,
    CheckpointDirs,
    RunState,
    load_run_state,
    save_run_state,
)

TRACKER = "latest_checkpointed_iteration.txt"


def draws() -> tuple:
    """Draws from every generator the driver uses, including the cached-Gaussian paths."""
    return (
        [random.random() for _ in range(3)],
        random.gauss(0.0, 1.0),
        np.random.rand(4).tolist(),
        float(np.random.randn()),
        torch.rand(5).tolist(),
        torch.randint(0, 1000, (3,)).tolist(),
    )


def test_run_state_round_trip_continues_rngs_exactly(tmp_path: Path) -> None:
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)
    random.gauss(0.0, 1.0)  # leaves a cached second Gaussian in Python's state
    np.random.randn()  # and one in NumPy's legacy state
    state = RunState.capture(
        step=7,
        sampler={"epoch": 2, "position": 48},
        kl_ctrl={"value": 0.0012345678901234567},
        extra={"best_val": 0.5, "note": "ünïcode"},
    )
    expected = draws()  # what an uninterrupted run draws next

    save_run_state(tmp_path, state)
    random.seed(0)  # a new process would start from other states
    np.random.seed(0)
    torch.manual_seed(0)
    assert draws() != expected

    loaded = load_run_state(tmp_path)
    assert loaded == state  # every field, RNG states included, survives JSON exactly
    loaded.rng.restore()
    assert draws() == expected
    assert loaded.step == 7 and loaded.sampler == {"epoch": 2, "position": 48}
    assert loaded.kl_ctrl["value"] == 0.0012345678901234567
    assert loaded.extra == {"best_val": 0.5, "note": "ünïcode"}
    json.loads((tmp_path / RUN_STATE_FILE).read_text())  # plain JSON, no pickle


def test_run_state_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="position"):
        RunState.capture(step=1, sampler={"epoch": 0})
    with pytest.raises(ValueError, match="step"):
        RunState.capture(step=-1, sampler={"epoch": 0, "position": 0})
    with pytest.raises(FileNotFoundError):
        load_run_state(tmp_path)
    bad = RunState.capture(step=1, sampler={"epoch": 0, "position": 0}, extra={"t": object()})
    with pytest.raises(TypeError):
        save_run_state(tmp_path, bad)


def save_step(dirs: CheckpointDirs, step: int) -> Path:
    """One full save: driver state plus a stand-in worker shard, then commit."""
    temp = dirs.begin(step)
    assert dirs.pending(step) == temp
    save_run_state(temp, RunState.capture(step=step, sampler={"epoch": 0, "position": step}))
    (temp / "mp_rank_00").mkdir()
    (temp / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"w" * 16)
    return dirs.commit(step)


def test_commit_layout_and_tracker(tmp_output_dir: Path) -> None:
    dirs = CheckpointDirs(tmp_output_dir / "ckpt")
    assert dirs.latest() is None
    final = save_step(dirs, 7)
    assert final == tmp_output_dir / "ckpt" / "iter_0000007"
    assert (final / "mp_rank_00" / "model_optim_rng.pt").read_bytes() == b"w" * 16
    assert load_run_state(final).sampler == {"epoch": 0, "position": 7}
    assert (dirs.root / TRACKER).read_text().strip() == "7"
    assert dirs.latest() == 7
    assert sorted(p.name for p in dirs.root.iterdir()) == ["iter_0000007", TRACKER]
    with pytest.raises(RuntimeError, match="no checkpoint save of step 7"):
        dirs.pending(7)


def test_commit_without_begin_fails(tmp_output_dir: Path) -> None:
    dirs = CheckpointDirs(tmp_output_dir)
    with pytest.raises(RuntimeError, match=r"commit\(3\) without begin\(3\)"):
        dirs.commit(3)
    dirs.begin(4)
    with pytest.raises(RuntimeError, match=r"commit\(3\) without begin\(3\)"):
        dirs.commit(3)


def test_crash_before_commit_leaves_latest_and_next_begin_cleans(tmp_output_dir: Path) -> None:
    root = tmp_output_dir / "ckpt"
    save_step(CheckpointDirs(root), 6)

    crashed = CheckpointDirs(root)  # the process that crashes mid-save
    temp = crashed.begin(7)
    save_run_state(temp, RunState.capture(step=7, sampler={"epoch": 0, "position": 7}))
    (temp / "shard.bin").write_bytes(b"partial")
    assert temp.parent == root and temp.name.startswith(".iter_0000007.tmp-")
    del crashed  # no commit

    resumed = CheckpointDirs(root)  # a fresh process after the crash
    assert resumed.latest() == 6
    assert resumed.steps() == [6]
    new_temp = resumed.begin(7)
    assert not temp.exists()  # the crash's leftovers are gone
    assert new_temp.exists() and new_temp != temp
    resumed.commit(7)
    assert resumed.latest() == 7
    assert sorted(p.name for p in root.iterdir()) == ["iter_0000006", "iter_0000007", TRACKER]


def test_latest_without_tracker_scans_complete_folders(tmp_output_dir: Path) -> None:
    dirs = CheckpointDirs(tmp_output_dir)
    for step in (2, 10, 5):
        save_step(dirs, step)
    assert dirs.latest() == 5  # the tracker names the last commit, not the largest step
    (tmp_output_dir / TRACKER).unlink()
    dirs.begin(11)  # an in-progress save never counts
    assert dirs.latest() == 10
    assert dirs.steps() == [2, 5, 10]


def test_saving_context_aborts_on_error(tmp_output_dir: Path) -> None:
    dirs = CheckpointDirs(tmp_output_dir)
    with pytest.raises(OSError), dirs.saving(3) as temp:
        (temp / "a").write_text("x")
        raise OSError("disk full")
    assert not temp.exists()
    assert dirs.latest() is None
    with dirs.saving(3) as temp:
        (temp / "a").write_text("x")
    assert (dirs.iteration_dir(3) / "a").read_text() == "x"
    assert dirs.latest() == 3


def test_resaving_a_step_replaces_it(tmp_output_dir: Path) -> None:
    dirs = CheckpointDirs(tmp_output_dir)
    with dirs.saving(4) as temp:
        (temp / "v").write_text("old")
    with dirs.saving(4) as temp:
        (temp / "v").write_text("new")
    assert (dirs.iteration_dir(4) / "v").read_text() == "new"
    assert sorted(p.name for p in tmp_output_dir.iterdir()) == ["iter_0000004", TRACKER]


def test_prune_keeps_last_k_and_never_the_latest(tmp_output_dir: Path) -> None:
    dirs = CheckpointDirs(tmp_output_dir)
    for step in range(1, 7):
        save_step(dirs, step)
    assert dirs.prune(0) == []  # 0 keeps all
    assert dirs.steps() == [1, 2, 3, 4, 5, 6]
    assert dirs.prune(2) == [1, 2, 3, 4]
    assert dirs.steps() == [5, 6]
    assert dirs.latest() == 6

    # a run resumed from step 5 re-commits step 5 (tracker 5) while 6 still exists:
    with dirs.saving(5) as temp:
        (temp / "again").write_text("")
    assert dirs.latest() == 5
    assert dirs.prune(1) == []  # keeping only step 6 would delete the tracker's step
    assert dirs.steps() == [5, 6]
    with pytest.raises(ValueError):
        dirs.prune(-1)
    assert not [p for p in tmp_output_dir.iterdir() if p.name.startswith(".")]


def test_latest_ignores_release_and_stale_tracker(tmp_output_dir: Path) -> None:
    dirs = CheckpointDirs(tmp_output_dir)
    (tmp_output_dir / "release").mkdir()
    (tmp_output_dir / TRACKER).write_text("release\n")  # a converted checkpoint, no training yet
    assert dirs.latest() is None
    save_step(dirs, 3)
    (tmp_output_dir / TRACKER).write_text("9\n")  # names a folder that is not there
    assert dirs.latest() == 3
