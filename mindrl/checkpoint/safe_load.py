"""Refuse a megatron (dist_checkpointing) folder whose pickled parts would run code.

torch's distributed checkpoint reads the folder's `.metadata` with plain `pickle.load`, and
megatron reads `common.pt` with `torch.load`: a crafted folder could execute on load. Before
handing a folder to dist_checkpointing we parse both ourselves: `.metadata` with an
unpickler that resolves only the plain record types torch's checkpoint metadata is made of
(an allow-list), `common.pt` with `torch.load(weights_only=True)`. Anything else is a
`CheckpointReadError` naming the file and the type it tried to load.
"""

from __future__ import annotations

import enum
import pickle
from pathlib import Path
from typing import Any

from mindrl.checkpoint.errors import CheckpointReadError

DCP_METADATA_FILE = ".metadata"
COMMON_FILE = "common.pt"

# modules whose dataclasses / enums torch's checkpoint metadata pickles
_RECORD_MODULES = frozenset(
    {
        "torch.distributed.checkpoint.metadata",
        "torch.distributed.checkpoint.planner",
        "torch.distributed.checkpoint.filesystem",
    }
)
_FUNCTIONS = frozenset(
    {
        ("torch.serialization", "_get_layout"),
        ("torch", "Size"),
        ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id of a plain torch DCP save
        ("pathlib", "PurePosixPath"),
    }
)


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _FUNCTIONS:
            return super().find_class(module, name)
        if module == "torch":
            import torch

            value = getattr(torch, name, None)
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        if module in _RECORD_MODULES:
            value = super().find_class(module, name)
            is_record = isinstance(value, type) and (
                issubclass(value, enum.Enum) or hasattr(value, "__dataclass_fields__")
            )
            if is_record or name == "_MEM_FORMAT_ENCODING":
                return value
        raise pickle.UnpicklingError(f"{module}.{name} is not a checkpoint metadata type")


def check_dcp_folder(folder: str | Path) -> None:
    """Raise `CheckpointReadError` unless the folder's pickled files hold plain data only."""
    import torch

    root = Path(folder)
    meta = root / DCP_METADATA_FILE
    if meta.is_file():
        try:
            with open(meta, "rb") as fh:
                _MetadataUnpickler(fh).load()
        except pickle.UnpicklingError as exc:
            raise CheckpointReadError(meta, f"refused: {exc}") from exc
        except (EOFError, ValueError, TypeError, AttributeError, ImportError) as exc:
            raise CheckpointReadError(meta, f"unreadable ({type(exc).__name__}: {exc})") from exc
    common = root / COMMON_FILE
    if common.is_file():
        try:
            torch.load(common, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CheckpointReadError(
                common, f"refused: holds more than plain data ({first})"
            ) from exc
        except (RuntimeError, EOFError, ValueError, OSError) as exc:
            raise CheckpointReadError(common, f"unreadable ({type(exc).__name__}: {exc})") from exc
