"""Experiment trackers MindSpeed-RL configs switch on: wandb (`rl_config.use_wandb`) and
SwanLab (`rl_config.use_swanlab`), each the real library, fed by `MetricsLogger`.

Every record `MetricsLogger` writes to metrics.jsonl is logged to each open tracker under the
same names and step (null values are skipped, as for TensorBoard); the run is finished when
the logger closes, marked failed when the training loop raised.

Nothing reaches the network unless the user asks for it: wandb runs offline unless
``WANDB_MODE`` is set (mindrl sets ``WANDB_MODE=offline`` in the process environment, as wandb's
process-wide telemetry reads it; offline runs also skip wandb's system-metrics sampler, which
probes cloud metadata servers), SwanLab with ``mode=offline`` unless ``swanlab_mode`` or
``SWANLAB_MODE`` says otherwise. The run folder goes under ``wandb_save_dir`` /
``swanlab_save_dir`` (default: the run's output dir) and the command that uploads it later is
logged. As in MindSpeed-RL, a requested online wandb run that cannot start falls back to an
offline one. Unlike MindSpeed-RL, an empty project or experiment name gets a default
(``mindrl`` / the output folder's name) instead of silently turning the tracker off.

The libraries are imported here, when a tracker opens (they are slow to import and most runs
use none), so ``import mindrl`` stays cheap.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from mindrl.config.rl import LoggingConfig

logger = logging.getLogger("mindrl.trainer")

DEFAULT_PROJECT = "mindrl"
# swanlab.init modes; MindSpeed-RL's docs write `cloud` (= online) and `local`.
SWANLAB_MODES = ("offline", "local", "cloud", "online", "disabled")
_INSTALL_HINT = {
    "wandb": "pip install wandb",
    "swanlab": "pip install swanlab; it requires protobuf<7",
}


class TrackerError(RuntimeError):
    """A tracker that was asked for cannot start; one line naming the key or the library."""


class Tracker(Protocol):
    """What `MetricsLogger` needs from a tracker."""

    name: str
    run_dir: Path | None

    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def close(self, failed: bool = False) -> None: ...


@dataclass(frozen=True)
class TrackerSpec:
    """One tracker to open, with the defaults filled in."""

    library: str  # "wandb" or "swanlab"
    project: str
    name: str
    save_dir: Path
    mode: str


def tracker_specs(logging_config: LoggingConfig, output_dir: str | Path) -> list[TrackerSpec]:
    """The trackers `rl_config` turns on, with their defaults filled in."""
    output_dir = Path(output_dir)
    default_name = output_dir.resolve().name or "run"
    specs = []
    if logging_config.use_wandb:
        specs.append(
            TrackerSpec(
                "wandb",
                logging_config.wandb_project or DEFAULT_PROJECT,
                logging_config.wandb_exp_name or default_name,
                Path(logging_config.wandb_save_dir or output_dir),
                os.environ.get("WANDB_MODE") or "offline",
            )
        )
    if logging_config.use_swanlab:
        specs.append(
            TrackerSpec(
                "swanlab",
                logging_config.swanlab_project or DEFAULT_PROJECT,
                logging_config.swanlab_exp_name or default_name,
                Path(logging_config.swanlab_save_dir or output_dir),
                logging_config.swanlab_mode or os.environ.get("SWANLAB_MODE") or "offline",
            )
        )
    return specs


def tracker_problems(logging_config: LoggingConfig) -> list[str]:
    """Problems a config check can report before anything starts: a tracker whose library is
    not installed, an unknown ``swanlab_mode``."""
    problems = []
    for key, library in (("use_wandb", "wandb"), ("use_swanlab", "swanlab")):
        if getattr(logging_config, key) and importlib.util.find_spec(library) is None:
            problems.append(
                f"rl_config.{key}: true needs the {library} package, which is not installed "
                f"({_INSTALL_HINT[library]})"
            )
    mode = logging_config.swanlab_mode
    if logging_config.use_swanlab and mode and mode not in SWANLAB_MODES:
        problems.append(
            f"rl_config.swanlab_mode: {mode!r} is not one of {', '.join(SWANLAB_MODES)}"
        )
    return problems


class Trackers:
    """The open trackers of one `MetricsLogger`. A tracker that fails mid-run is warned about
    once and dropped: metrics.jsonl stays the record, the training goes on."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def log(self, step: int, values: Mapping[str, float | None]) -> None:
        finite = {k: v for k, v in values.items() if v is not None}
        for tracker in list(self.trackers):
            try:
                tracker.log(step, finite)
            except Exception as exc:
                logger.warning(
                    "%s: logging step %d failed (%s); %s is off for the rest of the run",
                    tracker.name,
                    step,
                    _one_line(exc),
                    tracker.name,
                )
                self.trackers.remove(tracker)

    def close(self, failed: bool = False) -> None:
        """Finish every run (each one even if another fails to finish)."""
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            try:
                tracker.close(failed)
            except Exception as exc:
                logger.warning("%s: finishing the run failed (%s)", tracker.name, _one_line(exc))


def open_trackers(
    logging_config: LoggingConfig,
    output_dir: str | Path,
    run_config: Mapping[str, Any] | None = None,
) -> Trackers:
    """Open every tracker the config asks for; ``TrackerError`` (already-open ones closed)
    when one cannot start. ``run_config`` is stored as the run's config."""
    problems = tracker_problems(logging_config)
    if problems:
        raise TrackerError("; ".join(problems))
    opened = Trackers([])
    try:
        for spec in tracker_specs(logging_config, output_dir):
            opener = WandbTracker if spec.library == "wandb" else SwanlabTracker
            opened.trackers.append(opener(spec, _plain(run_config)))
    except BaseException:
        opened.close(failed=True)
        raise
    return opened


def _plain(config: Any) -> dict[str, Any]:
    """The run config as plain JSON-able data (OmegaConf containers included)."""
    if config is None:
        return {}
    if hasattr(config, "_metadata"):  # an OmegaConf container
        from omegaconf import OmegaConf

        config = OmegaConf.to_container(config, resolve=True)
    return dict(config)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


class WandbTracker:
    """A wandb run of its own (``reinit="create_new"``), never the process-global one."""

    name = "wandb"

    def __init__(self, spec: TrackerSpec, run_config: dict[str, Any]) -> None:
        # In the environment, not only in init(): wandb's process-wide telemetry reads
        # WANDB_MODE, and with it unset probes W&B's servers even for an offline run.
        os.environ.setdefault("WANDB_MODE", spec.mode)
        import wandb

        self.spec = spec
        self.mode = spec.mode
        try:
            spec.save_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrackerError(f"rl_config.wandb_save_dir: {_one_line(exc)}") from None
        try:
            self.run = self._init(wandb, self.mode, run_config)
        except Exception as exc:
            if self.mode != "online":
                raise TrackerError(
                    f"wandb could not start a {self.mode} run in {spec.save_dir}: {_one_line(exc)}"
                ) from None
            logger.warning("wandb: online run failed (%s); logging offline", _one_line(exc))
            self.mode = os.environ["WANDB_MODE"] = "offline"  # as MindSpeed-RL does
            try:
                self.run = self._init(wandb, self.mode, run_config)
            except Exception as exc2:
                raise TrackerError(
                    f"wandb could not start an offline run in {spec.save_dir}: {_one_line(exc2)}"
                ) from None
        self.run_dir: Path | None = (
            Path(self.run.dir).parent if self.mode in ("offline", "online") else None
        )
        where = self.run.url if self.mode == "online" and self.run.url else self.run_dir
        logger.info(
            "wandb: %s run %r (project %r) at %s", self.mode, spec.name, spec.project, where
        )

    def _init(self, wandb: Any, mode: str, run_config: dict[str, Any]) -> Any:
        offline = mode != "online"
        settings = wandb.Settings(
            console="off",  # the console and Ray's output stay as they are
            silent=True,  # mindrl logs where the run is
            x_disable_stats=offline,  # the sampler probes cloud metadata servers
            x_disable_machine_info=offline,
            save_code=False,
        )
        return wandb.init(
            project=self.spec.project,
            name=self.spec.name,
            dir=str(self.spec.save_dir),
            mode=mode,
            config=run_config,
            reinit="create_new",
            settings=settings,
        )

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self, failed: bool = False) -> None:
        import wandb

        self.run.finish(exit_code=1 if failed else 0)
        # finish() can return before wandb-core has written the run's history; stopping the
        # service flushes it, so the folder is complete when close() returns. Only when no
        # other wandb run is active in this process.
        if wandb.run is None:
            wandb.teardown()
        if self.mode == "offline" and self.run_dir is not None:
            logger.info("wandb: offline run saved; upload it with `wandb sync %s`", self.run_dir)


class SwanlabTracker:
    """A SwanLab run (MindSpeed-RL's `swanlab_*` keys)."""

    name = "swanlab"

    def __init__(self, spec: TrackerSpec, run_config: dict[str, Any]) -> None:
        import inspect

        import swanlab

        self.spec = spec
        try:
            spec.save_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrackerError(f"rl_config.swanlab_save_dir: {_one_line(exc)}") from None
        params = inspect.signature(swanlab.init).parameters
        kwargs: dict[str, Any] = {"project": spec.project, "mode": spec.mode}
        # swanlab >= 0.10 names them log_dir / name; older releases logdir / experiment_name
        kwargs["log_dir" if "log_dir" in params else "logdir"] = str(spec.save_dir)
        kwargs["name" if "name" in params else "experiment_name"] = spec.name
        try:
            self.run = swanlab.init(config=run_config, **kwargs)
        except Exception as exc:
            raise TrackerError(
                f"swanlab could not start a {spec.mode} run in {spec.save_dir}: {_one_line(exc)}"
            ) from None
        run_dir = getattr(self.run, "dir", None) or getattr(self.run, "path", None)
        self.run_dir = Path(run_dir) if isinstance(run_dir, (str, os.PathLike)) else None
        logger.info(
            "swanlab: %s run %r (project %r) at %s",
            spec.mode,
            spec.name,
            spec.project,
            self.run_dir or spec.save_dir,
        )

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self, failed: bool = False) -> None:
        self.run.finish(state="crashed" if failed else "success")
