"""Moving a training rank's state between device and host memory around rollout.

megatron-core's RL offload hooks (>= 0.14) for the optimizer state and grad buffers;
parameters are moved tensor by tensor. On CPU the training state already lives in host
memory, so there is nothing to move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mindrl.config.generate import GenerateConfig


@dataclass
class TrainingStateOffload:
    """Which parts of the training state leave the device while the engine generates."""

    model_chunks: list[Any]
    optimizer: Any
    gen: GenerateConfig
    accelerator: str

    def to_host(self) -> None:
        self._move(to_host=True)

    def to_device(self) -> None:
        self._move(to_host=False)

    def _move(self, to_host: bool) -> None:
        from mindrl.accelerator import get_accelerator

        acc = get_accelerator(self.accelerator)
        if acc.is_cpu:
            return
        gen = self.gen
        if gen.offload_train_optimizer:
            hook = "offload_to_cpu" if to_host else "restore_from_cpu"
            if hasattr(self.optimizer, hook):
                getattr(self.optimizer, hook)()
        if gen.offload_train_grad:
            hook = "offload_grad_buffers" if to_host else "restore_grad_buffers"
            for chunk in self.model_chunks:
                if hasattr(chunk, hook):
                    getattr(chunk, hook)()
        if gen.offload_train_param:
            device = "cpu" if to_host else acc.device(0)
            for chunk in self.model_chunks:
                for p in chunk.parameters():
                    p.data = p.data.to(device, non_blocking=True)
        acc.synchronize()
