"""Output folders checked before anything starts: would creating or writing one certainly fail?

Only local, certain failures are reported (the path or one of its parents is a regular file or
a broken symlink, or the folder that would hold it has no write permission); a path that could
still work is left to the run.
"""

from __future__ import annotations

import os
from pathlib import Path


def _writable_dir(path: Path) -> bool:
    return os.access(path, os.W_OK | os.X_OK)


def unwritable_reason(path: str | os.PathLike[str]) -> str | None:
    """Why the folder ``path`` cannot be created or written here, or None when it can.

    The message names the path at fault (``path`` itself or the parent that blocks it).
    """
    target = Path(path).expanduser().absolute()
    if target.exists():
        if not target.is_dir():
            return f"{target} exists and is not a folder"
        if not _writable_dir(target):
            return f"{target} is not writable (permission denied)"
        return None
    if os.path.lexists(target):
        return f"{target} is a broken symlink"
    parent = target.parent
    while not parent.exists():
        if os.path.lexists(parent):
            return f"cannot create {target}: {parent} is a broken symlink"
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot create {target}: {parent} is a file, not a folder"
    if not _writable_dir(parent):
        return f"cannot create {target}: {parent} is not writable (permission denied)"
    return None
