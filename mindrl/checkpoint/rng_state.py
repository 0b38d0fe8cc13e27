"""Python, NumPy and torch CPU generator states, captured and restored exactly.

One helper for every process that checkpoints randomness: the driver's run state and each
training rank's state. JSON-ready (no pickle), so a checkpoint's RNG part never executes.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class RngState:
    """A process's Python, NumPy (legacy global) and torch CPU generator states."""

    python: tuple[Any, ...]  # random.getstate(): (version, 625 ints, gauss_next)
    numpy: tuple[
        Any, ...
    ]  # np.random.get_state(): (name, 624 uint32 as ints, pos, has_gauss, cached)
    torch: bytes  # torch.get_rng_state() bytes

    @classmethod
    def capture(cls) -> RngState:
        version, internal, gauss_next = random.getstate()
        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        return cls(
            python=(version, tuple(internal), gauss_next),
            numpy=(str(name), tuple(int(k) for k in keys), int(pos), int(has_gauss), float(cached)),
            torch=torch.get_rng_state().numpy().tobytes(),
        )

    def restore(self) -> None:
        """Put every generator back, so the next draws repeat those after ``capture``."""
        version, internal, gauss_next = self.python
        random.setstate((version, tuple(internal), gauss_next))
        name, keys, pos, has_gauss, cached = self.numpy
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(torch.frombuffer(bytearray(self.torch), dtype=torch.uint8))

    def to_json(self) -> dict[str, Any]:
        version, internal, gauss_next = self.python
        return {
            "python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
            "numpy": dict(zip(("name", "keys", "pos", "has_gauss", "cached_gaussian"), self.numpy)),
            "torch": base64.b64encode(self.torch).decode("ascii"),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RngState:
        py, nq = data["python"], data["numpy"]
        return cls(
            python=(int(py["version"]), tuple(int(x) for x in py["state"]), py["gauss_next"]),
            numpy=(
                str(nq["name"]),
                tuple(int(k) for k in nq["keys"]),
                int(nq["pos"]),
                int(nq["has_gauss"]),
                float(nq["cached_gaussian"]),
            ),
            torch=base64.b64decode(data["torch"]),
        )
