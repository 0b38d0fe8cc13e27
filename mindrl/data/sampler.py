"""Deterministic, resumable batch sampler over prompt indices.

Order: epoch ``e`` visits ``range(num_samples)`` in the permutation drawn from
``numpy.random.Generator(PCG64(SeedSequence([seed, e])))`` (identity order when
``shuffle=False``), so any epoch's order can be recomputed from (seed, epoch) alone.

Epoch boundaries: batches never straddle two epochs. Each epoch is cut into consecutive
slices of ``batch_size``; with ``drop_last=True`` (default, what a fixed global batch size
needs) the ``num_samples % batch_size`` indices at the end of each epoch's permutation are
not used that epoch, with ``drop_last=False`` the epoch's last batch is shorter.

State: ``{"epoch": e, "position": p}`` where ``p`` counts the indices of epoch ``e``'s
order already handed out. After an epoch's last batch the state is ``(e + 1, 0)``, so a
checkpoint taken exactly at the boundary resumes at the first batch of the next epoch.
Restoring a state and continuing reproduces the uninterrupted batch sequence exactly: no
sample is replayed or skipped.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np


class ResumableSampler:
    """Yields batches (lists of indices); see the module docstring for the exact contract."""

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        if num_samples <= 0:
            raise ValueError(f"num_samples must be > 0, got {num_samples}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if drop_last and batch_size > num_samples:
            raise ValueError(
                f"batch_size {batch_size} > num_samples {num_samples} with drop_last: "
                "no batch could ever be formed"
            )
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self._epoch = 0
        self._position = 0
        self._order_epoch = -1
        self._order = np.arange(0)

    # ------------------------------------------------------------------ order and sizes
    def epoch_order(self, epoch: int) -> np.ndarray:
        """The visiting order of ``epoch`` (a permutation of ``range(num_samples)``)."""
        if not self.shuffle:
            return np.arange(self.num_samples)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))
        return rng.permutation(self.num_samples)

    @property
    def usable_per_epoch(self) -> int:
        """Indices handed out per epoch (the tail is dropped with ``drop_last``)."""
        if self.drop_last:
            return self.num_samples - self.num_samples % self.batch_size
        return self.num_samples

    def __len__(self) -> int:
        """Batches per epoch."""
        return -(-self.usable_per_epoch // self.batch_size)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def position(self) -> int:
        return self._position

    # --------------------------------------------------------------------- iteration
    def _normalize(self) -> None:
        if self._position >= self.usable_per_epoch:
            self._epoch += 1
            self._position = 0

    def next_batch(self) -> list[int]:
        """The next batch, rolling into the next epoch when the current one is used up."""
        self._normalize()
        if self._order_epoch != self._epoch:
            self._order = self.epoch_order(self._epoch)
            self._order_epoch = self._epoch
        end = min(self._position + self.batch_size, self.usable_per_epoch)
        batch = [int(i) for i in self._order[self._position : end]]
        self._position = end
        self._normalize()
        return batch

    def __iter__(self) -> Iterator[list[int]]:
        """The remaining batches of the current epoch (call again for the next epoch)."""
        epoch = self._epoch
        while self._epoch == epoch:
            yield self.next_batch()

    # -------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.num_samples:
            raise ValueError(
                f"invalid sampler state {dict(state)} for num_samples={self.num_samples}"
            )
        self._epoch, self._position = epoch, position
        self._normalize()
