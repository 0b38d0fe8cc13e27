"""The GRPO loop, its setup, metrics sinks and checkpoint save/resume; offline DPO's loop.

`run_grpo(run, raw) -> int` (the loop in `grpo.py`) and `run_dpo` (`dpo.py`) are re-exported on first use rather than
at import, so `trainer.entry` -- which `--dry-run` runs -- does not import torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["run_dpo", "run_grpo"]


def __getattr__(name: str) -> Any:
    if name == "run_grpo":
        from mindrl.trainer.grpo import train

        return train
    if name == "run_dpo":
        from mindrl.trainer.dpo import train_dpo

        return train_dpo
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
