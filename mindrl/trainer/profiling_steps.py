"""The driver's half of profiling (`profiler_config.integrated`): tell the profiled workers
the step that starts while a capture may open or run, and close what still runs when the
loop ends. Nothing is called while `profile` is off."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from mindrl.workers.profiling import PROFILED_ROLES, ProfiledWorker

if TYPE_CHECKING:
    from mindrl.cluster.worker_group import WorkerGroup
    from mindrl.config.profiler import ProfilerConfig

logger = logging.getLogger(__name__)


class StepProfiling:
    def __init__(self, cfg: ProfilerConfig, groups: list[WorkerGroup]) -> None:
        self.cfg = cfg
        self.groups = [g for g in groups if g.role in PROFILED_ROLES] if cfg.profile else []
        self.told = False

    def begin(self, step: int) -> None:
        """`step`: this process's step, from 1 (MindSpeed-RL's `prof_iteration`); the end
        step is told too, so that a capture of the whole window stops."""
        cfg = self.cfg
        if not self.groups or not cfg.profile_step_start <= step <= cfg.profile_step_end:
            return
        refs = [(g, g.execute_all_async(ProfiledWorker.profile_step, step)) for g in self.groups]
        for group, pending in refs:
            group.gather(pending)
        self.told = True

    def finish(self) -> list[str]:
        """Stop the captures still running; the folders traces went to. Runs however the
        loop ended: a group that cannot answer (it failed) loses its capture, with a warning,
        and the loop's own error stays the one raised."""
        if not self.told:
            return []
        self.told = False
        folders: set[str] = set()
        for group in self.groups:
            try:
                for per_rank in group.execute_all(ProfiledWorker.profile_finish):
                    folders.update(per_rank)
            except Exception as exc:  # a profile must not hide the run's own error
                logger.warning("profiler: the %s workers' captures are lost: %s", group.role, exc)
        if folders:
            logger.info("profiler: traces in %s", ", ".join(sorted(folders)))
        return sorted(folders)
