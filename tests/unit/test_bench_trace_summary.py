"""tools/bench/trace_summary.py on real traces of torch's profiler, written by mindrl's
StageProfiler: a stage call's wall time split into operators and the work between them."""

from __future__ import annotations

import time

import pytest
import torch

from mindrl.config import load_run_config
from mindrl.config.profiler import ProfilerConfig
from mindrl.workers.profiling import StageProfiler
from tools.bench import tiny_step
from tools.bench.trace_summary import describe_breakdown, folder_breakdown, stage_breakdown

STAGES = ("actor_update", "actor_compute_log_prob")
PAUSE_S = 0.05


def _capture(tmp_path, stage: tuple[str, ...] | str = "all") -> StageProfiler:
    cfg = ProfilerConfig(profile=True, profile_save_path=str(tmp_path), stage=stage)
    prof = StageProfiler(cfg, role="actor", rank=0, device="cpu", run_output_dir="unused")
    prof.set_step(1)
    return prof


def _update_call(prof: StageProfiler) -> None:
    """An update with a nested old-policy pass, and a pause between its operators."""
    a = torch.randn(128, 128)
    with prof.stage("actor_update"):
        with prof.stage("actor_update"):  # the same stage inside: one call
            a @ a
        time.sleep(PAUSE_S)  # no operator runs
        with prof.stage("actor_compute_log_prob"):
            torch.nn.functional.linear(a, a)


def test_a_stage_call_splits_into_operators_and_the_work_between(tmp_path):
    prof = _capture(tmp_path)
    _update_call(prof)
    prof.close()
    (trace,) = (tmp_path / "integrated").glob("*.pt.trace.json")
    rows = stage_breakdown(trace, STAGES)
    update, inner = rows["actor_update"], rows["actor_compute_log_prob"]
    assert update["calls"] == inner["calls"] == 1
    assert update["between_ms"] >= PAUSE_S * 1e3 * 0.99  # the pause is not an operator
    assert update["operator_ms"] > 0
    assert update["wall_ms"] == pytest.approx(
        update["operator_ms"] + update["between_ms"], abs=0.02
    )
    assert update["wall_ms"] >= inner["wall_ms"] + PAUSE_S * 1e3 * 0.99  # nested: inside it
    names = [name for name, _ in update["top"]]
    assert "aten::mm" in names or "aten::addmm" in names  # the GEMMs' own time
    # an operator's self time leaves out the operators it called: matmul calls mm
    own = dict(update["top"])
    assert own.get("aten::matmul", 0.0) < own.get("aten::mm", float("inf"))
    (line,) = [s for s in describe_breakdown(rows) if "actor_update:" in s]
    assert "between them" in line


def test_a_folder_sums_a_stages_calls_over_its_traces(tmp_path):
    prof = _capture(tmp_path, stage=STAGES)
    _update_call(prof)  # the update's capture holds the inner pass as a range
    with prof.stage("actor_compute_log_prob"):  # the pass on its own: its own capture
        torch.randn(64, 64).sum()
    rows = folder_breakdown(tmp_path, STAGES)
    assert sorted(rows) == sorted(STAGES)
    assert len(list(tmp_path.glob("*/*.pt.trace.json"))) == 2
    assert rows["actor_update"]["calls"] == 1
    # two calls of the pass: a range in the update's trace and a trace of its own, summed
    assert rows["actor_compute_log_prob"]["calls"] == 2
    alone = stage_breakdown(next((tmp_path / "actor_compute_log_prob").glob("*.json")), STAGES)
    assert alone["actor_compute_log_prob"]["calls"] == 1
    assert rows["actor_compute_log_prob"]["wall_ms"] > alone["actor_compute_log_prob"]["wall_ms"]


def test_the_profiled_lean_run_captures_its_last_step_only():
    run, _ = load_run_config(tiny_step.CONFIG, tiny_step.profiled_lean(7), check_paths=False)
    cfg = run.profiler
    assert cfg.profile and cfg.stages == tiny_step.PROFILED_STAGES
    assert [s for s in range(1, 9) if cfg.in_window(s)] == [7]
    assert run.reference_snapshot  # the lean layout underneath
