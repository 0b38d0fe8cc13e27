"""Per-token log-probs from megatron-core's GPTModel, under vocab and pipeline parallelism.

Vocab parallel: each TP rank holds logits for a slice of the padded vocabulary. The rows past
the real vocabulary (padding to a multiple of TP) are set to -inf before megatron's
vocab-parallel cross entropy (all-reduced max, sum-exp and target logit over the TP group), so
padding carries no probability. Autograd works through it (the trainer's loss uses it). The
per-token entropy starts from the same local slice (`masked_float_logits`) and all-reduces
its partial sums over the TP group.

The no-gradient pass through megatron's pipeline schedule that uses these is
`mindrl.models.forward_pass`.

Conventions: `input_ids` [B, S]; `attention_mask` [B, S] with 1 for real tokens (left or right
padding); log-probs [B, S-1], entry t = log p(input_ids[:, t+1] | input_ids[:, :t+1]).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mindrl.data.packing import round_up
from mindrl.models.parallel import tp_rank_size

if TYPE_CHECKING:
    import torch

    from mindrl.models.token_select import OutputHead, TokenSelection


def causal_attention_mask(
    seq_len: int, attention_mask: torch.Tensor | None = None, device: Any = None
) -> torch.Tensor:
    """megatron's boolean mask ([B or 1, 1, S, S], True = do not attend): causal, plus padded
    keys when `attention_mask` ([B, S], 1 = token) is given. Passing it explicitly also avoids
    megatron's default mask, which is built on "cuda"."""
    import torch

    if attention_mask is not None:
        device = attention_mask.device
    mask = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), diagonal=1)
    mask = mask[None, None]
    if attention_mask is not None:
        mask = mask | ~attention_mask.bool()[:, None, None, :]
    return mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens (0 at the first one), as HF generation does."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def masked_float_logits(
    logits: torch.Tensor, vocab_size: int | None, temperature: float
) -> torch.Tensor:
    """fp32 copy of the local logits / temperature with padded vocab rows at -inf."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    if vocab_size is not None:
        tp_rank, _ = tp_rank_size()
        first_pad = vocab_size - tp_rank * logits.shape[-1]
        if first_pad < logits.shape[-1]:
            if x is logits:  # copy only when padding rows must be written
                x = x.clone()
            x[..., max(first_pad, 0) :] = float("-inf")
    return x


def entropy_from_log_probs(logp: torch.Tensor) -> torch.Tensor:
    """-sum p log p over the last dim; padded rows (log p = -inf) add 0, not NaN, and so
    does their gradient (0 * -inf never appears, forward or backward)."""
    import torch

    finite = torch.where(torch.isinf(logp), torch.zeros_like(logp), logp)
    return -(logp.exp() * finite).sum(-1)


def vocab_parallel_entropy(logits: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
    """H = logsumexp(x) - sum(softmax(x) * x) over the full vocabulary, fp32, differentiable.

    `logits` is this TP rank's [..., V/TP] slice; rows >= vocab_size are padding and excluded.
    The partial sums are all-reduced over the TP group (identity backward, as megatron's
    vocab-parallel cross entropy does), so every TP rank returns the same entropy.
    """
    import torch

    x = masked_float_logits(logits, vocab_size, 1.0)
    _, tp_size = tp_rank_size()
    if tp_size == 1:
        return entropy_from_log_probs(torch.log_softmax(x, dim=-1))
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    with torch.no_grad():
        local_max = x.max(dim=-1, keepdim=True).values
        global_max = local_max.clone()
        dist.all_reduce(
            global_max, op=dist.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group()
        )
    shifted = x - global_max
    exp = torch.where(torch.isinf(shifted), torch.zeros_like(shifted), shifted.exp())
    sum_exp = reduce_from_tensor_model_parallel_region(exp.sum(-1))
    finite = torch.where(torch.isinf(shifted), torch.zeros_like(shifted), shifted)
    sum_exp_x = reduce_from_tensor_model_parallel_region((exp * finite).sum(-1))
    return sum_exp.log() - sum_exp_x / sum_exp


def vocab_parallel_log_probs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    vocab_size: int | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """log p(labels) (fp32, shape of labels) from this TP rank's logits slice [..., V/TP].

    `vocab_size` is the real vocabulary (rows >= it are padding and get no probability). The
    input logits are not modified.
    """
    x = masked_float_logits(logits, vocab_size, temperature)
    _, tp_size = tp_rank_size()
    if tp_size == 1:
        import torch

        return torch.log_softmax(x, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    if x is logits:  # megatron's vocab-parallel cross entropy overwrites its input with exp()
        x = x.clone()
    return -vocab_parallel_cross_entropy(x, labels)


def log_probs_and_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    vocab_size: int | None = None,
    temperature: float = 1.0,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(labels) at `temperature` and the per-token entropy (at temperature 1), sharing
    one log-softmax when the vocabulary is not split. The entropy carries gradients only with
    `entropy_grad` (an entropy bonus); otherwise it is a metric computed without autograd."""
    import torch

    _, tp_size = tp_rank_size()
    if tp_size == 1 and temperature == 1.0:
        logp = torch.log_softmax(masked_float_logits(logits, vocab_size, 1.0), dim=-1)
        picked = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            src = logp if entropy_grad else logp.detach()
            entropy = entropy_from_log_probs(src)
        return picked, entropy
    picked = vocab_parallel_log_probs(
        logits, labels, vocab_size=vocab_size, temperature=temperature
    )
    if entropy_grad:
        return picked, vocab_parallel_entropy(logits, vocab_size)
    with torch.no_grad():
        return picked, vocab_parallel_entropy(logits.detach(), vocab_size)


