"""The batch that flows between the driver and the role workers.

One row per sample (prompt x n). Sequences are laid out as `prompt + response`, right-padded
to the longest in the batch; every per-token quantity (log-probs, advantages, masks) lives on
the `[B, S-1]` next-token grid that `forward_only` returns, where column j predicts token j+1.
The driver owns it; workers receive chunks (split by data-parallel rank) and return tensors.

A batch crosses a Ray call with its CPU tensors as numpy arrays (`to_wire` / `from_wire`):
torch pickles a tensor through its storage machinery, whose overhead per tensor is large next
to a batch's small tensors, and the driver sends a batch to its workers twice a step.
The values, shapes and dtypes come back the same (contiguous, writable); bfloat16 (no numpy
dtype) travels as int16 bits. Tensors on a device, or of a dtype numpy lacks, pickle as torch
tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

_BITS = {torch.bfloat16: torch.int16}  # dtypes numpy lacks, sent as same-width integers
_NUMPY = {
    torch.float64,
    torch.float32,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
}


@dataclass(frozen=True)
class SampleBatch:
    input_ids: torch.Tensor  # [B, S] int64, prompt + response, right-padded with pad_id
    attention_mask: torch.Tensor  # [B, S] int64, 1 on real tokens
    response_mask: torch.Tensor  # [B, S-1] float32, 1 where column j predicts a response token
    prompt_lengths: torch.Tensor  # [B] int64
    response_lengths: torch.Tensor  # [B] int64
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # [B, S-1] grids or [B]
    meta: dict[str, list[Any]] = field(default_factory=dict)  # per-sample python values

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled with its CPU tensors as numpy arrays (`to_wire`): cheaper through a Ray
        call than torch's own tensor pickling."""
        grids = (
            self.input_ids,
            self.attention_mask,
            self.response_mask,
            self.prompt_lengths,
            self.response_lengths,
        )
        tensors = {k: to_wire(v) for k, v in self.tensors.items()}
        return _batch_from_wire, (tuple(to_wire(t) for t in grids), tensors, self.meta)

    def with_tensors(self, **tensors: torch.Tensor) -> SampleBatch:
        for name, t in tensors.items():
            if t.shape[0] != self.size:
                raise ValueError(f"tensor {name} has {t.shape[0]} rows, batch has {self.size}")
        return replace(self, tensors={**self.tensors, **tensors})

    def with_meta(self, **values: list[Any]) -> SampleBatch:
        """Per-sample python values added (e.g. the policy version that generated each)."""
        for name, v in values.items():
            if len(v) != self.size:
                raise ValueError(f"meta {name} has {len(v)} values, batch has {self.size}")
        return replace(self, meta={**self.meta, **values})

    def with_response_mask(self, response_mask: torch.Tensor) -> SampleBatch:
        """The same samples scored on another mask (e.g. overlong responses dropped)."""
        if response_mask.shape != self.response_mask.shape:
            raise ValueError(
                f"response mask of shape {tuple(response_mask.shape)} for a batch whose mask "
                f"is {tuple(self.response_mask.shape)}"
            )
        return replace(self, response_mask=response_mask)

    def select(self, index: torch.Tensor | list[int]) -> SampleBatch:
        """Rows `index`, in that order (mini-batch shuffles, DP chunks, DAPO filtering)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        rows = idx.tolist()
        return SampleBatch(
            input_ids=self.input_ids[idx],
            attention_mask=self.attention_mask[idx],
            response_mask=self.response_mask[idx],
            prompt_lengths=self.prompt_lengths[idx],
            response_lengths=self.response_lengths[idx],
            tensors={k: v[idx] for k, v in self.tensors.items()},
            meta={k: [v[i] for i in rows] for k, v in self.meta.items()},
        )

    def chunks(self, n: int) -> list[SampleBatch]:
        """n contiguous equal chunks (the caller guarantees divisibility: validated config)."""
        if self.size % n:
            raise ValueError(f"batch of {self.size} does not split into {n} equal chunks")
        step = self.size // n
        return [self.select(list(range(i * step, (i + 1) * step))) for i in range(n)]

    @staticmethod
    def concat(parts: list[SampleBatch]) -> SampleBatch:
        seq = max(p.input_ids.shape[1] for p in parts)
        pad = [_pad_cols(p, seq) for p in parts]
        keys = pad[0].tensors.keys()
        return SampleBatch(
            input_ids=torch.cat([p.input_ids for p in pad]),
            attention_mask=torch.cat([p.attention_mask for p in pad]),
            response_mask=torch.cat([p.response_mask for p in pad]),
            prompt_lengths=torch.cat([p.prompt_lengths for p in pad]),
            response_lengths=torch.cat([p.response_lengths for p in pad]),
            tensors={k: torch.cat([p.tensors[k] for p in pad]) for k in keys},
            meta={k: sum((p.meta[k] for p in pad), []) for k in pad[0].meta},
        )


def _batch_from_wire(
    grids: tuple[Any, ...], tensors: dict[str, Any], meta: dict[str, list[Any]]
) -> SampleBatch:
    """`SampleBatch.__reduce__`'s inverse."""
    input_ids, attention_mask, response_mask, prompt_lengths, response_lengths = (
        from_wire(g) for g in grids
    )
    return SampleBatch(
        input_ids,
        attention_mask,
        response_mask,
        prompt_lengths,
        response_lengths,
        tensors={k: from_wire(v) for k, v in tensors.items()},
        meta=meta,
    )


