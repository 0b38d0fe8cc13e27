"""Online conversion: an HF folder straight into a TP/PP-sharded model, and back out.

`load_hf_into_mcore` runs on every rank of a training job: each rank reads, lazily from the
safetensors files, only the rows/columns its own parameters need, so no rank ever holds the
whole model. `iter_hf_tensors` gathers each parameter over its TP group on the stage that owns
it and brings the HF tensors to the first stage, one parameter at a time: the HF export streams
them into safetensors shards on rank 0, the trainer streams them into rollout engines.

MoE experts under expert parallelism: megatron-core gives each expert-parallel rank E / EP
consecutive experts, named by their local index (`mlp.experts.local_experts.{i}`), while
checkpoints and the mapping tables use the global index: rank r holds global experts
r x E / EP + i (`ExpertLayout`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindrl.checkpoint.errors import ConversionError
from mindrl.checkpoint.hf_io import (
    DEFAULT_MAX_SHARD_BYTES,
    HFCheckpointReader,
    HFShardWriter,
    copy_hf_assets,
    write_hf_config,
)
from mindrl.checkpoint.mapping import BoundRule, Split, bound_rules, hf_output_plan, te_name
from mindrl.checkpoint.mcore_io import ModelPart
from mindrl.checkpoint.transforms import hf_to_mcore_pieces, mcore_to_hf
from mindrl.config.model_arch import ModelArchConfig
from mindrl.models.dtypes import dtype_long_name, torch_dtype
from mindrl.models.gpt import unwrap_model
from mindrl.models.hf_arch import arch_from_hf_config, hf_config_from_arch

if TYPE_CHECKING:
    import torch

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_LOCAL_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.")


@dataclass(frozen=True)
class ExpertLayout:
    """This rank's share of each MoE layer's experts."""

    ep_rank: int = 0
    ep_size: int = 1
    num_local: int = 0

    def owner(self, expert: int) -> int:
        """The expert-parallel rank holding global expert `expert`."""
        return expert // self.num_local

    def is_local(self, expert: int) -> bool:
        return self.owner(expert) == self.ep_rank

    def local_name(self, name: str, expert: int) -> str:
        """`name` (global expert index) as this rank's model names it (local index)."""
        local = expert - self.ep_rank * self.num_local
        return _LOCAL_EXPERT.sub(f".mlp.experts.local_experts.{local}.", name, count=1)

    def global_name(self, name: str) -> str:
        """A parameter name of this rank's model with its expert index made global."""
        m = _LOCAL_EXPERT.search(name)
        if m is None:
            return name
        expert = self.ep_rank * self.num_local + int(m.group(1))
        return _LOCAL_EXPERT.sub(f".mlp.experts.local_experts.{expert}.", name, count=1)


