"""The split rules of `mapping.Split`, both directions, as pure tensor operations.

HF -> mcore (`hf_to_mcore_pieces`) reads only the rows/columns of each HF tensor that one TP
rank needs (the source may be a lazy safetensors file), and returns pieces along dim 0 whose
concatenation is that rank's local parameter, so callers can copy them into place without a
fused temporary. mcore -> HF (`mcore_to_hf`) takes the local tensors of all TP ranks (in rank
order) and returns the HF tensors. Exactness: only slicing, reshaping, concatenation and zero
padding, so a round trip reproduces every bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from mindrl.checkpoint.errors import ConversionError
from mindrl.checkpoint.mapping import BoundRule, Split
from mindrl.config.model_arch import ModelArchConfig

if TYPE_CHECKING:
    import torch


class TensorSource(Protocol):
    """Where HF tensors come from: a safetensors folder, a dict, ..."""

    def shape(self, name: str) -> tuple[int, ...]: ...

    def read(
        self, name: str, dim: int | None = None, start: int = 0, stop: int | None = None
    ) -> torch.Tensor:
        """The whole tensor (dim=None) or the slice [start:stop] along dim 0 or 1."""
        ...


class DictSource:
    """A TensorSource over in-memory tensors (tests, the export path)."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self.tensors:
            raise ConversionError(f"tensor {name} is missing")
        return tuple(self.tensors[name].shape)

    def read(
        self, name: str, dim: int | None = None, start: int = 0, stop: int | None = None
    ) -> torch.Tensor:
        t = self.tensors[name]
        if dim is None:
            return t
        return t.narrow(dim, start, (t.shape[dim] if stop is None else stop) - start)


def _tp_range(total: int, tp_rank: int, tp_size: int, what: str) -> tuple[int, int]:
    if total % tp_size:
        raise ConversionError(f"{what}={total} is not divisible by tensor parallel size {tp_size}")
    per = total // tp_size
    return tp_rank * per, (tp_rank + 1) * per


def check_hf_shapes(bound: BoundRule, src: TensorSource) -> None:
    """ConversionError naming the HF tensor whose shape disagrees with the architecture."""
    for name, expected in zip(bound.hf, bound.hf_shapes):
        found = src.shape(name)
        if tuple(found) != tuple(expected):
            raise ConversionError(
                f"tensor {name} has shape {list(found)} but the model config implies "
                f"{list(expected)} (for {bound.mcore})"
            )


def _qkv_geometry(arch: ModelArchConfig) -> tuple[int, int, int]:
    """(query groups, q heads per group, head_dim)."""
    groups = arch.num_kv_heads
    if arch.num_attention_heads % groups:
        raise ConversionError(
            f"num_attention_heads={arch.num_attention_heads} is not a multiple of kv heads={groups}"
        )
    return groups, arch.num_attention_heads // groups, arch.head_dim


def fuse_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int, q_per_group: int, head_dim: int
) -> torch.Tensor:
    """[q; k; v] (HF layout) of `groups` query groups -> mcore's per-group [q_g, k_g, v_g]."""
    import torch

    rest = tuple(q.shape[1:])
    parts = [
        q.reshape(groups, q_per_group * head_dim, *rest),
        k.reshape(groups, head_dim, *rest),
        v.reshape(groups, head_dim, *rest),
    ]
    return torch.cat(parts, dim=1).reshape(groups * (q_per_group + 2) * head_dim, *rest)


