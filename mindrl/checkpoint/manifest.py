"""A checkpoint folder's list of files and their sizes, written last before the commit.

Lets a resume notice a truncated or missing file before any worker starts loading (one
line naming the file), instead of a library traceback deep inside a collective load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mindrl.checkpoint.errors import CheckpointReadError

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1


def write_manifest(folder: str | Path) -> Path:
    """Record every file under `folder` (relative path -> bytes), fsynced."""
    root = Path(folder)
    files = {
        str(p.relative_to(root)): p.stat().st_size
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST_FILE
    }
    path = root / MANIFEST_FILE
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"format": MANIFEST_FORMAT, "files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    return path


def verify_manifest(folder: str | Path) -> None:
    """Raise `CheckpointReadError` for the first missing or resized file. Folders written
    before manifests existed pass (nothing to check against)."""
    root = Path(folder)
    path = root / MANIFEST_FILE
    if not path.is_file():
        return
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        files = {str(k): int(v) for k, v in data["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointReadError(path, f"unreadable manifest ({exc})") from exc
    for name, size in files.items():
        target = root / name
        if not target.is_file():
            raise CheckpointReadError(target, "missing (the checkpoint's manifest lists it)")
        actual = target.stat().st_size
        if actual != size:
            raise CheckpointReadError(
                target, f"{actual} bytes where {size} were written: truncated or replaced"
            )
