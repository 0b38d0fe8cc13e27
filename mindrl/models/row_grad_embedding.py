"""The word embedding's gradient as the rows a micro-batch looked up (on CPU, under DDP).

megatron's embedding backward makes a dense [vocabulary, hidden] gradient per micro-batch
(zero-filled, the looked-up rows scattered in), which megatron's DDP hook then adds into the
fp32 `main_grad` (under bf16 through a fresh fp32 copy of the whole gradient). A micro-batch
touches a small share of the vocabulary's rows, so nearly all of the work of filling,
converting and adding the whole matrix goes to rows whose gradient is zero.
Here the lookup's gradient is torch's sparse one (`F.embedding(..., sparse=True)`): DDP's
hook adds it into `main_grad` as it adds a dense one (`add_` of a sparse tensor: the rows
only, summed where a token repeats), and autograd sums it with the tied output layer's dense
gradient where that one is made (megatron's own output layer).

Only where the gradient goes into DDP's `main_grad` (a bare parameter's sparse gradient
would reach an optimizer that takes dense ones), with one tensor-parallel rank (no vocabulary
masking, no reduce-scatter), and on CPU only (`models/gpt.py` applies it there), where the
dense matrix's fill and add were measured to dominate the embedding's backward.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def _row_grad_class(base: type) -> type:
    """`base` (megatron's VocabParallelEmbedding) with a sparse-gradient lookup where it
    applies; megatron's own forward otherwise."""

    class RowGradEmbedding(base):
        row_grads = True

        def forward(self, input_: Any) -> Any:
            import torch

            weight = self.weight
            if (
                torch.is_grad_enabled()
                and weight.requires_grad
                and hasattr(weight, "main_grad")
                and self.tp_group.size() == 1
                and not self.reduce_scatter_embeddings
                and not self.deterministic_mode
            ):
                return torch.nn.functional.embedding(input_, weight, sparse=True)
            return super().forward(input_)

    RowGradEmbedding.__name__ = RowGradEmbedding.__qualname__ = f"RowGrad{base.__name__}"
    return RowGradEmbedding


def use_row_grad_embedding(model: Any) -> bool:
    """Give `model`'s word embedding (a GPTModel chunk with the embedding stage) the
    sparse-gradient lookup; returns whether it has one."""
    embedding = getattr(getattr(model, "embedding", None), "word_embeddings", None)
    if embedding is None:
        return False
    if not getattr(embedding, "row_grads", False):
        embedding.__class__ = _row_grad_class(embedding.__class__)
    return True
