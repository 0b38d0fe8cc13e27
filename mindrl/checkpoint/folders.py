"""What kind of checkpoint folder a path is (decides online HF conversion vs megatron load)."""

from __future__ import annotations

from pathlib import Path


def is_hf_folder(path: str | Path) -> bool:
    """An HF model folder: a config.json beside safetensors weights."""
    path = Path(path)
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))
