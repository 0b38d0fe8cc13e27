"""Micro-batches without padding: rows grouped by a token budget and packed into one sequence.

MindSpeed-RL's `use_dynamic_bsz` forms each pass's micro-batches by a token budget
(`{ref,actor,update}_max_packing_token_size`, at most `*_dynamic_max_batch_size` rows) instead
of `micro_batch_size` rows; `use_remove_padding` concatenates a micro-batch's rows into one
sequence (megatron's `thd` layout) whose attention stops at the row boundaries. The two
combine: budgeted groups, each packed. Every data-parallel rank runs the same number of
micro-batches (expert parallelism exchanges tokens at every forward), as MindSpeed-RL's
all-reduced partition count does.

Rows are `prompt + response` right-padded (`SampleBatch`), so a row's real tokens are its
first `attention_mask.sum()` columns. Packed, row r's token j sits at position
`starts[r] + j`; a grid cell (r, j) (column j predicts token j+1) is read from the hidden
state at `starts[r] + j`, so the loss still sees the `[b, s-1]` grid of the padded layout
and every loss aggregation mode is unchanged.

Ray- and megatron-free (torch only): planned by the driver for metrics and by the workers
for their passes, with the same function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from mindrl.config.rl_features import MicroBatchingConfig
    from mindrl.models.token_select import TokenSelection

PASSES = ("ref", "actor", "update")  # reference, old-policy log-probs, policy update


@dataclass(frozen=True)
class PackingSettings:
    """How one pass cuts its batch (`rl_config` keys, read per pass)."""

    remove_padding: bool = False
    dynamic_bsz: bool = False
    max_tokens: int = 4096  # token budget of one micro-batch (dynamic_bsz)
    max_rows: int | None = None  # at most this many rows per micro-batch (dynamic_bsz)
    share_prompts: bool = False  # rows sharing a prompt run it once (`prefix_sharing`)

    def __post_init__(self) -> None:
        if self.share_prompts and not self.remove_padding:
            raise ValueError("sharing prompts packs rows: it needs remove_padding")

    @property
    def active(self) -> bool:
        return self.remove_padding or self.dynamic_bsz


def balanced_partitions(
    lengths: list[int],
    max_tokens: int,
    max_rows: int | None = None,
    min_parts: int = 1,
    rows: list[int] | None = None,
) -> list[list[int]]:
    """Row indices grouped into as few micro-batches as fit `max_tokens` tokens (and
    `max_rows` rows) each, at least `min_parts`, with the tokens spread evenly: longest row
    first into the lightest group. Each group lists its rows in batch order; the groups are
    ordered by their first row. `rows`: how many rows each item stands for (default 1: an
    item is a row; blocks of rows sharing a prompt count theirs)."""
    n = len(lengths)
    weights = rows or [1] * n
    if n == 0:
        return []
    too_long = [i for i, n_tok in enumerate(lengths) if n_tok > max_tokens]
    if too_long:
        i = too_long[0]
        raise ValueError(
            f"sample {i} has {lengths[i]} tokens, more than the packing budget "
            f"max_packing_token_size={max_tokens}: raise the pass's max_packing_token_size "
            "to at least the longest prompt + response"
        )
    parts = max(min_parts, -(-sum(lengths) // max_tokens))
    if max_rows is not None:
        parts = max(parts, -(-sum(weights) // max_rows))
    parts = min(parts, n)
    while True:
        groups = _longest_first(lengths, parts, max_rows, weights)
        if groups is not None and all(sum(lengths[i] for i in g) <= max_tokens for g in groups):
            break
        parts += 1  # terminates: n groups of one row each fit (checked above)
    ordered = [sorted(g) for g in groups if g]
    return sorted(ordered, key=lambda g: g[0])


def _longest_first(
    lengths: list[int], parts: int, max_rows: int | None, weights: list[int]
) -> list[list[int]] | None:
    """Greedy balance: each item, longest first, into the group with the fewest tokens that
    still has room for its rows (None when max_rows cannot be met)."""
    tokens = [0] * parts
    counts = [0] * parts
    groups: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        room = [k for k in range(parts) if max_rows is None or counts[k] + weights[i] <= max_rows]
        if not room:
            return None
        k = min(room, key=lambda k: (tokens[k], k))
        groups[k].append(i)
        tokens[k] += lengths[i]
        counts[k] += weights[i]
    return groups


def fixed_partitions(n_rows: int, rows_per_part: int) -> list[list[int]]:
    """`micro_batch_size` rows per micro-batch, in batch order (packing without dynamic
    batch sizes)."""
    return [list(range(i, min(i + rows_per_part, n_rows))) for i in range(0, n_rows, rows_per_part)]


def plan_micro_batches(
    lengths: list[int],
    settings: PackingSettings,
    micro_batch_size: int,
    min_parts: int = 1,
) -> list[list[int]]:
    """The rows of each micro-batch for one pass: by token budget (dynamic_bsz) or by
    `micro_batch_size`; `min_parts` (with dynamic_bsz: the largest count any data-parallel
    rank needs) raises the count so every rank runs as many."""
    if settings.dynamic_bsz:
        return balanced_partitions(lengths, settings.max_tokens, settings.max_rows, min_parts)
    return fixed_partitions(len(lengths), micro_batch_size)  # equal on every DP rank


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class PackedRows:
    """Rows of one micro-batch concatenated into a single sequence [1, T]."""

    tokens: torch.Tensor  # [1, T]: every row's real tokens, then padding to the length multiple
    position_ids: torch.Tensor  # [1, T]: positions restart at 0 in every row
    cu_seqlens: torch.Tensor  # [segments + 1] int32: segment bounds (padding tail included)
    max_seqlen: int
    starts: torch.Tensor  # [b] where each row begins in the packed sequence

    def selection(self, response_mask: torch.Tensor) -> TokenSelection:
        """The response cells of the rows' `[b, s-1]` grid, read from the packed hidden
        states (one row: the hidden state of packed position p is entry p)."""
        import torch

        from mindrl.models.token_select import TokenSelection

        grid = TokenSelection.from_mask(response_mask)
        packed_cols = self.starts[grid.rows] + grid.cols
        order = torch.argsort(packed_cols)  # sequence-major order of the packed hidden states
        return TokenSelection(
            rows=grid.rows[order],
            cols=grid.cols[order],
            batch=grid.batch,
            seq=grid.seq,
            model_rows=torch.zeros_like(packed_cols),
            model_cols=packed_cols[order],
            model_batch=1,
        )


def right_padded_lengths(attention_mask: torch.Tensor) -> torch.Tensor:
    """Each row's token count [b]; refused unless every row's real tokens come first."""
    import torch

    lengths = attention_mask.long().sum(-1)
    width = attention_mask.shape[1]
    prefix = torch.arange(width, device=attention_mask.device)[None, :] < lengths[:, None]
    if not torch.equal(prefix, attention_mask.bool()):
        raise ValueError("packing needs right-padded rows (real tokens first, then padding)")
    return lengths


def pack_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    multiple: int = 1,
    length: int | None = None,
) -> PackedRows:
    """Concatenate the real tokens of right-padded rows `input_ids` [b, s]; the packed length
    is padded to `multiple` (sequence parallelism) or to `length` (the pipeline's one shape
    for every micro-batch). The padding tail is a segment of its own."""
    import torch

    lengths = right_padded_lengths(attention_mask)
    total = int(lengths.sum())
    padded = round_up(max(total, 1), multiple)
    if length is not None:
        if length < padded:
            raise ValueError(f"packed length {padded} exceeds the fixed length {length}")
        padded = length
    tokens = input_ids.new_zeros((1, padded))
    tokens[0, :total] = input_ids[attention_mask.bool()]
    ends = torch.cumsum(lengths, 0)
    starts = ends - lengths
    bounds = [0, *ends.tolist()]
    if padded > total:
        bounds.append(padded)
    segment_of = torch.repeat_interleave(
        torch.arange(len(bounds) - 1), torch.tensor(bounds[1:]) - torch.tensor(bounds[:-1])
    )
    seg_start = torch.tensor(bounds[:-1])[segment_of]
    cu = torch.tensor(bounds, dtype=torch.int32)
    return PackedRows(
        tokens=tokens,
        position_ids=(torch.arange(padded) - seg_start)[None, :].to(input_ids.device),
        cu_seqlens=cu,
        max_seqlen=int((cu[1:] - cu[:-1]).max()),
        starts=starts,
    )


def pass_packing(cfg: MicroBatchingConfig, pass_name: str) -> PackingSettings:
    """One pass's settings from `rl_config`, read as MindSpeed-RL reads them: each pass has
    its own budget and row cap (`max_packing_token_size` itself sets none of them)."""
    budgets = {
        "ref": (cfg.ref_max_packing_token_size, cfg.ref_dynamic_max_batch_size),
        "actor": (cfg.actor_max_packing_token_size, cfg.actor_dynamic_max_batch_size),
        "update": (cfg.update_max_packing_token_size, cfg.update_dynamic_max_batch_size),
    }
    if pass_name not in budgets:
        raise ValueError(f"pass must be one of {PASSES}, not {pass_name!r}")
    max_tokens, max_rows = budgets[pass_name]
    return PackingSettings(
        remove_padding=cfg.use_remove_padding,
        dynamic_bsz=cfg.use_dynamic_bsz,
        max_tokens=max_tokens,
        max_rows=max_rows,
        share_prompts=cfg.use_remove_padding and cfg.share_prompt_forward,
    )
