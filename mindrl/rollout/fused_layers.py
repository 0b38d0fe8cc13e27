"""Which checkpoint tensors fill which vLLM layer: vLLM fuses q/k/v and gate/up projections
into one layer each, and a weight reload must give a fused layer all its members at once
(`mindrl.rollout.vllm_engine`), so the engine groups a stream of HF-named tensors by the
layer they land in."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

# Used when the model class does not say (vLLM's Llama/Qwen2 families use exactly this).
DEFAULT_PACKED_MODULES = {
    "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"],
}


def checkpoint_tensor_names(model_dir: str | Path) -> list[str]:
    """Tensor names in the HF folder's safetensors files (headers only, no data read)."""
    from safetensors import safe_open

    names: list[str] = []
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            names.extend(handle.keys())
    return names


class FusedLayerGrouper:
    """Maps HF tensor names to the vLLM layer that holds them, and knows each layer's members.

    ``model.layers.0.self_attn.k_proj.bias`` -> ``model.layers.0.self_attn.qkv_proj``, whose
    members are the q/k/v weights and biases found in the checkpoint.
    """

    def __init__(self, checkpoint_names: Iterable[str], packed: dict[str, list[str]]) -> None:
        self._to_packed = {part: fused for fused, parts in packed.items() for part in parts}
        self.members: dict[str, set[str]] = {}
        for name in checkpoint_names:
            self.members.setdefault(self.layer_of(name), set()).add(name)

    def layer_of(self, name: str) -> str:
        parts = name.split(".")[:-1]  # drop weight / bias
        return ".".join(self._to_packed.get(p, p) for p in parts)
