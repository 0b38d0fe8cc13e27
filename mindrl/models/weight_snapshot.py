"""A frozen copy of a model's weights that stands in for them during a forward pass.

The reference held in the actor's processes (`rl_config.reference_in_actor`, MindSpeed-RL's
integrated worker holding actor and reference in one process): the reference has the actor's
architecture and layout, so it needs only its weights, not a model, a process and a torch
runtime of its own. Its pass points every parameter at the snapshot's tensor and back
(`param.data`, no copy), so the actor's own storage (megatron DDP's contiguous buffers
included) is untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any


class WeightSnapshot:
    """Copies of the parameters of `model_chunks` (this rank's), in their dtype and device."""

    def __init__(self, model_chunks: Sequence[Any]):
        self._params = [p for chunk in model_chunks for p in chunk.parameters()]
        self._saved = [p.detach().clone() for p in self._params]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._saved)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The snapshot's weights in the model for the block; the live ones after, even when
        the block fails."""
        live = [p.data for p in self._params]
        try:
            for param, saved in zip(self._params, self._saved, strict=True):
                param.data = saved
            yield
        finally:
            for param, data in zip(self._params, live, strict=True):
                param.data = data
