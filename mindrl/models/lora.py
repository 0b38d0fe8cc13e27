"""Low-rank adapters on megatron-core's tensor-parallel linear layers (LoRA for RL).

A target layer (`linear_qkv`, `linear_proj`, `linear_fc1`, `linear_fc2`) becomes a subclass
of its column / row parallel linear that adds `scale * B(A(x))` to the frozen base output,
with `scale = lora_alpha / lora_r`. The split follows the base layer so every rank holds
only its part and the sum is exact at any TP:

- column parallel (output split): A `[r, in]` replicated, B `[out/tp, r]` split like the
  base's rows. The low-rank activation is gathered over the sequence (SP) or copied into the
  TP region (its backward sums B's partial gradients).
- row parallel (input split): A `[r, in/tp]` split like the base's columns, B `[out, r]`
  replicated. The partial low-rank activations are summed over TP (reduce-scattered along
  the sequence under SP), as the base output is.

Under sequence parallelism the replicated factor sees only this rank's tokens, so it is
marked `sequence_parallel` and megatron sums its gradient over TP like a norm's.
The base weight keeps its name (`...linear_qkv.weight`), so the HF mapping, the online
loader and the converters read LoRA models unchanged; the factors are `lora_A` / `lora_B`
beside it. `merged_weight` gives the weight the rollout engine and HF export need.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from megatron.core import tensor_parallel
from megatron.core.tensor_parallel import mappings
from megatron.core.transformer.spec_utils import ModuleSpec

from mindrl.config.megatron_features import LoRAConfig

_COLUMN = ("linear_qkv", "linear_fc1")


class _LoraMixin:
    """Shared by the column and row variants: factors, on/off switch, merged weight."""

    lora_A: torch.nn.Parameter
    lora_B: torch.nn.Parameter
    weight: torch.nn.Parameter

    def _add_factors(
        self, settings: LoRAConfig, a_shape: tuple[int, int], b_shape: tuple[int, int]
    ) -> None:
        dtype, device = self.weight.dtype, self.weight.device
        self.lora_scale = settings.scale
        self.lora_enabled = True
        self.lora_A = torch.nn.Parameter(torch.zeros(a_shape, dtype=dtype, device=device))
        self.lora_B = torch.nn.Parameter(torch.zeros(b_shape, dtype=dtype, device=device))
        # read by `effective_weight`; an attribute of ours on torch's Parameter
        self.weight.lora_owner = weakref.ref(self)  # type: ignore[attr-defined]

    def _across_tp(self, low: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _with_adapter(self, output: torch.Tensor, input_: torch.Tensor) -> torch.Tensor:
        """`output + scale * B(A(x))`, the low-rank activation moved across TP as the base
        layer's split requires (`_across_tp`); the base alone when the adapters are off."""
        if not self.lora_enabled:
            return output
        low = self._across_tp(torch.nn.functional.linear(input_, self.lora_A))
        return output + self.lora_scale * torch.nn.functional.linear(low, self.lora_B)

    def merged_weight(self) -> torch.Tensor:
        """This rank's shard of `W + scale * B @ A` (the base weight's layout and dtype)."""
        delta = self.lora_B.detach().float() @ self.lora_A.detach().float()
        return (self.weight.detach().float() + self.lora_scale * delta).to(self.weight.dtype)

    def _full_a_shape(self) -> tuple[int, int]:
        raise NotImplementedError

    def init_factors(self, generator: torch.Generator) -> None:
        """A from Kaiming-uniform on the *whole* matrix (then this rank's slice), B zero: the
        adapters start as the identity update and the same at every TP size."""
        rows, cols = self._full_a_shape()
        full = torch.empty(rows, cols)
        bound = 1.0 / math.sqrt(cols)  # kaiming_uniform_(a=sqrt(5)), as torch's Linear
        full.uniform_(-bound, bound, generator=generator)
        with torch.no_grad():
            self.lora_A.copy_(self._slice_a(full).to(self.lora_A.dtype))
            self.lora_B.zero_()

    def _slice_a(self, full: torch.Tensor) -> torch.Tensor:
        return full


