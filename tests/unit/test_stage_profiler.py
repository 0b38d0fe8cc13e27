"""A worker's `StageProfiler` with torch's real profiler on CPU: which steps and calls it
captures, what each Chrome trace holds, and that it records nothing unless asked."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from mindrl.config.profiler import ProfilerConfig
from mindrl.workers.profiling import StageProfiler, profiled


def _profiler(tmp_path: Path, rank: int = 0, **keys) -> StageProfiler:
    cfg = ProfilerConfig(**{"profile": True, "profile_save_path": str(tmp_path), **keys})
    return StageProfiler(cfg, role="actor", rank=rank, device="cpu", run_output_dir="unused")


def _work() -> None:
    a = torch.randn(64, 64)
    (a @ a).sum()


def _steps(prof: StageProfiler, steps: range, stages: tuple[str, ...]) -> None:
    for step in steps:
        prof.set_step(step)
        for stage in stages:
            with prof.stage(stage):
                _work()


def _traces(folder: Path) -> dict[str, list[dict]]:
    """trace file name -> its events."""
    return {
        p.name: json.loads(p.read_text())["traceEvents"]
        for p in sorted(folder.glob("*.pt.trace.json"))
    }


def _ranges(events: list[dict], names: tuple[str, ...]) -> list[str]:
    return [e["name"] for e in events if e.get("name") in names and e.get("ph") == "X"]


STAGES = ("actor_generate", "actor_update")


def test_stage_all_is_one_capture_of_the_window(tmp_path):
    prof = _profiler(tmp_path, profile_step_start=2, profile_step_end=4, profile_analysis=True)
    _steps(prof, range(1, 6), STAGES)
    traces = _traces(tmp_path / "integrated")
    assert list(traces) == [n for n in traces if n.startswith("actor_rank0_steps2-3.")]
    assert len(traces) == 1
    events = next(iter(traces.values()))
    assert _ranges(events, STAGES) == list(STAGES) * 2  # steps 2 and 3, not 1, 4 or 5
    assert any(e.get("name") == "aten::mm" for e in events)  # the operators inside them
    table = (tmp_path / "integrated" / "actor_rank0_steps2-3.ops.txt").read_text()
    assert "aten::mm" in table and "actor_update" in table
    assert prof.traces == {str(tmp_path / "integrated")}


def test_a_run_ending_inside_the_window_writes_its_capture_on_close(tmp_path):
    prof = _profiler(tmp_path, profile_step_start=2, profile_step_end=10)
    _steps(prof, range(1, 4), STAGES)
    assert not _traces(tmp_path / "integrated")  # still recording
    prof.close()
    (events,) = _traces(tmp_path / "integrated").values()
    assert _ranges(events, STAGES) == list(STAGES) * 2
    prof.close()  # nothing left to write
    assert len(_traces(tmp_path / "integrated")) == 1


def test_listed_stages_get_one_capture_per_call_in_the_window(tmp_path):
    prof = _profiler(tmp_path, stage=("actor_update",), profile_step_start=2, profile_step_end=4)
    _steps(prof, range(1, 6), STAGES)
    assert not (tmp_path / "actor_generate").exists()
    traces = _traces(tmp_path / "actor_update")
    assert sorted(n.split(".")[0] for n in traces) == ["actor_rank0_step2", "actor_rank0_step3"]
    for events in traces.values():
        assert _ranges(events, STAGES) == ["actor_update"]


def test_a_nested_call_is_neither_a_second_capture_nor_a_second_range(tmp_path):
    prof = _profiler(tmp_path, stage=("actor_generate", "actor_compute_log_prob"))
    prof.set_step(1)
    with prof.stage("actor_generate"):
        with prof.stage("actor_generate"):  # generate_in_rollout_mode -> generate
            _work()
        with prof.stage("actor_compute_log_prob"):  # a listed stage inside a capture
            _work()
    (events,) = _traces(tmp_path / "actor_generate").values()
    names = ("actor_generate", "actor_compute_log_prob")
    assert _ranges(events, names) == ["actor_generate", "actor_compute_log_prob"]
    assert not (tmp_path / "actor_compute_log_prob").exists()


def test_nothing_is_recorded_unless_asked(tmp_path):
    off = StageProfiler(
        ProfilerConfig(profile_save_path=str(tmp_path)),
        role="actor",
        rank=0,
        device="cpu",
        run_output_dir="unused",
    )
    other_rank = _profiler(tmp_path, rank=1, profile_ranks=(0,))
    for prof in (off, other_rank):
        assert not prof.enabled
        _steps(prof, range(1, 4), STAGES)
        prof.close()
    assert list(tmp_path.iterdir()) == []


def test_the_default_folder_is_in_the_runs_output_dir(tmp_path):
    cfg = ProfilerConfig(profile=True)
    prof = StageProfiler(cfg, role="ref", rank=3, device="cpu", run_output_dir=str(tmp_path))
    _steps(prof, range(1, 3), ("reference_compute_log_prob",))
    (name,) = _traces(tmp_path / "profiler_data" / "integrated")
    assert name.startswith("ref_rank3_steps1-1.")


def test_a_call_that_raises_still_writes_its_capture_and_keeps_its_error(tmp_path):
    prof = _profiler(tmp_path, stage=("actor_update",))
    prof.set_step(1)
    with pytest.raises(ValueError, match="bad batch"):
        with prof.stage("actor_update"):
            _work()
            raise ValueError("bad batch")
    (events,) = _traces(tmp_path / "actor_update").values()
    assert _ranges(events, STAGES) == ["actor_update"]
    with prof.stage("actor_update"):  # the next call is captured again, not taken as nested
        _work()
    assert len(_traces(tmp_path / "actor_update")) == 2


def test_the_same_stage_twice_in_a_step_gets_two_names(tmp_path):
    prof = _profiler(tmp_path, stage=STAGES, profile_analysis=True)
    prof.set_step(1)
    for _ in range(2):  # dynamic sampling's second batch, say
        with prof.stage("actor_generate"):
            _work()
    with prof.stage("actor_update"):  # another stage's first call keeps the plain name
        _work()
    (update,) = _traces(tmp_path / "actor_update")
    assert update.startswith("actor_rank0_step1.")
    folder = tmp_path / "actor_generate"
    assert sorted(n.split(".")[0] for n in _traces(folder)) == [
        "actor_rank0_step1",
        "actor_rank0_step1_2",
    ]
    assert sorted(p.name for p in folder.glob("*.ops.txt")) == [
        "actor_rank0_step1.ops.txt",
        "actor_rank0_step1_2.ops.txt",
    ]


def test_a_capture_that_cannot_be_written_is_a_warning(tmp_path, caplog):
    prof = _profiler(tmp_path, stage=("actor_update",), profile_analysis=True)
    prof.set_step(1)
    with caplog.at_level(logging.WARNING, logger="mindrl.workers.profiling"):
        with prof.stage("actor_update"):
            _work()
            (tmp_path / "actor_update").rmdir()
            (tmp_path / "actor_update").write_text("a file where the folder was")
    assert "capture actor_rank0_step1 not written" in caplog.text
    assert prof.traces == set()


def test_a_stage_name_must_be_mindspeed_rls():
    with pytest.raises(ValueError, match="not one of MindSpeed-RL's stages"):
        profiled("actor_updates")
