"""Run the output layer only on the tokens whose log-probs are needed.

RL scores response tokens only, but GPTModel applies the output layer (hidden x vocab, 49k to
152k wide) and the caller the log-softmax, to every position: prompt tokens, padding and
all. On a CPU that vocabulary-wide work costs as much as the transformer itself.
`select_tokens` gathers the needed hidden states right before megatron's output layer (a
forward pre-hook), so the model returns logits for those N tokens only, [1, N, V]. The
decoder and the pipeline schedule are untouched: the gather happens on the last stage,
after all point-to-point traffic. Gradients flow back through the gather.

`TokenSelection` names the cells of a `[B, S-1]` next-token grid (column j predicts token
j+1 from the hidden state at position j) and moves values between the grid and the packed
[N] order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TokenSelection:
    """Cells (rows[i], cols[i]) of a [batch, seq - 1] grid, in sequence-major order (the
    order of megatron's [S, B, H] hidden states).

    The model's input is the grid's rows unless `model_rows` / `model_cols` say where each
    cell's hidden state sits in it (a packed micro-batch: one row, `model_batch` 1)."""

    rows: torch.Tensor  # [N] int64
    cols: torch.Tensor  # [N] int64
    batch: int
    seq: int  # the input length S; the grid has S - 1 columns
    model_rows: torch.Tensor | None = None  # [N]: the cell's row in the model input
    model_cols: torch.Tensor | None = None  # [N]: its position (the hidden state to read)
    model_batch: int | None = None  # rows of the model input
    model_labels: torch.Tensor | None = None  # [N]: the predicted tokens, when the model
    # input does not hold them next to the hidden state (rows sharing a prompt's tokens)

    def model_cells(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(rows, positions, batch) of the selected hidden states in the model input."""
        if self.model_rows is None or self.model_cols is None:
            return self.rows, self.cols, self.batch
        return self.model_rows, self.model_cols, self.model_batch or 1

    @classmethod
    def from_mask(cls, mask: torch.Tensor) -> TokenSelection:
        """Every cell where `mask` [B, S-1] is non-zero (cell (0, 0) when none is, so a
        forward still has one token to produce)."""
        import torch

        cols, rows = mask.t().nonzero(as_tuple=True)
        if rows.numel() == 0:
            rows = cols = mask.new_zeros(1, dtype=torch.long)
        return cls(rows=rows, cols=cols, batch=int(mask.shape[0]), seq=int(mask.shape[1]) + 1)

    @property
    def size(self) -> int:
        return int(self.rows.numel())

    def last_column(self) -> int:
        """The last grid column holding a selected cell (-1 when none)."""
        return int(self.cols.max()) if self.size else -1

    def hidden_index(self) -> torch.Tensor:
        """Row indices into the hidden states flattened from [S, B, H] to [S*B, H]."""
        rows, cols, batch = self.model_cells()
        return cols * batch + rows

    def labels(self, tokens: torch.Tensor) -> torch.Tensor:
        """The token each selected cell predicts, [N] (`tokens`: the model input)."""
        if self.model_labels is not None:
            return self.model_labels.to(tokens.device)
        rows, cols, _ = self.model_cells()
        return tokens[rows, cols + 1]

    def gather(self, grid: torch.Tensor) -> torch.Tensor:
        return grid[self.rows, self.cols]

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """[N] values into a zero [batch, seq - 1] grid (differentiable in `values`)."""
        out = values.new_zeros((self.batch, self.seq - 1))
        out[self.rows, self.cols] = values
        return out


def _output_layer(model: Any) -> Any | None:
    """The output layer of a (DDP- or Float16Module-wrapped) GPTModel chunk, or None on
    pipeline stages without one."""
    inner = model
    while hasattr(inner, "module") and not hasattr(inner, "output_layer"):
        inner = inner.module
    if not getattr(inner, "post_process", False):
        return None
    return getattr(inner, "output_layer", None)


@dataclass
class OutputHead:
    """Filled by `select_tokens(..., hidden_only=True)` when the model returned the selected
    hidden states instead of logits: the output layer's weight, to apply with the loss."""

    weight: torch.Tensor | None = None


def _plain_head(layer: Any) -> bool:
    """An output layer that is one matmul with the whole vocabulary on this rank: no tensor
    parallelism, no bias."""
    from mindrl.models.parallel import tp_rank_size

    return tp_rank_size()[1] == 1 and getattr(layer, "bias", None) is None


@contextlib.contextmanager
def select_tokens(
    model: Any, selection: TokenSelection, *, hidden_only: bool = False
) -> Iterator[OutputHead]:
    """Within the block, `model(...)` returns logits [1, N, V] for the selected tokens.

    `hidden_only`: where the output layer is a plain matmul (`_plain_head`), it is skipped
    and the model returns the selected hidden states [1, N, H]; the yielded head's weight is
    set for the loss to apply in chunks (`mindrl.models.head_log_probs`).

    No-op on stages without an output layer, and under sequence parallelism (the hidden
    states are then split along the sequence across TP ranks, so a global gather is not
    local); `selected_logits` gathers from the full logits in that case.
    """
    head = OutputHead()
    layer = _output_layer(model)
    if layer is None or getattr(layer, "sequence_parallel", False):
        yield head
        return
    index = selection.hidden_index()

    def gather_hidden(
        _module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        hidden = args[0]
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, index.to(hidden.device))
        return (picked.unsqueeze(1), *args[1:]), kwargs

    def mark_logits(_module: Any, _args: Any, output: Any) -> None:
        logits = output[0] if isinstance(output, tuple) else output
        if logits.requires_grad:
            logits.register_hook(_standard_strides)

    def hidden_out(hidden: torch.Tensor, weight: torch.Tensor | None = None, **_: Any) -> Any:
        head.weight = layer.weight if weight is None else weight
        return hidden, None

    handles = (
        layer.register_forward_pre_hook(gather_hidden, with_kwargs=True),
        layer.register_forward_hook(mark_logits),
    )
    skip = hidden_only and _plain_head(layer)
    if skip:
        layer.forward = hidden_out  # the instance's own, removed below
    try:
        yield head
    finally:
        for handle in handles:
            handle.remove()
        if skip:
            del layer.forward


def _standard_strides(grad: torch.Tensor) -> torch.Tensor:
    """The logits' gradient [N, 1, V] with row-major strides. GPTModel returns the logits
    transposed to [1, N, V], so their gradient comes back with a stride on the size-1 batch
    dim that stops torch.matmul from folding `grad @ W` into one matrix product: it runs N
    matrix-vector products instead (megatron's frozen-weight linear, i.e. a LoRA run's output
    layer). A copy of [N, V] is far cheaper than N matrix-vector products."""
    import torch

    standard = torch.empty(grad.shape, device="meta").stride()
    if grad.stride() == standard:
        return grad
    return grad.clone(memory_format=torch.contiguous_format)


def selected_logits(logits: torch.Tensor, selection: TokenSelection) -> torch.Tensor:
    """Logits [N, V] of the selected tokens, whether the model returned them packed
    ([1, N, V], under `select_tokens`) or for every position ([B, S', V])."""
    # full logits have more positions than cells selected (the last column + 2 at least)
    if logits.shape[0] == 1 and logits.shape[1] == selection.size:
        return logits[0]
    rows, cols, _ = selection.model_cells()
    return logits[rows, cols]