class LoraColumnParallelLinear(_LoraMixin, tensor_parallel.ColumnParallelLinear):
    """ColumnParallelLinear + adapter (A replicated, B split along the output)."""

    def __init__(self, input_size: int, output_size: int, *, lora: LoRAConfig, **kwargs: Any):
        super().__init__(input_size, output_size, **kwargs)
        self._in = input_size
        out_local = self.weight.shape[0]
        self._add_factors(lora, (lora.lora_r, input_size), (out_local, lora.lora_r))
        tensor_parallel.set_tensor_model_parallel_attributes(self.lora_B, True, 0, 1)
        # an attribute megatron puts on the tensor (torch does not declare it)
        self.lora_A.sequence_parallel = self.sequence_parallel  # type: ignore[attr-defined]

    def _full_a_shape(self) -> tuple[int, int]:
        return (self.lora_A.shape[0], self._in)

    def forward(self, input_: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None):
        output, bias = super().forward(input_, weight, runtime_gather_output)
        return self._with_adapter(output, input_), bias

    def _across_tp(self, low: torch.Tensor) -> torch.Tensor:
        """A's output is whole on every rank: gathered over the sequence (SP), or entering
        the TP region (whose backward sums B's partial gradients)."""
        if self.sequence_parallel:
            return mappings.gather_from_sequence_parallel_region(low, group=self.tp_group)
        return mappings.copy_to_tensor_model_parallel_region(low, group=self.tp_group)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: Any = (), metadata: Any = None):
        return _sharded(
            self, prefix, {"weight": 0, "bias": 0, "lora_B": 0}, sharded_offsets, metadata
        )


class LoraRowParallelLinear(_LoraMixin, tensor_parallel.RowParallelLinear):
    """RowParallelLinear + adapter (A split along the input, B replicated)."""

    def __init__(self, input_size: int, output_size: int, *, lora: LoRAConfig, **kwargs: Any):
        super().__init__(input_size, output_size, **kwargs)
        if not self.input_is_parallel:
            raise ValueError("LoRA on a row-parallel layer expects its input already split")
        self._in = input_size
        in_local = self.weight.shape[1]
        self._add_factors(lora, (lora.lora_r, in_local), (output_size, lora.lora_r))
        tensor_parallel.set_tensor_model_parallel_attributes(self.lora_A, True, 1, 1)
        # an attribute megatron puts on the tensor (torch does not declare it)
        self.lora_B.sequence_parallel = self.sequence_parallel  # type: ignore[attr-defined]

    def _full_a_shape(self) -> tuple[int, int]:
        return (self.lora_A.shape[0], self._in)

    def _slice_a(self, full: torch.Tensor) -> torch.Tensor:
        width = self.lora_A.shape[1]
        rank = self.tp_group.rank() if self.tp_group.size() > 1 else 0
        return full[:, rank * width : (rank + 1) * width]

    def forward(self, input_: torch.Tensor):
        output, bias = super().forward(input_)
        return self._with_adapter(output, input_), bias

    def _across_tp(self, low: torch.Tensor) -> torch.Tensor:
        """A's outputs are partial sums over the input split: summed over TP, or
        reduce-scattered over the sequence (SP), as the base output is."""
        if self.sequence_parallel:
            return mappings.reduce_scatter_to_sequence_parallel_region(low, group=self.tp_group)
        return mappings.reduce_from_tensor_model_parallel_region(low, group=self.tp_group)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: Any = (), metadata: Any = None):
        return _sharded(self, prefix, {"weight": 1, "lora_A": 1}, sharded_offsets, metadata)


def _sharded(
    layer: Any, prefix: str, axes: dict[str, int], sharded_offsets: Any, metadata: Any
) -> dict[str, Any]:
    """The base layer's checkpoint layout plus the factors with their own split axes."""
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    return make_sharded_tensors_for_checkpoint(
        layer.state_dict(prefix="", keep_vars=True),
        prefix,
        axes,
        sharded_offsets,
        tp_group=layer.tp_group,
        dp_cp_group=(metadata or {}).get("dp_cp_group"),
    )


def is_lora_layer(module: Any) -> bool:
    return isinstance(module, _LoraMixin)


def is_lora_param(name: str) -> bool:
    return name.endswith(("lora_A", "lora_B"))


