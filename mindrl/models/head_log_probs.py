"""The output layer and the log-softmax over the vocabulary, a chunk of tokens at a time.

The policy loss needs one number per scored token (its log-prob, and its entropy), but the
plain path holds the scored tokens' logits over the whole vocabulary several times over for
the backward pass: the output layer's result, the log-softmax saved by autograd, their
gradients (SmolLM2, 512 scored tokens x 49k vocabulary: 100 MB each in fp32). Here
the logits of `chunk` tokens exist at a time: the forward keeps each token's log-sum-exp,
and the probabilities once, in one buffer (`KEPT_PROBS_BYTES`), where they are small
enough, else the backward recomputes a chunk's logits (one extra output-layer matmul). The
gradient goes into the hidden states' a chunk at a time and into the weight's (megatron's
`main_grad` where DDP wraps the weight, at fp32 and bf16) with one GEMM over all the kept
tokens: many short GEMMs keep the bf16 kernels far from their rate.

Same numbers as `log_probs_and_entropy` over `hidden @ weight.T` (fp32 softmax over logits in
the weight's dtype), for one tensor-parallel rank holding the whole vocabulary; vocabulary
rows at or past `vocab_size` (padding) get no probability.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

CHUNK_BYTES = 32 << 20  # fp32 logits of one chunk of tokens
# A call's fp32 probabilities up to this size are kept from the forward for the backward
# (SmolLM2's update micro-batch fits), which then recomputes no logits (saving one
# output-layer GEMM per chunk); larger calls recompute them chunk by chunk.
KEPT_PROBS_BYTES = 256 << 20


# fp32 on CPU: the logits GEMM a block of vocabulary rows at a time. One GEMM with the whole
# vocabulary as its output width runs well below the CPU's matmul rate, blocks of vocabulary
# rows run near it (the backward's GEMMs, with the vocabulary as their inner or outer
# dimension, run near it either way). 0: one GEMM.
VOCAB_BLOCK_ROWS = 1024


def chunk_tokens(vocab: int) -> int:
    return max(1, CHUNK_BYTES // (4 * vocab))


def _blocked_logits(hidden: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None) -> bool:
    """Whether the logits GEMM runs in blocks of vocabulary rows (see VOCAB_BLOCK_ROWS)."""
    import torch

    return (
        0 < VOCAB_BLOCK_ROWS < weight.shape[0]
        and hidden.device.type == "cpu"
        and hidden.dtype == weight.dtype == torch.float32
        and (out is None or out.dtype == torch.float32)
    )


def _chunk_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    temperature: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 logits of a chunk of tokens (into `out` where given)."""
    import torch

    if _blocked_logits(hidden, weight, out):
        x = hidden.new_empty((hidden.shape[0], weight.shape[0])) if out is None else out
        for j in range(0, weight.shape[0], VOCAB_BLOCK_ROWS):
            rows = slice(j, j + VOCAB_BLOCK_ROWS)
            torch.mm(hidden, weight[rows].t(), out=x[:, rows])
    elif out is None:
        x = (hidden @ weight.t()).float()
    elif hidden.dtype == out.dtype:
        x = torch.mm(hidden, weight.t(), out=out)
    else:
        x = out.copy_(hidden @ weight.t())
    return x.div_(temperature) if temperature != 1.0 else x


