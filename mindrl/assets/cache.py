"""The assets cache folder and the atomic build every asset goes through.

A folder under :func:`assets_root` either is complete or does not exist, so concurrent test
processes (and a training run started while a test builds) can race to build the same asset.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV_ASSETS_DIR = "MINDRL_ASSETS_DIR"


def assets_root() -> Path:
    """Cache folder for built assets: ``$MINDRL_ASSETS_DIR`` or ``~/.cache/mindrl/assets``."""
    env = os.environ.get(ENV_ASSETS_DIR)
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "mindrl" / "assets"
    return root


def build_atomically(target: Path, build: Callable[[Path], object]) -> Path:
    """Build into a temp folder beside ``target`` and rename it into place.

    Rename of a directory is atomic on one file system, so readers never see a half-written
    folder. If another process won the race, its folder is kept and ours is discarded.
    What `build` returns is ignored.
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        build(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is meant to be shared
        try:
            os.replace(tmp, target)
        except OSError:
            if not target.is_dir():  # not a lost race: a real error
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_json(path: Path, obj: Any) -> None:
    """Sorted, indented, newline-terminated: the same object always gives the same bytes."""
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
