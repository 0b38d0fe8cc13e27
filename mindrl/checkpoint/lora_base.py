"""Where an adapter-only checkpoint's base weights live (`lora_ckpt_filter`).

A step checkpoint that holds only the LoRA adapters names the folder the frozen base was
loaded from (an HF folder or a megatron checkpoint) in `lora_base.json`, so a resume, whose
`load` is the save folder, finds the base again; a resumed run passes the same name on.
"""

from __future__ import annotations

import json
from pathlib import Path

from mindrl.checkpoint.atomic import atomic_write_text
from mindrl.checkpoint.errors import CheckpointReadError

LORA_BASE_FILE = "lora_base.json"


def write_lora_base(iter_dir: str | Path, base_dir: str | None) -> None:
    if base_dir is None:
        raise ValueError("an adapter-only checkpoint needs the base's folder (actor_config.load)")
    atomic_write_text(Path(iter_dir) / LORA_BASE_FILE, json.dumps({"base": base_dir}) + "\n")


def read_lora_base(iter_dir: str | Path) -> str:
    """The base folder recorded by the saving run; it must still exist."""
    path = Path(iter_dir) / LORA_BASE_FILE
    try:
        base = json.loads(path.read_text())["base"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointReadError(
            path, f"unreadable ({exc}): an adapter-only checkpoint (lora_ckpt_filter) needs it"
        ) from exc
    if not isinstance(base, str) or not Path(base).exists():
        raise CheckpointReadError(
            path, f"the LoRA base {base!r} it names is gone; the adapters need that base"
        )
    return base
