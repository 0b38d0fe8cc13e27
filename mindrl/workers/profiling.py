"""Profiles of worker calls (MindSpeed-RL's `profiler_config.integrated`), in the worker.

The driver tells each profiled worker the step it starts (`profile_step`, only while
profiling); the worker's `StageProfiler` then starts a profiler at the window's first step and
stops it after the last (`stage: all`: everything the worker does, one trace), or around each
call of a listed stage within the window (one trace per call). While a profiler runs, every
stage call is a named range in it (and an mstx range on NPU with `mstx`). torch_npu's profiler
on NPU (not run here), torch's elsewhere: a Chrome trace (`chrome://tracing`, Perfetto) per
capture under `profile_save_path/<integrated | stage>/`, named by role, rank and step. Writing
a trace happens inside the worker call that ends the capture (it counts in that call's time);
a capture that cannot be written is a warning, never the call's error.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from mindrl.config.profiler import STAGES, ProfilerConfig

if TYPE_CHECKING:
    from mindrl.config.run import RunConfig

logger = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")
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
        self._running: Any = None  # the profiler of the capture under way
        self._capture = ("", "")  # its folder and trace name
        self._names: dict[str, int] = {}  # kind/trace names used, and how often
        self._open: set[str] = set()  # the stage calls under way
        self.traces: set[str] = set()  # folders of the captures written
        self._npu = _npu_settings(cfg) if device == "npu" else {}

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
                with self._range(name):
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
    @contextlib.contextmanager
    def _range(self, name: str) -> Iterator[None]:
        import torch

        with torch.profiler.record_function(name):
            if self._npu.get("msprof_tx"):  # torch_npu's light-weight marker
                import torch_npu

                mark = torch_npu.npu.mstx.range_start(name)
                try:
                    yield
                finally:
                    torch_npu.npu.mstx.range_end(mark)
            else:
                yield

    def _start(self, kind: str, trace_name: str) -> None:
        key = os.path.join(kind, trace_name)
        used = self._names.get(key, 0)
        self._names[key] = used + 1
        if used:  # the same stage again in one step (dynamic sampling, validation)
            trace_name = f"{trace_name}_{used + 1}"
        folder = os.path.join(self.out_dir, kind)
        os.makedirs(folder, exist_ok=True)
        if self.device == "npu":
            self._running = _npu_profiler(self.cfg, self._npu, folder, trace_name)
        else:
            self._running = _torch_profiler(self.cfg, self.device, folder, trace_name)
        self._running.start()
        self._capture = (folder, trace_name)

    def _stop(self) -> None:
        running, self._running = self._running, None
        folder, trace_name = self._capture
        try:
            running.stop()  # exports the trace (on_trace_ready)
            if self.cfg.profile_analysis and self.device != "npu":
                table = running.key_averages().table(sort_by="self_cpu_time_total", row_limit=60)
                with open(os.path.join(folder, f"{trace_name}.ops.txt"), "w") as out:
                    out.write(table + "\n")
        except Exception as exc:  # a profile must never fail the call it watched
            logger.warning("profiler: capture %s not written: %s", trace_name, exc)
            return
        self.traces.add(folder)


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


def _npu_settings(cfg: ProfilerConfig) -> dict[str, Any]:
    """The keys handed to torch_npu's profiler (`msprof_tx`, `profiler_level`, ...)."""
    from mindrl.config.fates import TORCH_NPU_PROFILER, handoffs

    return handoffs(cfg, "npu").to(TORCH_NPU_PROFILER)


def _npu_profiler(cfg: ProfilerConfig, npu: dict[str, Any], folder: str, trace_name: str) -> Any:
    """torch_npu's profiler with MindSpeed-RL's settings and the keys handed to it (written for
    the NPU; not run here)."""
    import torch_npu

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
        return sorted(profiler.traces)


def profiled(stage: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A worker method that is MindSpeed-RL's `stage` call."""
    if stage not in STAGES:
        raise ValueError(f"{stage!r} is not one of MindSpeed-RL's stages {STAGES}")

    def wrap(method: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(method)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            worker: ProfiledWorker = args[0]  # type: ignore[assignment]
            with worker.stage_profiler().stage(stage):
                return method(*args, **kwargs)

        return call

    return wrap