def head_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    vocab_size: int | None = None,
    temperature: float = 1.0,
    entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(labels) at `temperature`, per-token entropy at temperature 1 or None), both
    fp32 [N], from `hidden` [N, H] and the output layer's `weight` [V, H]. The entropy
    carries gradients only with `entropy_grad` (an entropy bonus)."""
    if entropy and temperature != 1.0:
        raise ValueError("the entropy is taken at temperature 1")
    vocab = weight.shape[0] if vocab_size is None else min(vocab_size, weight.shape[0])
    picked, ent = _make_function().apply(
        hidden, weight, labels, vocab, temperature, entropy, entropy and entropy_grad
    )
    return picked, ent if entropy else None


@functools.cache
def _make_function() -> Any:
    import torch

    class HeadLogProbs(torch.autograd.Function):
        @staticmethod
        def forward(ctx, hidden, weight, labels, vocab, temperature, entropy, entropy_grad):
            w = weight[:vocab]
            n = hidden.shape[0]
            step = chunk_tokens(vocab)
            lse = hidden.new_empty(n, dtype=torch.float32)
            picked = torch.empty_like(lse)
            ent = torch.empty_like(lse) if entropy else lse.new_empty(0)
            keep = (
                any(ctx.needs_input_grad[:2])
                and not entropy_grad
                and 4 * n * vocab <= KEPT_PROBS_BYTES
            )
            # kept: one [tokens, vocab] fp32 buffer, each chunk's logits written in place, so
            # the backward runs its weight gradient as one GEMM over all the tokens
            kept = hidden.new_empty((n, vocab), dtype=torch.float32) if keep else None
            with torch.no_grad():
                for i in range(0, n, step):
                    out = kept[i : i + step] if kept is not None else None
                    x = _chunk_logits(hidden[i : i + step], w, temperature, out)
                    picked[i : i + step] = x.gather(-1, labels[i : i + step, None])[:, 0]
                    lse[i : i + step], chunk_ent, probs = _lse_and_entropy(x, entropy, keep)
                    if chunk_ent is not None:  # with `entropy`
                        ent[i : i + step] = chunk_ent
                    if out is not None and probs is not out:
                        out.copy_(probs)
            ctx.probs = kept
            picked -= lse
            ctx.save_for_backward(hidden, weight, labels, lse, ent)
            ctx.settings = (vocab, temperature, entropy_grad)
            if not entropy_grad:
                ctx.mark_non_differentiable(ent)
            return picked, ent

        @staticmethod
        def backward(ctx, grad_picked, grad_ent):
            hidden, weight, labels, lse, ent = ctx.saved_tensors
            vocab, temperature, entropy_grad = ctx.settings
            w = weight[:vocab]
            want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            grad_h = torch.zeros_like(hidden) if want_h else None
            wgrad = _WeightGrad(weight, vocab, hidden.dtype) if want_w else None
            if grad_picked is None:
                grad_picked = torch.zeros_like(lse)
            step = chunk_tokens(vocab)
            kept, ctx.probs = ctx.probs, None
            if kept is not None:  # the forward's probabilities: no logits recomputed
                chunks = [(0, hidden.shape[0], kept)]
            else:
                chunks = [(i, i + step, None) for i in range(0, hidden.shape[0], step)]
            with_entropy = entropy_grad and grad_ent is not None
            for i, j, probs in chunks:
                h = hidden[i:j]
                # d log p(label) / dx = onehot - p, scaled by the upstream gradient; the chunk's
                # [tokens, vocab] passes run in place unless the entropy term needs x and p again
                upstream = -grad_picked[i:j, None]
                if probs is not None:
                    g = probs.mul_(upstream)
                elif with_entropy:
                    x = _chunk_logits(h, w, temperature)
                    p = (x - lse[i:j, None]).exp_()
                    g = p * upstream
                else:
                    x = _chunk_logits(h, w, temperature)
                    g = x.sub_(lse[i:j, None]).exp_().mul_(upstream)
                g.scatter_add_(-1, labels[i:j, None], grad_picked[i:j, None])
                if with_entropy:
                    # d H / dx = -p (x - E[x]), E[x] = lse - H
                    mean = (lse[i:j] - ent[i:j])[:, None]
                    g -= grad_ent[i:j, None] * p * (x - mean)
                if temperature != 1.0:
                    g /= temperature
                g = g.to(hidden.dtype)
                if grad_h is not None:  # row chunks: faster than one GEMM over all tokens
                    for k in range(i, j, step):
                        grad_h[k : k + step] = g[k - i : k - i + step] @ w
                if wgrad is not None:
                    wgrad.add(g, h)
                del g
            grad_w = wgrad.result() if wgrad is not None else None
            return grad_h, grad_w, None, None, None, None, None

    return HeadLogProbs


class _WeightGrad:
    """The output layer's weight gradient, summed over chunks of tokens. Into megatron's
    `main_grad` where DDP wraps the weight (gradient-accumulation fusion: no [vocabulary,
    hidden] gradient per micro-batch, no sum with a tied embedding's, no add by DDP's hook):
    inside the GEMM at fp32, one bf16 GEMM added into the fp32 buffer at bf16. Else a fresh
    gradient, summed in fp32, returned in the weight's dtype."""

    def __init__(self, weight: torch.Tensor, vocab: int, compute_dtype: torch.dtype) -> None:
        self.weight, self.vocab = weight, vocab
        self.into_main = _accumulates_into_main_grad(weight)
        # an attribute megatron puts on the tensor (torch does not declare it)
        self.fused = self.into_main and weight.main_grad.dtype == compute_dtype  # type: ignore[attr-defined]
        self.grad: torch.Tensor | None = None

    def add(self, g: torch.Tensor, h: torch.Tensor) -> None:
        import torch

        rows = slice(0, self.vocab)
        if self.into_main:
            # an attribute megatron puts on the tensor (torch does not declare it)
            main = self.weight.main_grad  # type: ignore[attr-defined]
            if self.fused:
                main[rows].addmm_(g.t(), h)  # accumulated inside the GEMM
            else:
                add_mixed_(main[rows], g.t() @ h)
            return
        if self.grad is None:
            self.grad = torch.zeros(self.weight.shape, dtype=torch.float32, device=h.device)
        if g.dtype == torch.float32:
            self.grad[rows].addmm_(g.t(), h)
        else:
            self.grad[rows] += g.t() @ h

    def result(self) -> torch.Tensor | None:
        if self.into_main:
            return _main_grad_placeholder(self.weight)
        return None if self.grad is None else self.grad.to(self.weight.dtype)


