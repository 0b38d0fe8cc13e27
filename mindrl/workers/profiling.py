"""Profiles of worker calls (MindSpeed-RL's `profiler_config.integrated`), in the worker.

The driver tells each profiled worker the step it starts (`profile_step`, only while
profiling); the worker's `StageProfiler` then starts a profiler at the window's first step and
stops it after the last (`stage: all`: everything the worker does, one trace), or around each
call of a listed stage within the window (one trace per call). While a profiler runs, every
stage call is a named range in it. torch_npu's profiler on NPU (not run here), torch's
elsewhere: a Chrome trace (`chrome://tracing`, Perfetto) per capture under
`profile_save_path/<integrated | stage>/`, named by role, rank and step.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from mindrl.config.profiler import ProfilerConfig

if TYPE_CHECKING:
    from mindrl.config.run import RunConfig

F = TypeVar("F", bound=Callable[..., Any])
# the roles whose workers make the stage calls (a reward model makes none)
PROFILED_ROLES = ("actor", "ref", "rollout", "critic")


class StageProfiler:
    """One worker process's captures; a no-op unless `profile` is on and its rank is listed."""

    def __init__(
        self, cfg: ProfilerConfig, *, role: str, rank: int, device: str, run_output_dir: str
    ) -> None:
        self.cfg = cfg
        self.enabled = cfg.profile and cfg.profiles_rank(rank)
        self.name = f"{role}_rank{rank}"
        self.device = device
        self.out_dir = cfg.profile_save_path or os.path.join(run_output_dir, "profiler_data")
        self.step = 0  # the run process's step (from 1), as the driver last said
        self._running: Any = None
        self._trace_name = ""
        self._open: set[str] = set()  # the stage calls under way
        self.traces: list[str] = []  # folders of the captures written

    def set_step(self, step: int) -> None:
        """`stage: all` starts when the window opens and stops when it closes."""
        self.step = step
        if not self.enabled or self.cfg.stages is not None:
            return
        inside = self.cfg.in_window(step)
        if inside and self._running is None:
            last = self.cfg.profile_step_end - 1
            self._start("integrated", f"{self.name}_steps{self.cfg.profile_step_start}-{last}")
        elif not inside and self._running is not None:
            self._stop()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Around one stage call: its own capture if it is listed for this step, and a named
        range in whatever capture runs."""
        if not self.enabled or name in self._open:  # a call of the same stage inside it
            yield
            return
        stages = self.cfg.stages
        own = (
            self._running is None
            and stages is not None
            and name in stages
            and self.cfg.in_window(self.step)
        )
        if own:
            self._start(name, f"{self.name}_step{self.step}")
        self._open.add(name)
        try:
            if self._running is None:
                yield
            else:
                import torch

                with torch.profiler.record_function(name):
                    yield
        finally:
            self._open.discard(name)
            if own:
                self._stop()

    def close(self) -> None:
        """Write a capture still running (the run ended inside the window)."""
        if self._running is not None:
            self._stop()

    # -- the profiler of this device ----------------------------------------------------------
    def _start(self, kind: str, trace_name: str) -> None:
        folder = os.path.join(self.out_dir, kind)
        os.makedirs(folder, exist_ok=True)
        if self.device == "npu":
            self._running = _npu_profiler(self.cfg, folder, trace_name)
        else:
            self._running = _torch_profiler(self.cfg, self.device, folder, trace_name)
        self._running.start()
        self._trace_name = trace_name
        self.traces.append(folder)

    def _stop(self) -> None:
        running, self._running = self._running, None
        running.stop()  # exports the trace (on_trace_ready)
        if self.cfg.profile_analysis and self.device != "npu":
            table = running.key_averages().table(sort_by="self_cpu_time_total", row_limit=60)
            path = os.path.join(self.traces[-1], f"{self._trace_name}.ops.txt")
            with open(path, "w") as out:
                out.write(table + "\n")


def _torch_profiler(cfg: ProfilerConfig, device: str, folder: str, trace_name: str) -> Any:
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU] if cfg.profile_with_cpu else []
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(
        activities=activities,
        record_shapes=cfg.profile_record_shapes,
        profile_memory=cfg.profile_with_memory,
        with_stack=cfg.profile_with_module,
        on_trace_ready=torch.profiler.tensorboard_trace_handler(folder, worker_name=trace_name),
    )


def _npu_profiler(cfg: ProfilerConfig, folder: str, trace_name: str) -> Any:
    """torch_npu's profiler with MindSpeed-RL's settings and the keys handed to it (written for
    the NPU; not run here)."""
    import torch_npu

    from mindrl.config.fates import TORCH_NPU_PROFILER, handoffs

    npu = handoffs(cfg, "npu").to(TORCH_NPU_PROFILER)
    prof = torch_npu.profiler
    levels = {
        "level_none": prof.ProfilerLevel.Level_none,
        "level0": prof.ProfilerLevel.Level0,
        "level1": prof.ProfilerLevel.Level1,
        "level2": prof.ProfilerLevel.Level2,
    }
    export = prof.ExportType.Db if npu["export_type"] == "db" else prof.ExportType.Text
    activities = [prof.ProfilerActivity.NPU] if npu["npu_activity"] else []
    if cfg.profile_with_cpu:
        activities.append(prof.ProfilerActivity.CPU)
    return prof.profile(
        activities=activities,
        with_modules=cfg.profile_with_module,
        record_shapes=cfg.profile_record_shapes,
        profile_memory=cfg.profile_with_memory,
        on_trace_ready=prof.tensorboard_trace_handler(
            folder, worker_name=trace_name, analyse_flag=npu["analyse_flag"]
        ),
        experimental_config=prof._ExperimentalConfig(
            aic_metrics=prof.AiCMetrics.PipeUtilization,
            profiler_level=levels[npu["profiler_level"]],
            export_type=export,
            data_simplification=True,
            msprof_tx=npu["msprof_tx"],
        ),
    )


class ProfiledWorker:
    """Mixed into the workers that make stage calls; the driver calls `profile_step` and
    `profile_finish` only while profiling."""

    run: RunConfig
    role: str
    rank: int
    _stage_profiler: StageProfiler | None = None

    def stage_profiler(self) -> StageProfiler:
        if self._stage_profiler is None:
            from mindrl.accelerator import get_accelerator

            self._stage_profiler = StageProfiler(
                self.run.profiler,
                role=self.role,
                rank=self.rank,
                device=get_accelerator(self.run.runtime.accelerator).name,
                run_output_dir=self.run.output_dir,
            )
        return self._stage_profiler

    def profile_step(self, step: int) -> None:
        self.stage_profiler().set_step(step)

    def profile_finish(self) -> list[str]:
        """Stop a capture still running; the folders this worker wrote traces to."""
        profiler = self.stage_profiler()
        profiler.close()
        return sorted(set(profiler.traces))


def profiled(stage: str) -> Callable[[F], F]:
    """A worker method that is MindSpeed-RL's `stage` call."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def call(self: ProfiledWorker, *args: Any, **kwargs: Any) -> Any:
            with self.stage_profiler().stage(stage):
                return method(self, *args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap
