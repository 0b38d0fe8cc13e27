"""What the checks measure against: a run config's placement, TP, memory plan and save folder
(`--config-name`), or defaults for a machine no config has been written for yet."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mindrl.accelerator import Accelerator
from mindrl.config.run import RunConfig, RuntimeConfig

DEFAULT_TP = 2  # two ranks: the tensor-parallel all-reduces run, not only a one-rank model


@dataclass(frozen=True)
class DoctorSettings:
    """The plan the checks hold the machine to.

    `run` None: defaults (TP `DEFAULT_TP` where the devices allow, one device per role, a
    save folder under the system's temporary folder). `device_bytes` / `host_bytes`: the
    memory plan's peak per device and over the host's worker processes (None: no plan).
    """

    accelerator: Accelerator
    planned_from: str
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    run: RunConfig | None = None
    tp: int = 1
    save_dir: Path = Path(tempfile.gettempdir()) / "mindrl-doctor"
    rollout_backend: str = "auto"
    device_bytes: float | None = None
    host_bytes: float | None = None


def default_settings(accelerator: Accelerator) -> DoctorSettings:
    """Defaults: TP 2 on CPU (gloo ranks), on a device node as many as it has, up to 2."""
    tp = DEFAULT_TP if accelerator.is_cpu else max(1, min(DEFAULT_TP, accelerator.device_count()))
    return DoctorSettings(accelerator, "defaults (no --config-name)", tp=tp)


def settings_from_config(run: RunConfig, accelerator: Accelerator) -> DoctorSettings:
    """The config's actor TP, its rollout backend, its save folder (else its output folder)
    and its memory plan for this accelerator."""
    from mindrl.planning import plan_memory

    memory = plan_memory(run, accelerator.name).core
    device_peak = max((p.total for p in memory.peaks), default=0.0)
    save = run.actor.ckpt.save or str(Path(run.output_dir) / "doctor")
    return DoctorSettings(
        accelerator,
        f"config {run.config_name}",
        runtime=run.runtime,
        run=run,
        tp=run.actor.tp,
        save_dir=Path(save),
        rollout_backend=run.generate.rollout_backend,
        device_bytes=None if accelerator.is_cpu else device_peak,
        host_bytes=memory.host_total if accelerator.is_cpu else None,
    )