def expert_layout(arch: ModelArchConfig) -> ExpertLayout:
    """The current rank's layout (megatron's parallel_state; EP=1 when it is not initialised)."""
    if not arch.is_moe:
        return ExpertLayout()
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return ExpertLayout(0, 1, arch.num_experts or 0)
    size = ps.get_expert_model_parallel_world_size()
    return ExpertLayout(ps.get_expert_model_parallel_rank(), size, (arch.num_experts or 0) // size)


# Buffers that are model state a checkpoint holds (DeepSeek's expert bias: `e_score_correction_
# bias`), kept in fp32 by megatron whatever the model's dtype.
STATE_BUFFERS = ("mlp.router.expert_bias",)


def model_tensors(gpt: Any) -> dict[str, Any]:
    """A model's parameters and the buffers of `STATE_BUFFERS`, by name."""
    tensors = dict(gpt.named_parameters())
    for name, buf in gpt.named_buffers():
        if name.endswith(STATE_BUFFERS):
            tensors[name] = buf
    return tensors


def global_layer_numbers(model: Any) -> list[int]:
    """0-based global index of each layer of this model chunk, in local order."""
    gpt = unwrap_model(model)
    return [layer.layer_number - 1 for layer in gpt.decoder.layers]


def _local_name(
    bound: BoundRule, local_of: dict[int, int], experts: ExpertLayout | None = None
) -> str:
    if bound.layer is None:
        return bound.mcore
    name = _LAYER.sub(f"decoder.layers.{local_of[bound.layer]}.", bound.mcore, count=1)
    if bound.expert is not None and experts is not None:
        name = experts.local_name(name, bound.expert)
    return name


def _find_param(params: dict[str, Any], name: str) -> tuple[str, Any] | None:
    for candidate in (name, te_name(name)):
        if candidate in params:
            return candidate, params[candidate]
    return None


def _parallel_defaults(
    tp_rank: int | None, tp_size: int | None, pp_rank: int | None, pp_size: int | None
) -> tuple[int, int, int, int]:
    if None in (tp_rank, tp_size, pp_rank, pp_size):
        from megatron.core import parallel_state as ps

        tp_rank = ps.get_tensor_model_parallel_rank() if tp_rank is None else tp_rank
        tp_size = ps.get_tensor_model_parallel_world_size() if tp_size is None else tp_size
        pp_rank = ps.get_pipeline_model_parallel_rank() if pp_rank is None else pp_rank
        pp_size = ps.get_pipeline_model_parallel_world_size() if pp_size is None else pp_size
    return tp_rank, tp_size, pp_rank, pp_size  # type: ignore[return-value]


def check_rope_scaling(arch: ModelArchConfig, hf_dir: str | Path) -> None:
    """The model file's RoPE scaling must be the checkpoint's: the rollout engine reads
    config.json, so a model file without Llama 3.1's scaling on a Llama 3.1 checkpoint would
    train on other positions than it samples with (the weights alone cannot tell)."""
    found = arch_from_hf_config(hf_dir).rope_scaling_hf()
    if found != arch.rope_scaling_hf():
        raise ConversionError(
            f"{Path(hf_dir) / 'config.json'} has RoPE scaling {found} but the model file "
            f"{arch.rope_scaling_hf()}: set rope_scaling_type, rope_scaling_factor, "
            "low_freq_factor, high_freq_factor and original_max_position_embeddings to match"
        )


def load_hf_into_mcore(
    model_chunks: Sequence[Any] | Any,
    hf_dir: str | Path,
    tp_rank: int | None = None,
    tp_size: int | None = None,
    pp_rank: int | None = None,
    pp_size: int | None = None,
    *,
    arch: ModelArchConfig | None = None,
    strict: bool = True,
    unmapped: tuple[str, ...] = (),
) -> ModelArchConfig:
    """Fill this rank's model chunks from an HF safetensors folder (no collective).

    TP/PP default to megatron's parallel_state. Layers are taken from each chunk's own global
    layer numbers, so any PP (or virtual-PP) partition works. With `strict`, every parameter of
    the chunks must be filled, except those whose names start with one of `unmapped` (the
    critic's value head, which no causal-LM checkpoint holds). Returns the architecture read from the HF config.
    """
    chunks = list(model_chunks) if isinstance(model_chunks, (list, tuple)) else [model_chunks]
    tp_rank, tp_size, pp_rank, pp_size = _parallel_defaults(tp_rank, tp_size, pp_rank, pp_size)
    if arch is None:
        arch = arch_from_hf_config(hf_dir)
    else:
        check_rope_scaling(arch, hf_dir)
    reader = HFCheckpointReader(hf_dir)
    experts = expert_layout(arch)
    try:
        for chunk in chunks:
            gpt = unwrap_model(chunk)
            layers = global_layer_numbers(gpt)
            local_of = {g: i for i, g in enumerate(layers)}
            params = model_tensors(gpt)
            filled: set[str] = set()
            for bound in bound_rules(arch, layers=layers, include_load_only=True):
                if bound.expert is not None and not experts.is_local(bound.expert):
                    continue  # another expert-parallel rank's expert
                found = _find_param(params, _local_name(bound, local_of, experts))
                if found is None:
                    if bound.layer is not None and not bound.rule.load_only:
                        raise ConversionError(
                            f"model has no parameter {bound.mcore} (pp_rank {pp_rank}): the "
                            "model was not built for this architecture"
                        )
                    continue  # embedding off the first stage, output layer off the last
                name, param = found
                if name.startswith(unmapped):
                    continue
                pieces = hf_to_mcore_pieces(bound, reader, arch, tp_rank, tp_size)
                _copy_pieces(param, pieces, bound)
                filled.add(name)
            missing = [
                n
                for n in params
                if n not in filled and not n.startswith(unmapped) and ModelPart.BASE.keeps(n)
            ]  # LoRA adapters are not in a base checkpoint
            if strict and missing:
                raise ConversionError(
                    f"HF checkpoint {hf_dir} leaves model parameters unset: {missing}"
                )
    finally:
        reader.close()
    return arch


def _copy_pieces(param: torch.Tensor, pieces: list[torch.Tensor], bound: BoundRule) -> None:
    import torch

    rows = sum(p.shape[0] for p in pieces)
    if rows != param.shape[0] or any(tuple(p.shape[1:]) != tuple(param.shape[1:]) for p in pieces):
        raise ConversionError(
            f"{bound.mcore}: HF tensors {list(bound.hf)} give "
            f"{[list(p.shape) for p in pieces]}, the model parameter is {list(param.shape)}"
        )
    with torch.no_grad():
        offset = 0
        for piece in pieces:
            n = piece.shape[0]
            param.data[offset : offset + n].copy_(piece)
            offset += n


# -- export -------------------------------------------------------------------------------------


def _owner_stage(bound: BoundRule, stage_layers: list[list[int]]) -> int:
    if bound.layer is not None:
        for stage, layers in enumerate(stage_layers):
            if bound.layer in layers:
                return stage
        raise ConversionError(f"no pipeline stage holds layer {bound.layer}")
    return 0 if bound.mcore.startswith("embedding.") else len(stage_layers) - 1


def local_params_by_global_name(
    model_chunks: Sequence[Any], experts: ExpertLayout | None = None
) -> tuple[dict[str, Any], list[int]]:
    """This rank's parameters keyed by mcore name with *global* layer numbers (and global
    expert indices, given this rank's `experts`), and its layers."""
    params: dict[str, Any] = {}
    my_layers: list[int] = []
    for chunk in model_chunks:
        gpt = unwrap_model(chunk)
        layers = global_layer_numbers(gpt)
        for name, p in model_tensors(gpt).items():
            m = _LAYER.match(name)
            if m:
                name = _LAYER.sub(f"decoder.layers.{layers[int(m.group(1))]}.", name, count=1)
            if experts is not None:
                name = experts.global_name(name)
            params[name] = p
        my_layers.extend(layers)
    return params, my_layers


def iter_hf_tensors(
    model_chunks: Sequence[Any] | Any,
    arch: ModelArchConfig,
    *,
    to_tp_rank0_only: bool = True,
    rules: Sequence[BoundRule] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Collective over the model's ranks: yield (HF name, full tensor), one parameter at a
    time, on the first TP rank of the first pipeline stage of every data-parallel replica
    (on every rank when `to_tp_rank0_only` is false). Every rank must exhaust the iterator.

    TP shards are merged by the mapping table (fused QKV / gate-up split, vocab padding
    dropped); an expert reaches every expert-parallel rank of its stage from the rank that
    holds it; a stage's tensors reach stage 0 over the pipeline group. Used for the HF export
    and for streaming weights into rollout engines; `rules` (default: the model's weights)
    lets the PEFT export walk the LoRA factors the same way.
    """
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    chunks = list(model_chunks) if isinstance(model_chunks, (list, tuple)) else [model_chunks]
    experts = expert_layout(arch)
    params, my_layers = local_params_by_global_name(chunks, experts)
    ep_group = ps.get_expert_model_parallel_group() if experts.ep_size > 1 else None
    ep_ranks = dist.get_process_group_ranks(ep_group) if ep_group is not None else []
    tp_group = ps.get_tensor_model_parallel_group()
    tp_size = ps.get_tensor_model_parallel_world_size()
    tp_rank = ps.get_tensor_model_parallel_rank()
    pp_size = ps.get_pipeline_model_parallel_world_size()
    pp_rank = ps.get_pipeline_model_parallel_rank()
    pp_group = ps.get_pipeline_model_parallel_group()
    pp_ranks = dist.get_process_group_ranks(pp_group)
    stage_layers: list[Any] = [None] * pp_size
    dist.all_gather_object(stage_layers, my_layers, group=pp_group)
    dtype = next(iter(params.values())).dtype
    device = next(iter(params.values())).device

    def empty(bound: BoundRule) -> dict[str, torch.Tensor]:
        kind = torch.float32 if bound.mcore.endswith(STATE_BUFFERS) else dtype
        return {
            name: torch.empty(shape, dtype=kind, device=device)
            for name, shape in zip(bound.hf, bound.hf_shapes)
        }

    for bound in bound_rules(arch) if rules is None else rules:
        owner = _owner_stage(bound, stage_layers)
        tensors: dict[str, torch.Tensor] | None = None
        if pp_rank == owner:
            if bound.expert is None or experts.is_local(bound.expert):
                tensors = _gather_to_hf(bound, params, arch, tp_group, tp_size, tp_rank)
            if bound.expert is not None and ep_group is not None and tp_rank == 0:
                tensors = tensors if tensors is not None else empty(bound)
                for t in tensors.values():
                    dist.broadcast(t, src=ep_ranks[experts.owner(bound.expert)], group=ep_group)
        if pp_size > 1 and tp_rank == 0:  # the owner stage's TP rank 0 sends to the others
            tensors = tensors if tensors is not None else empty(bound)
            for t in tensors.values():
                dist.broadcast(t, src=pp_ranks[owner], group=pp_group)
        if not to_tp_rank0_only and tp_size > 1:
            tensors = tensors if tensors is not None else empty(bound)
            src = dist.get_process_group_ranks(tp_group)[0]
            for t in tensors.values():
                dist.broadcast(t, src=src, group=tp_group)
        if tensors is not None and (not to_tp_rank0_only or (tp_rank == 0 and pp_rank == 0)):
            yield from tensors.items()


def export_mcore_to_hf(
    model_chunks: Sequence[Any] | Any,
    out_dir: str | Path,
    *,
    arch: ModelArchConfig,
    hf_assets_dir: str | Path | None = None,
    hf_config: dict[str, Any] | None = None,
    params_dtype: str | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_BYTES,
    overwrite: bool = False,
) -> Path | None:
    """Collective over all ranks: write the model as an HF folder from global rank 0.

    config.json comes from `hf_config`, else `hf_assets_dir`/config.json (whose tokenizer
    files are copied too), else is generated from `arch`. Returns the folder on rank 0, None
    elsewhere. The folder is written atomically.
    """
    import torch.distributed as dist

    from mindrl.checkpoint.atomic import check_new_target, commit_temp, prepare_temp

    chunks = list(model_chunks) if isinstance(model_chunks, (list, tuple)) else [model_chunks]
    rank = dist.get_rank()
    model_dtype = next(unwrap_model(chunks[0]).parameters()).dtype
    out_dtype = torch_dtype(params_dtype) if params_dtype else model_dtype
    out_dir = Path(out_dir).absolute()
    temp = None
    writer = None
    if rank == 0:
        if not overwrite:
            check_new_target(out_dir, "out_dir")
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        temp = prepare_temp(out_dir)
        writer = HFShardWriter(temp, hf_output_plan(arch), out_dtype, max_shard_size)
    try:
        for name, tensor in iter_hf_tensors(chunks, arch):
            if rank == 0:
                writer.add(name, tensor)  # type: ignore[union-attr]
        if rank == 0:
            writer.finish()  # type: ignore[union-attr]
            config = _export_config(arch, hf_assets_dir, hf_config)
            if hf_assets_dir is not None:
                copy_hf_assets(hf_assets_dir, temp)  # type: ignore[arg-type]
            write_hf_config(temp, config, dtype_long_name(out_dtype))  # type: ignore[arg-type]
        dist.barrier()
        if rank == 0:
            commit_temp(temp, out_dir, overwrite=overwrite)  # type: ignore[arg-type]
    except BaseException:
        if writer is not None:
            writer.abort()
        if temp is not None:
            import shutil

            shutil.rmtree(temp, ignore_errors=True)
        raise
    return out_dir if rank == 0 else None


def _effective_weight(param: Any) -> torch.Tensor:
    """LoRA layers export their merged weight (the rollout engine runs the adapted model)."""
    if getattr(param, "lora_owner", None) is None:
        return param.detach()
    from mindrl.models.lora import effective_weight

    return effective_weight(param)


def _gather_to_hf(
    bound: BoundRule,
    params: dict[str, Any],
    arch: ModelArchConfig,
    tp_group: Any,
    tp_size: int,
    tp_rank: int,
) -> dict[str, torch.Tensor] | None:
    """All TP ranks of the owning stage call this; TP rank 0 gets the HF tensors."""
    import torch
    import torch.distributed as dist

    found = _find_param(params, bound.mcore)
    if found is None:
        raise ConversionError(f"model has no parameter {bound.mcore} on its owning stage")
    local = _effective_weight(found[1]).contiguous()
    if bound.split is Split.REPLICATED or tp_size == 1:
        shards = [local]
    else:
        shards = [torch.empty_like(local) for _ in range(tp_size)]
        dist.all_gather(shards, local, group=tp_group)
    if tp_rank != 0:
        return None
    return mcore_to_hf(bound, shards, arch)


def _export_config(
    arch: ModelArchConfig, hf_assets_dir: str | Path | None, hf_config: dict[str, Any] | None
) -> dict[str, Any]:
    import json

    if hf_config is not None:
        return dict(hf_config)
    if hf_assets_dir is not None and Path(hf_assets_dir, "config.json").is_file():
        return json.loads(Path(hf_assets_dir, "config.json").read_text())
    return hf_config_from_arch(arch)
