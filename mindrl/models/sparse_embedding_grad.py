"""The word embedding's weight gradient as a sparse tensor, for a CPU model megatron's DDP trains.

megatron's `VocabParallelEmbedding` looks its rows up with `F.embedding`, whose backward builds
a dense [vocabulary, hidden] gradient: zero-filled, written at the micro-batch's few hundred
rows, then added into DDP's `main_grad` by its hook. On CPU each micro-batch's zero-fill
touches fresh pages (SmolLM2: 113 MB, ~150 ms of page faults in the update's profile). With
`sparse=True` the gradient is the rows' values and indices, which the hook adds the same way
(`main_grad.add_` takes a sparse tensor): no dense temporary. Only weights marked here take
it, so forward-only models, code that reads a dense `.grad`, and other devices (whose caching
allocators make the fill cheap) keep megatron's dense gradient.
"""

from __future__ import annotations

from typing import Any

_MARK = "mindrl_sparse_grad"


class _Functional:
    """`torch.nn.functional` as megatron's `tensor_parallel.layers` sees it: `embedding` of a
    marked weight takes a sparse gradient; everything else is torch's."""

    def __init__(self, functional: Any) -> None:
        self._functional = functional

    def __getattr__(self, name: str) -> Any:
        return getattr(self._functional, name)

    def embedding(self, input: Any, weight: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A002
        if getattr(weight, _MARK, False):
            kwargs["sparse"] = True
        return self._functional.embedding(input, weight, *args, **kwargs)


def sparse_embedding_grads(model: Any) -> int:
    """Mark the trainable word embeddings on CPU of `model` (a module megatron's DDP wraps, or
    the module it wraps); returns how many were marked."""
    from megatron.core.tensor_parallel import layers

    if not isinstance(layers.F, _Functional):
        layers.F = _Functional(layers.F)
    marked = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if (
            isinstance(module, layers.VocabParallelEmbedding)
            and weight is not None
            and weight.device.type == "cpu"
            and weight.requires_grad
        ):
            setattr(weight, _MARK, True)
            marked += 1
    return marked