# -- building -------------------------------------------------------------------------------
def lora_layer_spec(layer: ModuleSpec, settings: LoRAConfig) -> ModuleSpec:
    """The transformer layer spec with its target linears swapped for the LoRA variants."""
    subs = layer.submodules
    attention = subs.self_attention.submodules
    mlp = subs.mlp.submodules
    if not hasattr(mlp, "linear_fc1"):
        raise ValueError("LoRA on mixture-of-experts layers is not built")

    def swap(name: str, current: Any) -> Any:
        if name not in settings.targets:
            return current
        base = current.module if isinstance(current, ModuleSpec) else current
        if base not in (tensor_parallel.ColumnParallelLinear, tensor_parallel.RowParallelLinear):
            raise ValueError(
                f"LoRA on {name}: built for megatron's local linear layers, this spec uses "
                f"{getattr(base, '__name__', base)}"
            )
        cls = LoraColumnParallelLinear if name in _COLUMN else LoraRowParallelLinear
        return ModuleSpec(module=cls, params={"lora": settings})

    attention = dataclasses.replace(
        attention,
        linear_qkv=swap("linear_qkv", attention.linear_qkv),
        linear_proj=swap("linear_proj", attention.linear_proj),
    )
    mlp = dataclasses.replace(
        mlp,
        linear_fc1=swap("linear_fc1", mlp.linear_fc1),
        linear_fc2=swap("linear_fc2", mlp.linear_fc2),
    )
    return dataclasses.replace(
        layer,
        submodules=dataclasses.replace(
            subs,
            self_attention=dataclasses.replace(subs.self_attention, submodules=attention),
            mlp=dataclasses.replace(subs.mlp, submodules=mlp),
        ),
    )


def lora_layers(model: Any) -> Iterator[tuple[str, Any]]:
    for name, module in model.named_modules():
        if is_lora_layer(module):
            yield name, module


def init_adapters(model: Any, seed: int) -> None:
    """Freeze every base parameter (embeddings, norms and output layer too) and seed each
    adapter by its *global* name, so A is the same whatever the TP / PP layout."""
    import re

    for name, param in model.named_parameters():
        param.requires_grad_(is_lora_param(name))
    local = re.compile(r"^decoder\.layers\.(\d+)\.")
    layer_numbers = [layer.layer_number - 1 for layer in model.decoder.layers]
    for name, layer in lora_layers(model):
        match = local.match(name)
        if match:
            name = local.sub(f"decoder.layers.{layer_numbers[int(match.group(1))]}.", name, count=1)
        digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
        layer.init_factors(torch.Generator().manual_seed(int.from_bytes(digest[:8], "little")))


@contextlib.contextmanager
def adapters_disabled(model_chunks: Sequence[Any]) -> Iterator[None]:
    """The frozen base model (MindSpeed-RL's `disable_adapter()`): the shared-backbone
    reference's forward."""
    layers = [layer for chunk in model_chunks for _, layer in lora_layers(chunk)]
    for layer in layers:
        layer.lora_enabled = False
    try:
        yield
    finally:
        for layer in layers:
            layer.lora_enabled = True


def effective_weight(param: torch.Tensor) -> torch.Tensor:
    """What a weight means outside training: merged with its adapter when it has one (the
    rollout engine and the HF export get `W + scale * B @ A`), else itself."""
    owner = getattr(param, "lora_owner", None)
    layer = owner() if owner is not None else None
    return layer.merged_weight() if layer is not None else param.detach()


def model_parameter_counts(model_chunks: Sequence[Any]) -> tuple[int, int]:
    """Collective over the model-parallel group: (trainable, all) parameters of the whole
    model, each TP-replicated tensor counted once and the last stage's copy of tied
    embeddings (megatron marks it `shared`) not at all."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    counts = torch.zeros(2, dtype=torch.float64)
    for chunk in model_chunks:
        for p in chunk.parameters():
            if param_is_not_tensor_parallel_duplicate(p) and not getattr(p, "shared", False):
                counts[0] += p.numel() if p.requires_grad else 0
                counts[1] += p.numel()
    if dist.is_initialized():
        dist.all_reduce(counts, group=ps.get_model_parallel_group())
    return int(counts[0]), int(counts[1])
