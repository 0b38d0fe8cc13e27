"""The output layer and the log-softmax over the vocabulary, a chunk of tokens at a time.

The policy loss needs one number per scored token (its log-prob, and its entropy), but the
plain path holds the scored tokens' logits over the whole vocabulary several times over for
the backward pass: the output layer's result, the log-softmax saved by autograd, their
gradients (SmolLM2, 512 scored tokens x 49k vocabulary: 100 MB each, ~0.8 GB in all). Here
the logits of `chunk` tokens exist at a time: the forward keeps each token's log-sum-exp,
and the probabilities once (`KEPT_PROBS_BYTES`) where they are small enough, else the
backward recomputes a chunk's logits (one extra output-layer matmul); a chunk's gradient goes
straight into the hidden states' and the weight's gradients (into megatron's `main_grad`
where DDP wraps the weight).

Same numbers as `log_probs_and_entropy` over `hidden @ weight.T` (fp32 softmax over logits in
the weight's dtype), for one tensor-parallel rank holding the whole vocabulary; vocabulary
rows at or past `vocab_size` (padding) get no probability.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

CHUNK_BYTES = 32 << 20  # fp32 logits of one chunk of tokens
# A call's fp32 probabilities up to this size are kept from the forward for the backward
# (SmolLM2's update micro-batch: ~140 MB), which then recomputes no logits (one output-layer
# GEMM per chunk; the e2e update 26.8 -> 26.2 s); larger calls recompute them chunk by chunk.
KEPT_PROBS_BYTES = 256 << 20


def chunk_tokens(vocab: int) -> int:
    return max(1, CHUNK_BYTES // (4 * vocab))


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    x = (hidden @ weight.t()).float()
    return x / temperature if temperature != 1.0 else x


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
    picked, ent = _HeadLogProbs.apply(
        hidden, weight, labels, vocab, temperature, entropy, entropy and entropy_grad
    )
    return picked, ent if entropy else None


class _HeadLogProbs:  # a torch.autograd.Function, made on first use (torch imported lazily)
    _fn: Any = None

    @classmethod
    def apply(cls, *args: Any) -> Any:
        if cls._fn is None:
            cls._fn = _make_function()
        return cls._fn.apply(*args)


def _make_function() -> Any:
    import torch

    class HeadLogProbs(torch.autograd.Function):
        @staticmethod
        def forward(ctx, hidden, weight, labels, vocab, temperature, entropy, entropy_grad):  # type: ignore[no-untyped-def]
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
            ctx.probs = [] if keep else None
            with torch.no_grad():
                for i in range(0, n, step):
                    x = _chunk_logits(hidden[i : i + step], w, temperature)
                    picked[i : i + step] = x.gather(-1, labels[i : i + step, None])[:, 0]
                    lse[i : i + step], chunk_ent, probs = _lse_and_entropy(x, entropy, keep)
                    if entropy:
                        ent[i : i + step] = chunk_ent
                    if keep:
                        ctx.probs.append(probs)
            picked -= lse
            ctx.save_for_backward(hidden, weight, labels, lse, ent)
            ctx.settings = (vocab, temperature, entropy_grad)
            if not entropy_grad:
                ctx.mark_non_differentiable(ent)
            return picked, ent

        @staticmethod
        def backward(ctx, grad_picked, grad_ent):  # type: ignore[no-untyped-def]
            hidden, weight, labels, lse, ent = ctx.saved_tensors
            vocab, temperature, entropy_grad = ctx.settings
            w = weight[:vocab]
            want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            grad_h = torch.zeros_like(hidden) if want_h else None
            into_main = want_w and _accumulates_into_main_grad(weight, hidden.dtype)
            grad_w = None
            if into_main:
                grad_w = weight.main_grad
            elif want_w:
                grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            if grad_picked is None:
                grad_picked = torch.zeros_like(lse)
            step = chunk_tokens(vocab)
            with_entropy = entropy_grad and grad_ent is not None
            kept, ctx.probs = ctx.probs, None
            for k, i in enumerate(range(0, hidden.shape[0], step)):
                h = hidden[i : i + step]
                # d log p(label) / dx = onehot - p, scaled by the upstream gradient; the chunk's
                # [tokens, vocab] passes run in place unless the entropy term needs x and p again
                upstream = -grad_picked[i : i + step, None]
                if kept is not None:  # the forward's probabilities: no logits recomputed
                    g = kept[k].mul_(upstream)
                    kept[k] = None
                elif with_entropy:
                    x = _chunk_logits(h, w, temperature)
                    p = (x - lse[i : i + step, None]).exp_()
                    g = p * upstream
                else:
                    x = _chunk_logits(h, w, temperature)
                    g = x.sub_(lse[i : i + step, None]).exp_().mul_(upstream)
                g.scatter_add_(-1, labels[i : i + step, None], grad_picked[i : i + step, None])
                if with_entropy:
                    # d H / dx = -p (x - E[x]), E[x] = lse - H
                    mean = (lse[i : i + step] - ent[i : i + step])[:, None]
                    g -= grad_ent[i : i + step, None] * p * (x - mean)
                if temperature != 1.0:
                    g /= temperature
                g = g.to(hidden.dtype)
                if grad_h is not None:
                    grad_h[i : i + step] = g @ w
                if grad_w is not None and g.dtype == grad_w.dtype:
                    grad_w[:vocab].addmm_(g.t(), h)  # accumulated inside the GEMM
                elif grad_w is not None:
                    grad_w[:vocab] += (g.t() @ h).float()
            if into_main:
                grad_w = _main_grad_placeholder(weight)
            elif grad_w is not None:
                grad_w = grad_w.to(weight.dtype)
            return grad_h, grad_w, None, None, None, None, None

    return HeadLogProbs


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
        # H = log(sum e) - sum(e * shifted) / sum(e); closer to an fp64 reference than
        # lse - sum(p * x) (8e-7 against 1.2e-5 at 49k logits of scale 3), and ~6x faster
        ent = total.log() - shifted.mul_(e).sum(-1) / total
    probs = e.div_(total[:, None]) if keep_probs else None
    return top[:, 0] + total.log(), ent, probs


def _accumulates_into_main_grad(weight: torch.Tensor, compute_dtype: torch.dtype) -> bool:
    """megatron's gradient-accumulation fusion for the output layer: a weight megatron's DDP
    wraps (it has `main_grad` and the `grad_added_to_main_grad` flag) whose fp32 main
    gradient the weight-gradient GEMM can add into directly (fp32 compute). Saves a
    [vocabulary, hidden] gradient per micro-batch, its sum with a tied embedding's and the
    add into `main_grad` (each a fresh allocation of ~113 MB for SmolLM2)."""
    import torch

    main = getattr(weight, "main_grad", None)
    return (
        main is not None
        and hasattr(weight, "grad_added_to_main_grad")
        and main.dtype == torch.float32 == compute_dtype
        and main.shape == weight.shape
    )


def _main_grad_placeholder(weight: torch.Tensor) -> torch.Tensor | None:
    """What the backward returns for a weight whose gradient went into `main_grad`, as
    megatron's fused linear does: with a tied embedding on the stage (`zero_out_wgrad`), the
    embedding's own gradient reaches DDP's hook, which adds it (None here adds nothing);
    otherwise an uninitialised tensor the hook skips (`grad_added_to_main_grad`) but whose
    arrival still tells an overlapping gradient reduction that the weight is done."""
    import torch

    weight.grad_added_to_main_grad = True
    if getattr(weight, "zero_out_wgrad", False):
        return None
    return torch.empty_like(weight)
