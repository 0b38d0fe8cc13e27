"""The driver's half of profiling (`StepProfiling`) against real Ray worker groups: it tells
the profiled roles' workers the steps of the window, only while profiling, collects the
captures at the end, and a group that died loses its capture without hiding anything else.
One embedded Ray cluster for the module; every wait is bounded."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from mindrl.cluster.placement import DeviceGroup, PlacementPlan, RoleLayout  # noqa: E402
from mindrl.cluster.placement_groups import (  # noqa: E402
    bundle_indices,
    cpus_per_worker,
    create_placement_groups,
    remove_placement_groups,
)
from mindrl.cluster.worker import Worker  # noqa: E402
from mindrl.cluster.worker_group import WorkerGroup  # noqa: E402
from mindrl.config import load_run_config  # noqa: E402
from mindrl.trainer.profiling_steps import StepProfiling  # noqa: E402
from mindrl.workers.profiling import ProfiledWorker, profiled  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests
TIMEOUT = 60.0
P = "+profiler_config.integrated."


class StageWorker(ProfiledWorker, Worker):
    """Makes one stage call; profiles as the run's config says."""

    def __init__(self, run) -> None:
        super().__init__()
        self.run = run

    @profiled("actor_update")
    def update(self) -> int:
        import torch

        a = torch.randn(64, 64)
        (a @ a).sum()
        return self.rank


class UnprofiledWorker(Worker):
    """A role with no stage calls and no profiling methods: calling them would fail."""

    def update(self) -> int:
        return self.rank


@pytest.fixture
def make_groups(cluster):
    """Start an `actor` group of two StageWorkers and a `reward` group of two
    UnprofiledWorkers, on one placement group, for a run with these overrides."""
    started: list[tuple[list[WorkerGroup], dict]] = []

    def make(*overrides: str, actor_cls: type | None = None) -> tuple:
        run, _ = load_run_config("grpo_tiny_cpu", list(overrides), check_paths=False)
        device = DeviceGroup(
            "g",
            (RoleLayout("actor", 2, 1, 1, 2), RoleLayout("reward", 2, 1, 1, 2)),
            2,
            {"CPU": 1.0},
            "STRICT_PACK",
        )
        pgs = create_placement_groups(PlacementPlan(resource="CPU", groups=(device,)), TIMEOUT)
        kw = dict(
            num_cpus_per_worker=cpus_per_worker(device),
            master_addr=cluster.master_addr,
            timeout_s=TIMEOUT,
        )
        pg = pgs["g"]
        cls, args = (StageWorker, (run,)) if actor_cls is None else (actor_cls, ())
        actor = WorkerGroup(cls, "actor", pg, bundle_indices(device, "actor"), init_args=args, **kw)
        reward = WorkerGroup(UnprofiledWorker, "reward", pg, bundle_indices(device, "reward"), **kw)
        started.append(([actor, reward], pgs))
        return run, actor, reward

    yield make
    for groups, pgs in started:
        for group in groups:
            group.shutdown()
        remove_placement_groups(pgs)


def _steps(profiling: StepProfiling, actor: WorkerGroup, reward: WorkerGroup, n: int) -> None:
    for step in range(1, n + 1):
        profiling.begin(step)
        assert actor.execute_all(StageWorker.update) == [0, 1]
        assert reward.execute_all(UnprofiledWorker.update) == [0, 1]


def _ranges(trace: Path) -> list[str]:
    events = json.loads(trace.read_text())["traceEvents"]
    return [e["name"] for e in events if e.get("name") == "actor_update" and e.get("ph") == "X"]


def _window(out: Path, end: int = 4) -> list[str]:
    return [
        f"{P}profile=true",
        f"{P}profile_save_path={out}",
        f"{P}profile_step_start=2",
        f"{P}profile_step_end={end}",
        f"{P}profile_ranks=[1]",
    ]


def test_the_window_of_the_listed_rank_is_one_trace(make_groups, tmp_path):
    run, actor, reward = make_groups(*_window(tmp_path))
    profiling = StepProfiling(run.profiler, [actor, reward])
    assert profiling.groups == [actor]  # the reward role makes no stage calls
    _steps(profiling, actor, reward, 5)
    out = tmp_path / "integrated"
    assert profiling.finish() == [str(out)]
    (trace,) = out.glob("actor_rank1_steps2-3.*.pt.trace.json")  # rank 0 is not listed
    assert [p.name for p in out.iterdir()] == [trace.name]
    assert _ranges(trace) == ["actor_update", "actor_update"]  # steps 2 and 3
    assert profiling.finish() == []  # once


def test_nothing_is_called_while_not_profiling(make_groups):
    # workers without the profiling methods in the actor's role: a call would raise
    run, actor, reward = make_groups(actor_cls=UnprofiledWorker)
    assert not run.profiler.profile
    profiling = StepProfiling(run.profiler, [actor, reward])
    assert profiling.groups == []
    for step in range(1, 4):
        profiling.begin(step)
        assert actor.execute_all(UnprofiledWorker.update) == [0, 1]
    assert profiling.finish() == [] and profiling.finish(failed=True) == []
    # the same workers with profiling on are called, and fail: the test would see it
    on = dataclasses.replace(run.profiler, profile=True)
    with pytest.raises(AttributeError):
        StepProfiling(on, [actor]).begin(1)


def test_a_dead_group_loses_its_capture_and_raises_nothing(make_groups, tmp_path, caplog):
    run, actor, reward = make_groups(*_window(tmp_path, end=9))
    profiling = StepProfiling(run.profiler, [actor])
    _steps(profiling, actor, reward, 3)  # a capture is running on rank 1
    os.kill(actor.execute_rank(1, Worker.pid), signal.SIGKILL)  # the worker dies
    with caplog.at_level(logging.WARNING, logger="mindrl.trainer.profiling_steps"):
        assert profiling.finish(failed=True) == []
    assert "the actor workers' captures are lost" in caplog.text
