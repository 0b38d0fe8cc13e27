"""The prompt dataset the trainer reads: a store built by ``cli/preprocess_data.py``.

Every record in a store passed validation at preprocessing time (non-empty prompt,
extracted label, length within ``seq_length``), so nothing here re-checks rows; loading
does verify the store's checksum and count so a truncated or edited file fails at start,
not mid-training. Token ids are kept in one int32 array (57K prompts x ~200 tokens is
~45 MB this way, ~400 MB as Python ints).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mindrl.data.sampler import ResumableSampler
from mindrl.data.store import iter_prompts, read_meta

__all__ = ["PromptDataset", "PromptRecord", "ResumableSampler"]


@dataclass(frozen=True)
class PromptRecord:
    """One prompt: token ids, the text they encode, the ground-truth label, metadata.

    ``metadata`` holds ``index`` (position in the store), ``row`` (0-based row in the raw
    input) and the ``dataset_additional_keys`` values chosen at preprocessing.
    """

    prompt_ids: tuple[int, ...]
    prompt_text: str
    label: str
    metadata: dict[str, Any] = field(default_factory=dict)


class PromptDataset(Sequence[PromptRecord]):
    """Random access to a prompt store: ``len(ds)``, ``ds[i] -> PromptRecord``."""

    def __init__(self, path: str | Path, verify: bool = True) -> None:
        self.path = Path(path)
        self.meta = read_meta(self.path)
        chunks: list[np.ndarray] = []
        lengths: list[int] = []
        self._texts: list[str] = []
        self._labels: list[str] = []
        self._rows: list[int] = []
        self._extras: list[dict[str, Any]] = []
        for record in iter_prompts(self.path, verify=verify):
            ids = np.asarray(record["prompt_ids"], dtype=np.int32)
            chunks.append(ids)
            lengths.append(len(ids))
            self._texts.append(record["prompt_text"])
            self._labels.append(record["label"])
            self._rows.append(int(record["row"]))
            self._extras.append(record.get("extra") or {})
        self._ids = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)
        self._offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self._offsets[1:])

    def __len__(self) -> int:
        return len(self._labels)

    def prompt_length(self, index: int) -> int:
        return int(self._offsets[index + 1] - self._offsets[index])

    def __getitem__(self, index: int) -> PromptRecord:  # type: ignore[override]
        if not isinstance(index, int):
            if not hasattr(index, "__index__"):
                raise TypeError(f"PromptDataset indices are ints, got {type(index).__name__}")
            index = index.__index__()
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} prompts")
        start, end = self._offsets[index], self._offsets[index + 1]
        return PromptRecord(
            prompt_ids=tuple(self._ids[start:end].tolist()),
            prompt_text=self._texts[index],
            label=self._labels[index],
            metadata={**self._extras[index], "index": index, "row": self._rows[index]},
        )

    def __iter__(self) -> Iterator[PromptRecord]:
        for i in range(len(self)):
            yield self[i]

    def batch(self, indices: Sequence[int]) -> list[PromptRecord]:
        """The records of one sampler batch."""
        return [self[i] for i in indices]

    @property
    def max_prompt_tokens(self) -> int:
        return int(self.meta.get("max_prompt_tokens", 0))

    @property
    def seq_length(self) -> int | None:
        return self.meta.get("seq_length")


class PromptSubset(Sequence[PromptRecord]):
    """The prompts of a store whose length is at most `max_tokens` (MindSpeed-RL drops
    longer ones when it builds its dataset); indices count within the subset."""

    def __init__(self, dataset: PromptDataset, max_tokens: int) -> None:
        self.dataset = dataset
        self.keep = [i for i in range(len(dataset)) if dataset.prompt_length(i) <= max_tokens]
        self.dropped = len(dataset) - len(self.keep)

    def __len__(self) -> int:
        return len(self.keep)

    def __getitem__(self, index: int) -> PromptRecord:  # type: ignore[override]
        return self.dataset[self.keep[index]]

    def batch(self, indices: Sequence[int]) -> list[PromptRecord]:
        return self.dataset.batch([self.keep[i] for i in indices])
