"""Run outputs that cannot be written: a full disk or a folder that vanished, named in one line.

A write that fails deep in a library (torch's zip writer on a full disk says
``basic_ios::clear: iostream error``, a worker's failure comes back as a Ray traceback) tells
the user nothing about the disk. Every writer of a run's outputs (checkpoints, metrics.jsonl,
TensorBoard, the driver's log file) turns such a failure into a `StorageError` whose message
names the folder, its free space and, where known, what the write needed; the trainer prints
it as one line and stops, so no data is lost silently.

Only the standard library is imported here (the driver's logging set-up uses it).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

# How a full disk reads once a library has reworded ENOSPC (torch's C++ stream writer
# reports a failed write as a stream error or as a short write at an unexpected offset).
_NO_SPACE_TEXT = (
    "no space left on device",
    "disk quota exceeded",
    "iostream error",
    "unexpected pos",
)
_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class StorageError(RuntimeError):
    """A run output could not be written (no space, folder gone, I/O error); one line."""


def format_bytes(n: int | float | None) -> str:
    if n is None:
        return "unknown"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Free space (for this user) on the filesystem holding `path`, or on its nearest
    existing parent; None when nothing up the path can be asked."""
    probe = Path(path).absolute()
    for candidate in (probe, *probe.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def is_out_of_space(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from, is a full disk (ENOSPC / EDQUOT, or a
    library's rewording of it, such as a worker's traceback text)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _NO_SPACE_ERRNOS:
            return True
        text = str(current).lower()
        if any(marker in text for marker in _NO_SPACE_TEXT):
            return True
        current = current.__cause__ or current.__context__
    return False


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[-1] if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def out_of_space(
    folder: str | os.PathLike[str], what: str, needed: int | None, *, while_writing: bool = False
) -> StorageError:
    """The one-line error of `what` not fitting in `folder`: refused before writing, or
    (`while_writing`) a write that filled the disk (its free space is then what is left once
    the writer removed its partial files)."""
    free = format_bytes(free_bytes(folder))
    need = f"about {format_bytes(needed)}" if needed else None
    if while_writing:
        expected = f"; expected {need}" if need else ""
        return StorageError(
            f"no space left for {what} in {folder}: the disk filled up while writing it "
            f"({free} free now{expected})"
        )
    return StorageError(
        f"no space left for {what} in {folder}: {free} free"
        + (f"; it needs {need}" if need else "")
    )


def write_failed(
    folder: str | os.PathLike[str], what: str, exc: BaseException, needed: int | None = None
) -> StorageError:
    """A named error for a failed write of `what` into `folder`: the folder gone, out of
    space, or the OS's own reason in one line."""
    folder = Path(folder).absolute()
    missing = next((p for p in reversed((folder, *folder.parents)) if not p.exists()), None)
    if missing is not None:
        return StorageError(f"cannot write {what}: the folder {missing} vanished during the run")
    if is_out_of_space(exc):
        return out_of_space(folder, what, needed, while_writing=True)
    return StorageError(f"cannot write {what} in {folder}: {_one_line(exc)}")


def check_room(folder: str | os.PathLike[str], what: str, needed: int) -> None:
    """Refuse a write of `needed` bytes before it starts when `folder` has less free."""
    free = free_bytes(folder)
    if free is not None and free < needed:
        raise out_of_space(folder, what, needed)


def file_unlinked(fileno: int) -> bool:
    """Whether an open file was removed from its folder (writes to it would reach no file
    anyone can read: the folder was deleted or the file replaced)."""
    return os.fstat(fileno).st_nlink == 0
