"""The one error type of checkpoint conversion: it names the tensor, file or flag at fault."""

from __future__ import annotations


class ConversionError(ValueError):
    """A checkpoint cannot be converted or loaded as asked.

    The message names what is wrong (tensor name, file path or CLI flag) so a user can fix it
    without a traceback; `cli/convert_ckpt.py` prints it as one line.
    """


def short_reason(exc: BaseException) -> str:
    """One line for a wrapped library error (torch's checkpoint errors embed tracebacks)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[-1] if len(lines) > 1 else lines[0]
    return text if len(lines) == 1 else f"{type(exc).__name__}: {text}"


def checkpoint_errors() -> tuple[type[BaseException], ...]:
    """What a failed dist_checkpointing load/save raises (torch's CheckpointException is a
    BaseException, not an Exception)."""
    try:
        from torch.distributed.checkpoint.api import CheckpointException
    except ImportError:
        return (Exception,)
    return (Exception, CheckpointException)
