"""Micro-batches that run each prompt once for all of its samples (`share_prompt_forward`).

GRPO scores `n_samples_per_prompt` responses to one prompt, and every training pass (the
reference, the old policy, the update) otherwise runs that prompt through the model once per
sample. Packed (`use_remove_padding`), the rows of a micro-batch that share a prompt become
one *block*: the prompt's tokens once, then each row's response tokens, each response with
the positions it has in its own row (the prompt's length onwards) and an attention that sees
the prompt and its own earlier tokens only. Every hidden state is the one the row's own
forward computes; the prompt's gradient is the sum of its rows' (autograd adds the uses), so
losses and gradients are the unshared ones up to float rounding, with a fraction
`(n - 1) * prompt / (prompt + response)` of the linear layers' work gone.

Ray- and megatron-free (torch only); the attention over blocks is
`mindrl.models.packed_attention.shared_prefix_attention`.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mindrl.data.packing import (
    PackingSettings,
    balanced_partitions,
    fixed_partitions,
    right_padded_lengths,
    round_up,
)

if TYPE_CHECKING:
    import torch

    from mindrl.models.token_select import TokenSelection


def prompt_families(input_ids: torch.Tensor, prompt_lengths: torch.Tensor) -> list[list[int]]:
    """Rows grouped by identical prompt tokens, in order of first appearance (rows in batch
    order)."""
    families: dict[tuple[int, ...], list[int]] = {}
    plens = prompt_lengths.tolist()
    rows = input_ids[:, : max(plens, default=0)].tolist()  # one copy out, not one per row
    for r, p in enumerate(plens):
        families.setdefault(tuple(rows[r][:p]), []).append(r)
    return list(families.values())


def block_tokens(rows: list[int], lengths: list[int], prompt_lengths: list[int]) -> int:
    """Tokens of one block: rows of one prompt, the prompt once."""
    p = prompt_lengths[rows[0]]
    return p + sum(lengths[r] - p for r in rows)


def shared_group_tokens(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_lengths: torch.Tensor,
    groups: list[list[int]],
) -> list[int]:
    """Tokens fed for each group of rows packed with their shared prompts run once."""
    lengths = attention_mask.long().sum(-1).tolist()
    plens = prompt_lengths.tolist()
    families = prompt_families(input_ids, prompt_lengths)
    out = []
    for group in groups:
        chosen = set(group)
        blocks = [[r for r in f if r in chosen] for f in families]
        out.append(sum(block_tokens(b, lengths, plens) for b in blocks if b))
    return out


def _family_units(
    family: list[int],
    lengths: list[int],
    prompt_lengths: list[int],
    max_tokens: int,
    max_rows: int | None,
) -> list[list[int]]:
    """A family cut into consecutive blocks of at most `max_tokens` tokens (its prompt once
    per block) and `max_rows` rows."""
    p = prompt_lengths[family[0]]
    units: list[list[int]] = []
    tokens = 0
    for r in family:
        extra = lengths[r] - p
        full = units and (
            tokens + extra > max_tokens or (max_rows is not None and len(units[-1]) >= max_rows)
        )
        if not units or full:
            units.append([r])
            tokens = p + extra
        else:
            units[-1].append(r)
            tokens += extra
    return units


def plan_shared_micro_batches(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_lengths: torch.Tensor,
    settings: PackingSettings,
    micro_batch_size: int,
    min_parts: int = 1,
) -> list[list[int]]:
    """The rows of each micro-batch for one pass. With dynamic batch sizes the token budget
    counts a shared prompt once, and a prompt's rows stay together where the budget allows;
    else `micro_batch_size` rows in batch order (GRPO's rows of one prompt are consecutive)."""
    if not settings.dynamic_bsz:
        return fixed_partitions(int(input_ids.shape[0]), micro_batch_size)
    lengths = attention_mask.long().sum(-1).tolist()
    plens = prompt_lengths.tolist()
    units: list[list[int]] = []
    for family in prompt_families(input_ids, prompt_lengths):
        units += _family_units(family, lengths, plens, settings.max_tokens, settings.max_rows)
    unit_tokens = [block_tokens(u, lengths, plens) for u in units]
    parts = balanced_partitions(
        unit_tokens, settings.max_tokens, settings.max_rows, min_parts, [len(u) for u in units]
    )
    return [sorted(r for i in part for r in units[i]) for part in parts]


@dataclass(frozen=True)
class SharedPrefixRows:
    """Rows of one micro-batch packed into a single sequence [1, T] of blocks."""

    tokens: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T]: each token's position in its own row
    block_bounds: torch.Tensor  # [blocks + 1] int32: block bounds (padding tail: a block)
    segments: torch.Tensor  # [T] int64: 0 = the block's prompt, k = its k-th response
    prompt_starts: torch.Tensor  # [b]: where each row's prompt starts
    response_starts: torch.Tensor  # [b]: where each row's response starts
    prompt_lengths: torch.Tensor  # [b]
    real_tokens: int  # tokens before the padding tail

    @property
    def rope_length(self) -> int:
        """Positions 0..rope_length-1 cover every token."""
        return int(self.position_ids.max()) + 1

    def selection(self, response_mask: torch.Tensor, input_ids: torch.Tensor) -> TokenSelection:
        """The scored cells of the rows' `[b, s-1]` grid: cell (r, j) reads the hidden state
        of row r's token j (in its block's prompt or in its own response) and predicts the
        row's token j + 1 (`input_ids`: the rows as padded, not the packed sequence)."""
        import torch

        from mindrl.models.token_select import TokenSelection

        grid = TokenSelection.from_mask(response_mask)
        rows, cols = grid.rows, grid.cols
        plen = self.prompt_lengths[rows]
        packed_cols = torch.where(
            cols < plen,
            self.prompt_starts[rows] + cols,
            self.response_starts[rows] + cols - plen,
        )
        order = torch.argsort(packed_cols, stable=True)  # sequence-major, as megatron's [S, B]
        return TokenSelection(
            rows=rows[order],
            cols=cols[order],
            batch=grid.batch,
            seq=grid.seq,
            model_rows=torch.zeros_like(packed_cols),
            model_cols=packed_cols[order],
            model_batch=1,
            model_labels=input_ids[rows, cols + 1][order],
        )


