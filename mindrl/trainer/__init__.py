"""The GRPO loop, its batch, metrics sinks and checkpoint save/resume."""

from __future__ import annotations

from typing import Any


def run_grpo(run: Any, raw: dict[str, Any]) -> int:
    """Run GRPO training for a validated config; returns the process exit code."""
    try:
        from mindrl.trainer.grpo import train
    except ModuleNotFoundError as exc:
        if exc.name != "mindrl.trainer.grpo":
            raise
        import sys

        print(
            "error: the GRPO trainer (mindrl/trainer/grpo.py) is not part of this build yet; "
            "use --dry-run to check a config",
            file=sys.stderr,
        )
        return 3
    return train(run, raw)
