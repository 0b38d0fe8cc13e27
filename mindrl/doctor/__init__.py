"""`doctor`: the checks a user runs on a new machine or cluster before an RL run (versions,
Ray and its placement, devices and memory, collectives, megatron-core, the rollout engine, the
save folder, the environment), each a pass / warn / fail with what to do."""

from mindrl.doctor.report import CheckResult, DoctorReport
from mindrl.doctor.runner import ALL_CHECKS, SLOW_CHECKS, run_doctor
from mindrl.doctor.settings import DoctorSettings, default_settings, settings_from_config

__all__ = [
    "ALL_CHECKS",
    "SLOW_CHECKS",
    "CheckResult",
    "DoctorReport",
    "DoctorSettings",
    "default_settings",
    "run_doctor",
    "settings_from_config",
]