def pack_shared(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_lengths: torch.Tensor,
    multiple: int = 1,
    length: int | None = None,
) -> SharedPrefixRows:
    """Right-padded rows packed into blocks, one per prompt they share; the packed length is
    padded to `multiple` (sequence parallelism) or to `length` (the pipeline's one shape)."""
    import torch

    lengths = right_padded_lengths(attention_mask).tolist()
    plens = prompt_lengths.tolist()
    if any(p > n for p, n in zip(plens, lengths)):
        raise ValueError("a row is shorter than its prompt")
    # each packed token as (row, column) of the padded rows, gathered in one indexing call
    # (a few small tensors per row would add a per-row overhead to every micro-batch)
    rows: list[int] = []
    positions: list[int] = []
    segments: list[int] = []
    bounds = [0]
    n = len(lengths)
    prompt_starts, response_starts = [0] * n, [0] * n
    at = 0
    for family in prompt_families(input_ids, prompt_lengths):
        p = plens[family[0]]
        rows += [family[0]] * p
        positions += range(p)
        segments += [0] * p
        for r in family:
            prompt_starts[r] = at
        at += p
        for k, r in enumerate(family, start=1):
            extra = lengths[r] - p
            rows += [r] * extra
            positions += range(p, lengths[r])
            segments += [k] * extra
            response_starts[r] = at
            at += extra
        bounds.append(at)
    padded = round_up(max(at, 1), multiple)
    if length is not None:
        if length < padded:
            raise ValueError(f"packed length {padded} exceeds the fixed length {length}")
        padded = length
    if padded > at:
        tail = padded - at
        positions += range(tail)
        segments += [0] * tail
        bounds.append(padded)
    position_ids = _long_tensor(positions, input_ids.device)
    tokens = input_ids[_long_tensor(rows, input_ids.device), position_ids[:at]]
    if padded > at:
        tokens = torch.cat([tokens, input_ids.new_zeros(padded - at)])
    return SharedPrefixRows(
        tokens=tokens[None, :],
        position_ids=position_ids[None, :],
        block_bounds=torch.tensor(bounds, dtype=torch.int32),
        segments=_long_tensor(segments),
        prompt_starts=torch.tensor(prompt_starts),
        response_starts=torch.tensor(response_starts),
        prompt_lengths=prompt_lengths.to("cpu", torch.long),
        real_tokens=at,
    )


def _long_tensor(values: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """An int64 tensor of `values`: through an int64 `array`, whose plain C conversion of a
    list of Python ints costs less than `torch.tensor`'s per-element type inference."""
    import torch

    if not values:
        return torch.zeros(0, dtype=torch.long, device=device)
    return torch.frombuffer(array("q", values), dtype=torch.long).to(device, copy=True)
