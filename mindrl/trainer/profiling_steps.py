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
# after a failed step: how long the workers may take to write their captures
AFTER_FAILURE_TIMEOUT_S = 30.0


class StepProfiling:
    """Calls the worker groups of the roles that make stage calls, only while profiling."""

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
        self.told = True  # from here a capture may run on some worker, even if one fails
        refs = [(g, g.execute_all_async(ProfiledWorker.profile_step, step)) for g in self.groups]
        for group, pending in refs:
            group.gather(pending)

    def finish(self, failed: bool = False) -> list[str]:
        """Stop the captures still running; the folders traces went to. After a failed step
        (`failed`) the workers get `AFTER_FAILURE_TIMEOUT_S`, not a whole call's timeout, and
        a group that cannot answer loses its capture with a warning: the run's own error
        stays the one raised."""
        from mindrl.cluster.errors import WorkerGroupError

        if not self.told:
            return []
        self.told = False
        timeout = AFTER_FAILURE_TIMEOUT_S if failed else None
        pending = []
        for group in self.groups:
            try:
                pending.append((group, group.execute_all_async(ProfiledWorker.profile_finish)))
            except WorkerGroupError as exc:
                logger.warning("profiler: the %s workers' captures are lost: %s", group.role, exc)
        folders: set[str] = set()
        for group, refs in pending:
            try:
                for per_rank in group.gather(refs, timeout_s=timeout):
                    folders.update(per_rank)
            except WorkerGroupError as exc:
                logger.warning("profiler: the %s workers' captures are lost: %s", group.role, exc)
        if folders:
            logger.info("profiler: traces in %s", ", ".join(sorted(folders)))
        return sorted(folders)
