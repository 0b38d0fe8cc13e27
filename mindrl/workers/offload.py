"""A training rank's state between the training device and host memory around rollout, and
the ledger that measures it.

The same calls on every device and every megatron-core version (no optional megatron
hooks): each unique storage of the selected parts is copied into a host buffer (pinned off
CPU) and its device memory released with ``untyped_storage().resize_(0)``; on the way back
the storage is resized and the bytes copied in. Tensors keep their storage object, so every
view (``param.main_grad``, bucket views, the optimizer's references) is valid again after
the restore. On CPU the "device" is host memory too, and the storages still really leave
their tensors: the ledger sees them go and come back.

Parts, each a set of unique storages on the training device, claimed in this order so no
storage is counted or moved twice:

- ``params``: the model chunks' parameters (and DDP's ``param_data`` buffers, which the
  distributed optimizer's parameters view);
- ``grads``: DDP's grad buffers (``buffers`` / ``expert_parallel_buffers`` ``.grad_data``,
  which ``param.main_grad`` views), any ``.grad`` / ``.main_grad`` outside them. Their
  contents are not kept (as megatron's own grad offload does): they come back zeroed, and
  the update zeroes them before its first micro-batch anyway;
- ``optimizer``: the inner torch optimizer(s)' parameters that are not model parameters
  (fp32 master copies of the mixed-precision / distributed optimizer:
  ``fp32_from_float16_groups``, ``shard_fp32_from_float16_groups``) and their state
  (Adam's ``exp_avg`` / ``exp_avg_sq``, ``step``); ``ChainedOptimizer`` is walked. With the
  fp32 optimizer its parameters *are* the model's: they belong to ``params``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mindrl.config.generate import GenerateConfig
from mindrl.rollout.host_release import storage_bytes

PARTS = ("params", "grads", "optimizer")
KEEPS_CONTENTS = {"params": True, "grads": False, "optimizer": True}
_MASTER_GROUPS = ("fp32_from_float16_groups", "shard_fp32_from_float16_groups")


def torch_optimizers(optimizer: Any) -> Iterator[tuple[Any, Any]]:
    """(megatron wrapper, inner torch optimizer) pairs under `optimizer` (a megatron
    optimizer, a ChainedOptimizer of them, or a plain torch optimizer)."""
    import torch

    if optimizer is None:
        return
    if isinstance(optimizer, torch.optim.Optimizer):
        yield optimizer, optimizer
        return
    chained = getattr(optimizer, "chained_optimizers", None)
    if chained is not None:  # before `.optimizer`: ChainedOptimizer's asserts one member
        for sub in chained:
            yield from torch_optimizers(sub)
        return
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer):
        yield optimizer, inner
    elif inner is not None:
        yield from torch_optimizers(inner)


def _ddp_buffers(chunk: Any) -> list[Any]:
    """megatron DDP's param-and-grad buffers (an instance list that shadows nn.Module's
    ``buffers()`` method; a plain module has none)."""
    out: list[Any] = []
    for name in ("buffers", "expert_parallel_buffers"):
        value = getattr(chunk, name, None)
        if isinstance(value, (list, tuple)):
            out.extend(value)
    return out


class _Claims:
    """Unique storages on one device type, first claim wins."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.seen: set[int] = set()

    def take(self, tensors: Iterable[Any]) -> list[Any]:
        import torch

        out = []
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            if storage.device.type != self.device_type:
                continue
            key = storage._cdata  # the StorageImpl: stable across resize_, shared by views
            if key not in self.seen:
                self.seen.add(key)
                out.append(storage)
        return out


def training_storages(
    model_chunks: list[Any], optimizer: Any, device_type: str
) -> dict[str, list[Any]]:
    """The unique storages of each part on `device_type` (see the module docstring)."""
    claims = _Claims(device_type)
    model_params = [p for chunk in model_chunks for p in chunk.parameters()]
    buffers = [b for chunk in model_chunks for b in _ddp_buffers(chunk)]
    opts = list(torch_optimizers(optimizer))
    opt_params = [p for _, opt in opts for g in opt.param_groups for p in g["params"]]
    masters = [
        p
        for wrapper, _ in opts
        for name in _MASTER_GROUPS
        for group in (getattr(wrapper, name, None) or [])
        for p in group
    ]
    out = {
        "params": claims.take([*model_params, *(getattr(b, "param_data", None) for b in buffers)])
    }
    out["grads"] = claims.take(
        [
            *(getattr(b, "grad_data", None) for b in buffers),
            *(getattr(p, "main_grad", None) for p in model_params),
            *(p.grad for p in [*model_params, *opt_params, *masters]),
        ]
    )
    state = [v for _, opt in opts for s in opt.state.values() for v in s.values()]
    out["optimizer"] = claims.take([*masters, *opt_params, *state])
    return out


