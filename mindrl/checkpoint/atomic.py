"""Atomic folder and file writes: a checkpoint appears complete or not at all.

Everything is written into a temporary sibling of the target (same filesystem, so the final
`os.replace` is a rename), fsynced, then renamed into place; on any error the temporary
folder is removed and the target is untouched.

A checkpoint folder's manifest (its files and their sizes, written last before the commit)
lets a resume notice a truncated or missing file before any worker starts loading (one line
naming the file), instead of a library traceback deep inside a collective load.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from mindrl.checkpoint.errors import CheckpointReadError, ConversionError

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1


def temp_sibling(target: Path, tag: str = "tmp") -> Path:
    """A deterministic hidden sibling name (the same on every rank of a collective save)."""
    return target.parent / f".{target.name}.{tag}"


def fsync_tree(root: Path) -> None:
    """fsync every file and folder under root (data first, then the directory entries)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_new_target(target: Path, flag: str = "--save-dir") -> None:
    if target.exists():
        raise ConversionError(
            f"{flag} {target} already exists; choose a new folder or remove it first"
        )


def prepare_temp(target: Path, tag: str = "tmp") -> Path:
    """Create an empty temporary sibling (removing a stale one from a crashed run)."""
    temp = temp_sibling(target, tag)
    if temp.exists():
        shutil.rmtree(temp)
    temp.mkdir(parents=True)
    return temp


def commit_temp(temp: Path, target: Path, *, overwrite: bool = False) -> None:
    """fsync the temporary folder and rename it onto target (atomically)."""
    fsync_tree(temp)
    backup = None
    if target.exists():
        if not overwrite:
            raise ConversionError(f"{target} already exists")
        backup = temp_sibling(target, "old")
        if backup.exists():
            shutil.rmtree(backup)
        os.replace(target, backup)
    os.replace(temp, target)
    fsync_dir(target.parent)
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)


@contextlib.contextmanager
def atomic_directory(
    target: str | Path, *, overwrite: bool = False, flag: str = "--save-dir"
) -> Iterator[Path]:
    """Yield a temporary folder; on success it becomes `target`, on error it is removed."""
    target = Path(target).absolute()
    if not overwrite:
        check_new_target(target, flag)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = prepare_temp(target)
    try:
        yield temp
        commit_temp(temp, target, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a small file via temp + fsync + rename (the iteration tracker)."""
    path = Path(path)
    temp = path.parent / f".{path.name}.tmp"
    with open(temp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(temp, path)
    fsync_dir(path.parent)


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
