"""Where the shipped config tree lives (a leaf module: compose, resolvers and the package
import it without importing each other)."""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
