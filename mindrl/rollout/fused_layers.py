"""Which checkpoint tensors fill which vLLM layer: vLLM fuses q/k/v and gate/up projections
into one layer each, and a weight reload must give a fused layer all its members at once
(`mindrl.rollout.vllm_engine`), so the engine groups a stream of HF-named tensors by the
layer they land in."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# Used when the model class does not say (vLLM's Llama/Qwen2 families use exactly this).
DEFAULT_PACKED_MODULES = {
    "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"],
}


# A routed expert's tensor (``model.layers.1.mlp.experts.7.down_proj.weight``): vLLM stacks
# every routed expert of a layer into one fused MoE layer (``model.layers.1.mlp.experts``).
ROUTED_EXPERT = re.compile(r"^(?P<layer>.*\.experts)\.\d+\.[^.]+\.[^.]+$")


def checkpoint_tensor_names(model_dir: str | Path) -> list[str]:
    """Tensor names in the HF folder's safetensors files (headers only, no data read)."""
    from safetensors import safe_open

    names: list[str] = []
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            names.extend(handle.keys())
    return names


@dataclass(frozen=True)
class FusedSlot:
    """Where one checkpoint tensor lands in vLLM's model."""

    layer: str  # the vLLM module path, e.g. ``model.layers.0.self_attn.qkv_proj``
    param: str  # ``weight`` / ``bias``
    index: int  # its place among the fused layer's parts (q, k, v: 0, 1, 2); 0 if not fused
    parts: int  # how many checkpoint tensors make the fused parameter; 1 if not fused


class FusedNames:
    """HF tensor names -> their `FusedSlot`, for a model's ``packed_modules_mapping``."""

    def __init__(self, packed: dict[str, list[str]]) -> None:
        self._packed = packed
        self._part_of = {
            part: (fused, i) for fused, parts in packed.items() for i, part in enumerate(parts)
        }

    def locate(self, name: str) -> FusedSlot:
        *path, param = name.split(".")
        index, parts = 0, 1
        for i, part in enumerate(path):
            found = self._part_of.get(part)
            if found is not None:
                path[i], index = found
                parts = len(self._packed[path[i]])
        return FusedSlot(".".join(path), param, index, parts)


class FusedLayerGrouper:
    """Maps HF tensor names to the vLLM layer that holds them, and knows each layer's members.

    ``model.layers.0.self_attn.k_proj.bias`` -> ``model.layers.0.self_attn.qkv_proj``, whose
    members are the q/k/v weights and biases found in the checkpoint;
    ``model.layers.1.mlp.experts.7.up_proj.weight`` -> ``model.layers.1.mlp.experts``, whose
    members are every routed expert's gate / up / down of that layer (vLLM's fused MoE layer
    is re-packed whole).
    """

    def __init__(self, checkpoint_names: Iterable[str], packed: dict[str, list[str]]) -> None:
        self._names = FusedNames(packed)
        self.members: dict[str, set[str]] = {}
        for name in checkpoint_names:
            self.members.setdefault(self.layer_of(name), set()).add(name)

    def layer_of(self, name: str) -> str:
        expert = ROUTED_EXPERT.match(name)
        if expert is not None:
            return expert.group("layer")
        return self._names.locate(name).layer