MIXED_ADD_ROWS = 4096  # rows of a [vocabulary, hidden] gradient converted at a time


def add_mixed_(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`dst += src` for a bf16 `src` into an fp32 `dst`, a block of rows at a time: torch
    converts the whole of `src` to a fresh fp32 temporary first (113 MB for SmolLM2's head,
    each page of it faulted in anew); in blocks the temporary is small and reused."""
    for i in range(0, dst.shape[0], MIXED_ADD_ROWS):
        dst[i : i + MIXED_ADD_ROWS].add_(src[i : i + MIXED_ADD_ROWS])


def _lse_and_entropy(
    x: torch.Tensor, entropy: bool, keep_probs: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """A chunk's log-sum-exp, (with `entropy`) entropy and (with `keep_probs`) probabilities,
    overwriting the logits `x`: one [tokens, vocabulary] temporary at most (the entropy's
    exponentials), where logsumexp and `p * x` made three, each a fresh allocation the size
    of the chunk."""
    top = x.amax(-1, keepdim=True)
    shifted = x.sub_(top)
    e = shifted.exp() if entropy else shifted.exp_()
    total = e.sum(-1)
    ent = None
    if entropy:
        # H = log(sum e) - sum(e * shifted) / sum(e): closer to an fp64 reference than
        # lse - sum(p * x), and it reuses the exponentials instead of making p and p * x
        ent = total.log() - shifted.mul_(e).sum(-1) / total
    probs = e.div_(total[:, None]) if keep_probs else None
    return top[:, 0] + total.log(), ent, probs


def _accumulates_into_main_grad(weight: torch.Tensor) -> bool:
    """megatron's gradient-accumulation fusion for the output layer: a weight megatron's DDP
    wraps (it has `main_grad` and the `grad_added_to_main_grad` flag), whose gradient buffer
    the weight-gradient GEMM can add into directly. Saves a [vocabulary, hidden] gradient per
    micro-batch, its sum with a tied embedding's and the add into `main_grad` (each a fresh
    allocation of ~113 MB for SmolLM2 in fp32; under bf16 also its conversions)."""
    main = getattr(weight, "main_grad", None)
    return (
        main is not None
        and hasattr(weight, "grad_added_to_main_grad")
        and main.shape == weight.shape
    )


def _main_grad_placeholder(weight: torch.Tensor) -> torch.Tensor | None:
    """What the backward returns for a weight whose gradient went into `main_grad`, as
    megatron's fused linear does: with a tied embedding on the stage (`zero_out_wgrad`), the
    embedding's own gradient reaches DDP's hook, which adds it (None here adds nothing);
    otherwise an uninitialised tensor the hook skips (`grad_added_to_main_grad`) but whose
    arrival still tells an overlapping gradient reduction that the weight is done."""
    import torch

    # an attribute megatron puts on the tensor (torch does not declare it)
    weight.grad_added_to_main_grad = True  # type: ignore[attr-defined]
    if getattr(weight, "zero_out_wgrad", False):
        return None
    return torch.empty_like(weight)