def unfuse_qkv(
    qkv: torch.Tensor, groups: int, q_per_group: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of `fuse_qkv`.

    q, k and v are consecutive rows of one new tensor (one copy of `qkv`): vLLM fuses them
    in that order, so a rollout engine can take the three as one view (`direct_reload`).
    """
    import torch

    rest = tuple(qkv.shape[1:])
    grouped = qkv.reshape(groups, (q_per_group + 2) * head_dim, *rest)
    rows = [q_per_group * head_dim, head_dim, head_dim]
    out = torch.empty((groups * sum(rows), *rest), dtype=qkv.dtype, device=qkv.device)
    parts = out.split([groups * r for r in rows], dim=0)
    for part, src, r in zip(parts, grouped.split(rows, dim=1), rows):
        part.view(groups, r, *rest).copy_(src)
    q, k, v = parts
    return q, k, v


def hf_to_mcore_pieces(
    bound: BoundRule, src: TensorSource, arch: ModelArchConfig, tp_rank: int, tp_size: int
) -> list[torch.Tensor]:
    """Pieces (along dim 0) of TP rank `tp_rank`'s local tensor of `bound.mcore`."""
    import torch

    check_hf_shapes(bound, src)
    split = bound.split
    names = bound.hf
    if split is Split.REPLICATED:
        return [src.read(names[0])]
    if split is Split.COLUMN:
        start, stop = _tp_range(bound.hf_shapes[0][0], tp_rank, tp_size, f"rows of {names[0]}")
        return [src.read(names[0], 0, start, stop)]
    if split is Split.ROW:
        start, stop = _tp_range(bound.hf_shapes[0][1], tp_rank, tp_size, f"columns of {names[0]}")
        return [src.read(names[0], 1, start, stop)]
    if split is Split.GATE_UP:
        start, stop = _tp_range(bound.hf_shapes[0][0], tp_rank, tp_size, "ffn_hidden_size")
        return [src.read(names[0], 0, start, stop), src.read(names[1], 0, start, stop)]
    if split is Split.QKV:
        groups, qpg, d = _qkv_geometry(arch)
        g0, g1 = _tp_range(groups, tp_rank, tp_size, "kv heads (num_query_groups)")
        q = src.read(names[0], 0, g0 * qpg * d, g1 * qpg * d)
        k = src.read(names[1], 0, g0 * d, g1 * d)
        v = src.read(names[2], 0, g0 * d, g1 * d)
        return [fuse_qkv(q, k, v, g1 - g0, qpg, d)]
    if split is Split.VOCAB:
        vocab, hidden = bound.hf_shapes[0]
        start, stop = _tp_range(arch.padded_vocab_size(tp_size), tp_rank, tp_size, "padded vocab")
        pieces = []
        if start < vocab:
            pieces.append(src.read(names[0], 0, start, min(stop, vocab)))
        pad = stop - max(start, min(stop, vocab))
        if pad:
            dtype = pieces[0].dtype if pieces else torch.float32
            pieces.append(torch.zeros(pad, hidden, dtype=dtype))
        return pieces
    raise AssertionError(split)


def hf_to_mcore(
    bound: BoundRule, src: TensorSource, arch: ModelArchConfig, tp_rank: int, tp_size: int
) -> torch.Tensor:
    """TP rank `tp_rank`'s local tensor of `bound.mcore` (one tensor; copies when fused)."""
    import torch

    pieces = hf_to_mcore_pieces(bound, src, arch, tp_rank, tp_size)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)


def _cat(tensors: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """torch.cat, without the copy when there is only one tensor (TP=1)."""
    import torch

    return tensors[0] if len(tensors) == 1 else torch.cat(list(tensors), dim=dim)


def mcore_to_hf(
    bound: BoundRule, shards: Sequence[torch.Tensor], arch: ModelArchConfig
) -> dict[str, torch.Tensor]:
    """HF tensors from the local tensors of all TP ranks (rank order) of `bound.mcore`.

    With one shard the results may be views of it (no copies).
    """
    split = bound.split
    names = bound.hf
    if split is Split.REPLICATED:
        out = {names[0]: shards[0]}
    elif split is Split.COLUMN:
        out = {names[0]: _cat(shards, 0)}
    elif split is Split.ROW:
        out = {names[0]: _cat(shards, 1)}
    elif split is Split.GATE_UP:
        halves = [s.chunk(2, dim=0) for s in shards]
        out = {names[0]: _cat([h[0] for h in halves], 0), names[1]: _cat([h[1] for h in halves], 0)}
    elif split is Split.QKV:
        groups, qpg, d = _qkv_geometry(arch)
        per_rank = [unfuse_qkv(s, groups // len(shards), qpg, d) for s in shards]
        out = {name: _cat([p[i] for p in per_rank], 0) for i, name in enumerate(names)}
    elif split is Split.VOCAB:
        out = {names[0]: _cat(shards, 0)[: bound.hf_shapes[0][0]]}
    else:
        raise AssertionError(split)
    for name, shape in zip(names, bound.hf_shapes):
        if tuple(out[name].shape) != tuple(shape):
            raise ConversionError(
                f"{bound.mcore} gives {name} of shape {list(out[name].shape)}, "
                f"expected {list(shape)}"
            )
    return out
