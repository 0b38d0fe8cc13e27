"""MindSpeed-RL's `profiler_config.integrated`: which worker calls of which steps to profile.

MindSpeed-RL starts torch_npu's profiler around a worker's stage calls; mindrl does the same
with torch_npu's profiler on NPU and torch's (`torch.profiler`, a Chrome trace per capture)
elsewhere (`workers/profiling.py`). Steps count from 1 in each run process, as MindSpeed-RL's
`prof_iteration` does (after a resume too); `profile_step_end` is exclusive.
"""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.fates import TORCH_NPU_PROFILER, handed
from mindrl.config.fields import spec

ALL_STAGES = "all"
# MindSpeed-RL's stage names (its worker calls), and the mindrl calls they name
STAGES = (
    "actor_generate",
    "actor_compute_log_prob",
    "reference_compute_log_prob",
    "actor_update",
    "critic_compute_values",
    "critic_update",
)


@dataclass(frozen=True)
class ProfilerConfig:
    """One profiler per capture: the whole worker over the step range (`stage: all`), or one
    trace per call of each listed stage within it."""

    profile: bool = spec(False, help="the switch: nothing is recorded without it")
    mstx: bool = spec(
        False,
        fate=handed(TORCH_NPU_PROFILER, name="msprof_tx"),
        help="NPU's light-weight markers: each stage call an mstx range too (every trace "
        "has the stage calls as named ranges of torch's profiler)",
    )
    stage: str | tuple[str, ...] = spec(
        ALL_STAGES, help=f"{ALL_STAGES}, or one or a list of: {', '.join(STAGES)}"
    )
    profile_save_path: str = spec(
        "", help="where traces go ('': OUTPUT_DIR/profiler_data); one folder per capture kind"
    )
    profile_export_type: str = spec(
        "text",
        choices=("text", "db"),
        fate=handed(TORCH_NPU_PROFILER, name="export_type"),
        help="torch.profiler writes a Chrome trace (JSON) off the NPU",
    )
    profile_step_start: int = spec(1, ge=1)
    profile_step_end: int = spec(2, ge=1, help="exclusive")
    profile_level: str = spec(
        "level0",
        choices=("level_none", "level0", "level1", "level2"),
        fate=handed(TORCH_NPU_PROFILER, name="profiler_level"),
    )
    profile_with_memory: bool = False
    profile_record_shapes: bool = False
    profile_with_cpu: bool = spec(True, help="the host's operators")
    profile_with_npu: bool = spec(
        True, fate=handed(TORCH_NPU_PROFILER, name="npu_activity"), help="the NPU's operators"
    )
    profile_with_module: bool = spec(False, help="Python call stacks of the operators")
    profile_analysis: bool = spec(
        False,
        fate=handed(
            TORCH_NPU_PROFILER,
            name="analyse_flag",
            elsewhere="an operator table (<trace name>.ops.txt) beside each Chrome trace",
        ),
    )
    profile_ranks: str | tuple[int, ...] = spec(
        "all",
        help="all, or a list of ranks within each role's worker group (MindSpeed-RL's "
        "global ranks where the integrated worker holds every role)",
    )

    def __post_init__(self) -> None:
        """Checked only when profiling (MindSpeed-RL reads none of it otherwise)."""
        if not self.profile:
            return
        stages = self.stages
        unknown = [s for s in stages or () if s not in STAGES]
        if unknown:
            raise ValueError(
                f"stage: {unknown} not among {ALL_STAGES!r} and "
                f"{list(STAGES)} (mindrl has no multimodal stages)"
            )
        if isinstance(self.stage, tuple) and not self.stage:
            raise ValueError("stage: an empty list profiles nothing")
        if self.profile_step_end <= self.profile_step_start:
            raise ValueError(
                f"profile_step_end ({self.profile_step_end}) must "
                f"exceed profile_step_start ({self.profile_step_start}); the end is exclusive"
            )
        if isinstance(self.profile_ranks, str) and self.profile_ranks != "all":
            raise ValueError(f"profile_ranks: {self.profile_ranks!r}: 'all' or a list of ranks")

    @property
    def stages(self) -> tuple[str, ...] | None:
        """The stages profiled one call at a time; None for `stage: all`."""
        if self.stage == ALL_STAGES:
            return None
        return (self.stage,) if isinstance(self.stage, str) else self.stage

    def profiles_rank(self, rank: int) -> bool:
        """Whether the worker of this rank (in its role's group) records."""
        return self.profile_ranks == "all" or rank in self.profile_ranks

    def in_window(self, step: int) -> bool:
        """Whether the process's `step` (from 1) is one of the profiled steps."""
        return self.profile_step_start <= step < self.profile_step_end


def profiler_problems(cfg: ProfilerConfig, backend: str) -> list[str]:
    """What the device cannot record: off the NPU a profile without the host's operators
    would hold nothing on CPU (a GPU still has CUDA's)."""
    if cfg.profile and backend == "cpu" and not cfg.profile_with_cpu:
        return [
            "profiler_config.integrated.profile_with_cpu: false is refused on cpu: the host's "
            "operators are all a CPU run has to record"
        ]
    return []


def profiler_warnings(
    cfg: ProfilerConfig, *, steps: int, reference: bool, critic: bool, generating_workers: bool
) -> list[str]:
    """Captures this run cannot make: listed stages no worker of it calls, a window past
    its `steps`."""
    if not cfg.profile:
        return []
    calls = {
        "reference_compute_log_prob": (reference, "there is no reference model"),
        "critic_compute_values": (critic, "there is no critic"),
        "critic_update": (critic, "there is no critic"),
        "actor_generate": (generating_workers, "vLLM servers the run does not start generate"),
    }
    out = []
    for stage in cfg.stages or ():
        made, why = calls.get(stage, (True, ""))
        if not made:
            out.append(f"profiler_config.integrated.stage: {stage} records nothing: {why}")
    if cfg.profile_step_start > steps:
        out.append(
            f"profiler_config.integrated.profile_step_start: {cfg.profile_step_start} is past "
            f"this run's {steps} steps: nothing is recorded"
        )
    return out
