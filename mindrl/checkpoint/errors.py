"""Checkpoint errors: each names the tensor, file or flag at fault in one line.

``ConversionError`` is the base (a checkpoint cannot be converted or loaded as asked);
``CheckpointReadError(path, what)`` a checkpoint file that is missing or unreadable, and its
subclass ``CorruptCheckpointError`` one that exists but is damaged (truncated, corrupt).
"""

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


class CheckpointReadError(ConversionError):
    """A checkpoint file is missing, truncated, corrupt or holds more than plain data.

    Carries the file, so the trainer can print one line and, when asked, fall back to the
    previous complete checkpoint.
    """

    def __init__(self, path: object, what: str) -> None:
        self.path = str(path)
        self.what = what
        super().__init__(f"{self.path}: {what}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        # rebuilt from (path, what), so it survives pickling (Ray hands worker errors back)
        return type(self), (self.path, self.what)


class CorruptCheckpointError(CheckpointReadError):
    """A checkpoint file that exists but whose content is damaged: truncated, not the format
    it should be, or refused by its reader. ``path`` is the file, ``what`` what is wrong."""
