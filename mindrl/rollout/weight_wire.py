"""Named tensors over a byte pipe: one bucket travels as a single flat uint8 buffer, and a
`BucketLayout` (names, dtypes, shapes) lets the receiver cut it back.

Bytes, not typed tensors, so every dtype (bf16 included) goes through one gloo broadcast
per bucket whatever the transport supports; both ends import this module, so the layout is
one contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 16  # bytes; a tensor's bytes start at a multiple (views of any dtype need alignment)


@dataclass(frozen=True)
class BucketLayout:
    """What a receiver needs to turn a bucket's bytes back into named tensors."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"bucket layout lists differ in length: {len(self.names)} names, "
                f"{len(self.dtype_names)} dtypes, {len(self.shapes)} shapes"
            )

    @classmethod
    def of(cls, named: Sequence[tuple[str, torch.Tensor]]) -> BucketLayout:
        return cls(
            names=[name for name, _ in named],
            dtype_names=[str(t.dtype).removeprefix("torch.") for _, t in named],
            shapes=[list(t.shape) for _, t in named],
        )

    @classmethod
    def from_dict(cls, info: dict[str, Any]) -> BucketLayout:
        return cls(
            list(info["names"]), list(info["dtype_names"]), [list(s) for s in info["shapes"]]
        )

    def as_dict(self) -> dict[str, Any]:
        return {"names": self.names, "dtype_names": self.dtype_names, "shapes": self.shapes}

    def dtypes(self) -> list[torch.dtype]:
        out = []
        for name in self.dtype_names:
            dtype = getattr(torch, name, None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"unknown dtype {name!r} in a weight bucket")
            out.append(dtype)
        return out

    def sizes(self) -> list[int]:
        """Bytes of each tensor, in order."""
        return [
            _numel(shape) * torch.empty((), dtype=dtype).element_size()
            for shape, dtype in zip(self.shapes, self.dtypes())
        ]

    def offsets(self) -> list[int]:
        """Where each tensor starts: on an ALIGN-byte boundary, so every dtype can view it."""
        out, end = [], 0
        for size in self.sizes():
            start = -(-end // ALIGN) * ALIGN
            out.append(start)
            end = start + size
        return out

    def nbytes(self) -> int:
        sizes = self.sizes()
        return self.offsets()[-1] + sizes[-1] if sizes else 0


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for dim in shape:
        n *= int(dim)
    return n


def pack_bucket(named: Sequence[tuple[str, torch.Tensor]]) -> tuple[BucketLayout, torch.Tensor]:
    """The bucket's layout and its tensors' bytes in one buffer (one copy each)."""
    layout = BucketLayout.of(named)
    flat = torch.zeros(layout.nbytes(), dtype=torch.uint8)
    for (_, tensor), start, size in zip(named, layout.offsets(), layout.sizes()):
        flat[start : start + size] = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return layout, flat


def unpack_bucket(layout: BucketLayout, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Views into `flat` (no copy), typed and shaped as the sender's tensors."""
    if flat.dtype != torch.uint8 or flat.dim() != 1:
        raise ValueError("a weight bucket arrives as a flat uint8 tensor")
    if flat.numel() != layout.nbytes():
        raise ValueError(
            f"weight bucket holds {flat.numel()} bytes, its layout describes {layout.nbytes()}"
        )
    parts = zip(layout.names, layout.dtypes(), layout.shapes, layout.offsets(), layout.sizes())
    return [
        (name, flat[start : start + size].view(dtype).reshape(shape))
        for name, dtype, shape, start, size in parts
    ]
