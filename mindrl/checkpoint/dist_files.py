"""A dist_checkpointing folder's files, checked before anything loads from it: a missing or
damaged file is one error naming it (`CheckpointReadError` / `CorruptCheckpointError`)
instead of the loader's traceback, and the pickled parts are plain data before torch reads
them.
"""

from __future__ import annotations

import json
from pathlib import Path

from mindrl.checkpoint.errors import CheckpointReadError, CorruptCheckpointError, short_reason
from mindrl.checkpoint.safe_load import COMMON_FILE, check_dcp_folder

DIST_CONFIG_FILE = "metadata.json"  # dist_checkpointing's backend record
DIST_METADATA_FILE = ".metadata"  # torch_dist: every tensor's file, offset and length


def check_dist_checkpoint_files(iter_dir: str | Path) -> None:
    """Check a dist_checkpointing folder's files before loading from it.

    Raises ``CheckpointReadError`` for a missing file and ``CorruptCheckpointError`` for a
    damaged one (invalid metadata.json, unreadable .metadata or common.pt, a shard shorter
    than its index says), each naming the file, instead of the loader's traceback.
    """
    iter_dir = Path(iter_dir)
    config_file = iter_dir / DIST_CONFIG_FILE
    if not config_file.is_file():
        raise CheckpointReadError(config_file, "missing: not a dist_checkpointing folder")
    try:
        config = json.loads(config_file.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptCheckpointError(config_file, f"not valid JSON ({exc})") from exc
    if not isinstance(config, dict) or "sharded_backend" not in config:
        raise CorruptCheckpointError(config_file, "has no 'sharded_backend' entry")
    _check_common_file(iter_dir / COMMON_FILE)
    torch_dist = config["sharded_backend"] == "torch_dist"
    index = iter_dir / DIST_METADATA_FILE
    if torch_dist and not index.is_file():
        raise CheckpointReadError(index, "missing (the index of the tensor shards)")
    try:  # .metadata through an allow-list unpickler first: a crafted file runs no code
        check_dcp_folder(iter_dir)
    except CheckpointReadError as exc:
        raise CorruptCheckpointError(exc.path, exc.what) from exc
    if torch_dist:
        _check_torch_dist_files(iter_dir)


def _check_common_file(path: Path) -> None:
    import pickle

    import torch

    if not path.is_file():
        raise CheckpointReadError(path, "missing (the non-sharded part of the checkpoint)")
    try:
        torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CorruptCheckpointError(
            path, f"refused: not plain data ({short_reason(exc)})"
        ) from exc
    except (RuntimeError, EOFError, ValueError, OSError) as exc:
        first = short_reason(exc).split(". ")[0]  # torch's zip errors run on for lines
        raise CorruptCheckpointError(path, f"unreadable ({first})") from exc


def _check_torch_dist_files(iter_dir: Path) -> None:
    """Every shard file .metadata lists exists and is at least as long as its index says
    (.metadata has passed ``check_dcp_folder``'s allow-list, so torch's reader may load it)."""
    from torch.distributed.checkpoint import FileSystemReader

    index = iter_dir / DIST_METADATA_FILE
    try:
        metadata = FileSystemReader(str(iter_dir)).read_metadata()
        needed: dict[str, int] = {}
        for item in metadata.storage_data.values():
            end = int(item.offset) + int(item.length)
            needed[item.relative_path] = max(needed.get(item.relative_path, 0), end)
    except Exception as exc:  # a pickle of torch's metadata classes: many ways to be broken
        raise CorruptCheckpointError(index, f"unreadable ({short_reason(exc)})") from exc
    for name, size in sorted(needed.items()):
        shard = iter_dir / name
        if not shard.is_file():
            raise CheckpointReadError(shard, f"missing (listed in {DIST_METADATA_FILE})")
        actual = shard.stat().st_size
        if actual < size:
            raise CorruptCheckpointError(
                shard, f"truncated: {actual} bytes, but {DIST_METADATA_FILE} needs {size}"
            )