def micro_batch_size(configured: int, batch_size: int) -> int:
    """The largest micro-batch <= `configured` that divides `batch_size` (a chunk smaller
    than the configured micro-batch, or not a multiple of it, still runs)."""
    mbs = min(configured, batch_size)
    while batch_size % mbs:
        mbs -= 1
    return mbs


def pad_columns_to_multiple(batch: SampleBatch, multiple: int) -> SampleBatch:
    """`batch` right-padded (no tokens, no response) to a width that is a multiple of
    `multiple` (sequence parallelism splits the sequence over the TP ranks)."""
    width = batch.input_ids.shape[1]
    return _pad_cols(batch, -(-width // multiple) * multiple)


def _pad_cols(batch: SampleBatch, seq: int) -> SampleBatch:
    extra = seq - batch.input_ids.shape[1]
    if extra == 0:
        return batch

    def pad(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, extra))

    grid = {k: pad(v) if v.dim() == 2 else v for k, v in batch.tensors.items()}
    return replace(
        batch,
        input_ids=pad(batch.input_ids),
        attention_mask=pad(batch.attention_mask),
        response_mask=pad(batch.response_mask),
        tensors=grid,
    )


def build_sample_batch(
    prompts: list[list[int]],
    responses: list[list[int]],
    pad_id: int,
    meta: dict[str, list[Any]] | None = None,
    rollout_log_probs: list[list[float]] | None = None,
    loss_masks: list[list[int] | None] | None = None,
) -> SampleBatch:
    """Lay out prompt + response rows; rollout log-probs land on the response columns.

    ``loss_masks`` (multi-turn rollout): per response, 1 on the tokens the model generated and
    0 on inserted tool and template tokens, which `response_mask` then leaves out of the loss
    (None for a response that is all the model's)."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    seq = max(max(lengths), 2)
    rows: list[int] = []  # the padded rows, row-major, built as Python lists and converted once
    log_probs: list[float] = []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        if not p:
            raise ValueError(f"sample {i} has an empty prompt")
        rows += [*p, *r]
        rows += [pad_id] * (seq - lengths[i])
        if rollout_log_probs is not None:
            lp = rollout_log_probs[i]
            if len(lp) != len(r):
                raise ValueError(f"sample {i}: {len(lp)} log-probs for {len(r)} response tokens")
            log_probs += [0.0] * (len(p) - 1)  # column len(p) - 1 predicts the first response token
            log_probs += lp
            log_probs += [0.0] * (seq - lengths[i])
    bsz = len(prompts)
    input_ids = torch.tensor(rows, dtype=torch.long).view(bsz, seq)
    prompt_lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    response_lengths = torch.tensor([len(r) for r in responses], dtype=torch.long)
    columns = torch.arange(seq)
    attention_mask = (columns < (prompt_lengths + response_lengths)[:, None]).long()
    start = (prompt_lengths - 1)[:, None]  # column predicting the first response token
    predicted = columns[: seq - 1]
    response_mask = ((predicted >= start) & (predicted < start + response_lengths[:, None])).float()
    for i, mask in enumerate(loss_masks or ()):
        if mask is None:
            continue
        if len(mask) != len(responses[i]):
            raise ValueError(
                f"sample {i}: a loss mask of {len(mask)} for {len(responses[i])} tokens"
            )
        first = len(prompts[i]) - 1
        response_mask[i, first : first + len(mask)] = torch.tensor(mask, dtype=torch.float32)
    batch = SampleBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        prompt_lengths=prompt_lengths,
        response_lengths=response_lengths,
        meta=dict(meta or {}),
    )
    if rollout_log_probs is not None:
        rollout_lp = torch.tensor(log_probs, dtype=torch.float32).view(bsz, seq - 1)
        batch = batch.with_tensors(rollout_log_probs=rollout_lp)
    return batch


def to_wire(tensor: torch.Tensor) -> Any:
    """A picklable stand-in for `tensor`: (numpy array, torch dtype) for a CPU tensor numpy
    can hold, else the tensor itself."""
    if tensor.device.type != "cpu" or tensor.is_sparse:
        return tensor
    dtype = tensor.dtype
    if dtype in _BITS:
        return tensor.detach().contiguous().view(_BITS[dtype]).numpy(), dtype
    if dtype in _NUMPY:
        return tensor.detach().contiguous().numpy(), dtype
    return tensor


def from_wire(value: Any) -> torch.Tensor:
    """The tensor `to_wire` stood in for."""
    if isinstance(value, torch.Tensor):
        return value
    array, dtype = value
    array = np.asarray(array)
    if not array.flags.writeable:  # e.g. a view of Ray's receive buffer: the batch is ours
        array = array.copy()
    tensor = torch.from_numpy(array)
    return tensor.view(dtype) if dtype in _BITS else tensor