@dataclass
class _Moved:
    part: str
    storage: Any  # torch.UntypedStorage, resized to 0 while moved
    nbytes: int
    host: Any  # uint8 host tensor with the bytes, or None (contents dropped)


@dataclass
class TrainingStateOffload:
    """Which parts of the training state leave the device while the engine generates
    (``generate_config.offload_train_param / _grad / _optimizer``), and the ledger of what
    is resident."""

    model_chunks: list[Any]
    optimizer: Any  # megatron optimizer (or ChainedOptimizer, or a torch optimizer)
    gen: GenerateConfig
    accelerator: str
    _moved: list[_Moved] = field(default_factory=list, init=False, repr=False)
    _host_cache: dict[int, Any] = field(default_factory=dict, init=False, repr=False)

    @property
    def parts(self) -> tuple[str, ...]:
        """The parts generate_config asks to offload."""
        gen = self.gen
        wanted = {
            "params": gen.offload_train_param,
            "grads": gen.offload_train_grad,
            "optimizer": gen.offload_train_optimizer,
        }
        return tuple(p for p in PARTS if wanted[p])

    @property
    def is_offloaded(self) -> bool:
        return bool(self._moved)

    def _acc(self) -> Any:
        from mindrl.accelerator import get_accelerator

        return get_accelerator(self.accelerator)

    # -- the ledger ---------------------------------------------------------------------------
    def storages(self) -> dict[str, list[Any]]:
        return training_storages(self.model_chunks, self.optimizer, self._acc().device().type)

    def resident_bytes(self) -> dict[str, int]:
        """Bytes of each part resident on the training device, from the tensors' storages."""
        return {part: sum(s.nbytes() for s in group) for part, group in self.storages().items()}

    def offloaded_bytes(self) -> int:
        """Bytes held in host buffers for the moved storages."""
        return sum(m.nbytes for m in self._moved if m.host is not None)

    def released_bytes(self) -> dict[str, int]:
        """Bytes that left the device, per part (kept in host buffers or dropped)."""
        out = dict.fromkeys(PARTS, 0)
        for m in self._moved:
            out[m.part] += m.nbytes
        return out

    # -- moving -------------------------------------------------------------------------------
    def to_host(self) -> dict[str, float]:
        """Move the configured parts off the device (idempotent); bytes per part, seconds."""
        import torch

        if self._moved or not self.parts:
            return {}
        start = time.perf_counter()
        acc = self._acc()
        pin = not acc.is_cpu
        groups = self.storages()
        moved: list[_Moved] = []
        with torch.no_grad():
            for part in self.parts:
                for storage in groups[part]:
                    nbytes = storage.nbytes()
                    if nbytes == 0:
                        continue
                    host = None
                    if KEEPS_CONTENTS[part]:
                        host = self._host_buffer(storage, nbytes, pin)
                        host.copy_(storage_bytes(storage), non_blocking=pin)
                    moved.append(_Moved(part, storage, nbytes, host))
            acc.synchronize()  # the copies are done before the memory goes
            for m in moved:
                m.storage.resize_(0)
        self._moved = moved
        acc.release_cached_memory()  # the engine allocates next
        return self._summary(moved, start)

    def to_device(self) -> dict[str, float]:
        """Bring the moved storages back (idempotent); bytes per part, seconds."""
        import torch

        if not self._moved:
            return {}
        start = time.perf_counter()
        acc = self._acc()
        pin = not acc.is_cpu
        moved, self._moved = self._moved, []
        with torch.no_grad():
            for m in moved:
                m.storage.resize_(m.nbytes)
                view = storage_bytes(m.storage)
                if m.host is None:
                    view.zero_()
                else:
                    view.copy_(m.host, non_blocking=pin)
            acc.synchronize()
        return self._summary(moved, start)

    def _host_buffer(self, storage: Any, nbytes: int, pin: bool) -> Any:
        """A host buffer for `storage`: pinned ones are kept for the next round trip
        (pinning is slow); on CPU a fresh one, dropped after the restore (host memory is
        the device memory there)."""
        import torch

        if not pin:
            return torch.empty(nbytes, dtype=torch.uint8)
        key = storage._cdata
        buf = self._host_cache.get(key)
        if buf is None or buf.numel() != nbytes:
            buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            self._host_cache[key] = buf
        return buf

    @staticmethod
    def _summary(moved: list[_Moved], start: float) -> dict[str, float]:
        out: dict[str, float] = dict.fromkeys(PARTS, 0.0)
        for m in moved:
            out[m.part] += m.nbytes
        out["seconds"] = time.perf_counter() - start
        return out
