"""Token selection for response-only logits: cell bookkeeping, the output-layer gather on a
stand-in module shaped like megatron's, and one log-softmax for log-probs and entropy."""

from __future__ import annotations

import torch

from mindrl.models.logprobs import (
    log_probs_and_entropy,
    vocab_parallel_entropy,
    vocab_parallel_log_probs,
)
from mindrl.models.token_select import TokenSelection, select_tokens, selected_logits


def _mask() -> torch.Tensor:
    # 3 rows, 5 grid columns (S = 6): responses start at different columns
    return torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 1, 1], [0, 0, 0, 1, 0]], dtype=torch.float32)


def test_cells_are_sequence_major_and_round_trip():
    sel = TokenSelection.from_mask(_mask())
    assert sel.size == 7 and sel.batch == 3 and sel.seq == 6
    pairs = list(zip(sel.cols.tolist(), sel.rows.tolist()))
    assert pairs == sorted(pairs)  # the order of megatron's [S, B, H] hidden states
    grid = torch.arange(15, dtype=torch.float32).reshape(3, 5)
    back = sel.scatter(sel.gather(grid))
    assert torch.equal(back, grid * _mask())
    tokens = torch.arange(18).reshape(3, 6)
    assert torch.equal(sel.labels(tokens), tokens[sel.rows, sel.cols + 1])
    assert sel.last_column() == 4


def test_empty_mask_still_selects_one_cell():
    sel = TokenSelection.from_mask(torch.zeros(2, 4))
    assert sel.size == 1 and sel.rows.tolist() == [0] and sel.cols.tolist() == [0]


class _Head(torch.nn.Module):
    """Megatron's output layer calling convention: hidden [S, B, H] -> (logits, bias)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 7, bias=False)
        self.sequence_parallel = False

    def forward(self, hidden, weight=None, runtime_gather_output=None):
        return self.proj(hidden), None


class _Model(torch.nn.Module):
    post_process = True

    def __init__(self) -> None:
        super().__init__()
        self.output_layer = _Head()

    def forward(self, hidden):  # [S, B, H] -> [B, S, V], as GPTModel returns
        logits, _ = self.output_layer(hidden, weight=None, runtime_gather_output=None)
        return logits.transpose(0, 1).contiguous()


def test_gather_before_output_layer_matches_full_logits_and_gradients():
    torch.manual_seed(0)
    model = _Model()
    hidden = torch.randn(6, 3, 4, requires_grad=True)
    sel = TokenSelection.from_mask(_mask())
    full = model(hidden)
    with select_tokens(model, sel):
        packed = model(hidden)
    assert packed.shape == (1, sel.size, 7)
    assert torch.allclose(selected_logits(packed, sel), selected_logits(full, sel))
    # gradients reach exactly the selected hidden states
    selected_logits(packed, sel).sum().backward()
    grad_rows = hidden.grad.abs().sum(-1) > 0  # [S, B]
    want = torch.zeros(6, 3, dtype=torch.bool)
    want[sel.cols, sel.rows] = True
    assert torch.equal(grad_rows, want)
    # the hook is gone afterwards
    assert model(hidden).shape == (3, 6, 7)


class _StrideProbe(torch.autograd.Function):
    """Identity that records the strides of the gradient coming back through it (what the
    output layer's `grad @ W` would receive)."""

    seen: list[tuple[int, ...]] = []

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        _StrideProbe.seen.append(grad.stride())
        return grad


class _ProbedHead(_Head):
    def forward(self, hidden, weight=None, runtime_gather_output=None):
        return _StrideProbe.apply(self.proj(hidden)), None


def test_the_selected_logits_gradient_reaches_the_output_layer_with_row_major_strides(
    monkeypatch,
):
    # with non-standard strides torch.matmul runs [N, 1, V] @ [V, H] as N matrix-vector
    # products (a LoRA run's frozen output layer: 18x slower on SmolLM2)
    from mindrl.models import token_select

    torch.manual_seed(0)
    model = _Model()
    model.output_layer = _ProbedHead()
    hidden = torch.randn(6, 3, 4)
    sel = TokenSelection.from_mask(_mask())

    def strides_seen() -> list[tuple[int, ...]]:
        _StrideProbe.seen.clear()
        with select_tokens(model, sel):
            picked = selected_logits(model(hidden), sel)
        (picked * torch.randn_like(picked)).sum().backward()
        return list(_StrideProbe.seen)

    assert strides_seen() == [(7, 7, 1)]  # [N, 1, V] row-major
    monkeypatch.setattr(token_select, "_standard_strides", lambda grad: grad)
    assert strides_seen() == [(7, sel.size * 7, 1)]  # what GPTModel's transpose sends back


def test_shared_log_softmax_equals_separate_passes_with_padded_vocab():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 12, generator=gen, requires_grad=True)
    labels = torch.randint(0, 9, (5,), generator=gen)
    lp, ent = log_probs_and_entropy(logits, labels, vocab_size=9)
    assert torch.allclose(lp, vocab_parallel_log_probs(logits, labels, vocab_size=9))
    want = vocab_parallel_entropy(logits.detach(), 9)
    assert torch.isfinite(ent).all() and torch.allclose(ent, want)
    p = torch.softmax(logits.detach()[:, :9], -1)
    assert torch.allclose(ent, -(p * p.log()).sum(-1), atol=1e-5)
    assert not ent.requires_grad  # a metric unless asked for its gradient
    _, ent_grad = log_probs_and_entropy(logits, labels, vocab_size=9, entropy_grad=True)
    ent_grad.sum().backward()
    assert logits.grad is not None and logits.grad[:, 9:].abs().max() == 0