def scored_log_probs(
    output: torch.Tensor,
    head: OutputHead,
    selection: TokenSelection,
    tokens: torch.Tensor,
    *,
    vocab_size: int,
    temperature: float = 1.0,
    entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs [N], entropies [N] or None) of the selected tokens from the model's output
    under `select_tokens`: the selected hidden states when the head took the output layer's
    weight (applied here in chunks of tokens), else the logits."""
    from mindrl.models.head_log_probs import head_log_probs
    from mindrl.models.token_select import selected_logits

    labels = selection.labels(tokens)
    if head.weight is not None:
        return head_log_probs(
            output[0],
            head.weight,
            labels,
            vocab_size=vocab_size,
            temperature=temperature,
            entropy=entropy,
            entropy_grad=entropy_grad,
        )
    logits = selected_logits(output, selection)
    if entropy:
        if temperature != 1.0:
            raise ValueError("the entropy is taken at temperature 1")
        return log_probs_and_entropy(
            logits, labels, vocab_size=vocab_size, entropy_grad=entropy_grad
        )
    picked = vocab_parallel_log_probs(
        logits, labels, vocab_size=vocab_size, temperature=temperature
    )
    return picked, None


def gather_vocab_parallel_logits(
    logits: torch.Tensor, vocab_size: int | None = None
) -> torch.Tensor:
    """Full-vocabulary logits [..., vocab_size] from the TP slices (padding rows dropped)."""
    _, tp_size = tp_rank_size()
    if tp_size > 1:
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        logits = gather_from_tensor_model_parallel_region(logits)
    return logits if vocab_size is None else logits[..., :vocab_size]


def sequence_multiple(model_chunks: Sequence[Any]) -> int:
    """What every model input length must be a multiple of: 2 x CP under context parallelism
    (megatron's load-balanced chunks), times the TP size under sequence parallelism (the
    sequence is split over the TP ranks)."""
    from megatron.core import parallel_state as ps

    from mindrl.models.gpt import unwrap_model

    multiple = 1
    if ps.model_parallel_is_initialized() and ps.get_context_parallel_world_size() > 1:
        multiple = 2 * ps.get_context_parallel_world_size()
    if not getattr(unwrap_model(model_chunks[0]).config, "sequence_parallel", False):
        return multiple
    return multiple * ps.get_tensor_model_parallel_world_size()


def pad_columns(t: torch.Tensor, width: int) -> torch.Tensor:
    """`t` [B, S] right-padded with zeros to `width` columns."""
    import torch

    extra = width - t.shape[1]
    return t if extra <= 0 else torch.nn.functional.pad(t, (0, extra))


def micro_selection(response_mask: torch.Tensor, multiple: int = 1) -> TokenSelection:
    """The cells of one micro-batch whose log-probs are needed. Without pipeline parallelism
    the grid (and so the model input) is cut after the last needed column, rounded up to
    `multiple` (sequence parallelism; the caller pads the batch to a multiple); the pipeline's
    point-to-point buffers need one sequence length for every micro-batch, so with PP the
    full length is kept."""
    from dataclasses import replace

    from megatron.core import parallel_state as ps

    from mindrl.models.token_select import TokenSelection

    selection = TokenSelection.from_mask(response_mask)
    if ps.model_parallel_is_initialized() and ps.get_pipeline_model_parallel_world_size() > 1:
        return selection
    seq = min(round_up(selection.last_column() + 2, multiple), selection.seq)
    return replace(selection, seq=seq)
