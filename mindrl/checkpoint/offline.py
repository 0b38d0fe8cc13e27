"""Offline conversion (HF <-> megatron, megatron -> megatron) in one process, no launcher.

How the megatron side is written without a world of TP x PP processes: a dist_checkpointing
folder stores *global* tensors (each rank writes its shard with offsets), so its content does
not depend on the TP/PP it was written from. The converter therefore runs one process as a
world of one (gloo, in-memory rendezvous), builds megatron-core's GPTModel on the `meta`
device at TP=1/PP=1 only to get its `sharded_state_dict()` (keys, global shapes, the swiglu
factory), puts the HF tensors in as data, and calls `dist_checkpointing.save`. megatron-core
then loads that folder at any TP/PP (vocab padding differences included: it zero-fills the
padded rows). The target TP/PP is validated against the architecture (heads, kv heads, ffn,
layers) and recorded in `mindrl_checkpoint.json`.

Memory: HF tensors come memory-mapped from safetensors and go to dist_checkpointing without a
copy when the dtype is unchanged (norms, projections, embeddings, and gate/up, whose two halves
are handed to the swiglu factory's shards directly); only the fused QKV tensors are new
memory. A dtype change converts every tensor (one model-size copy in the new dtype).
megatron -> HF reads whole layers, up to 256 MB per partial `dist_checkpointing.load`, and
streams each HF tensor to its planned place in its output shard: peak is about one such group
(one layer of a large model), not the model. Run it in its own process (the CLI does): it
sets up a CPU/gloo world of one and megatron's CPU shims.

An HF checkpoint handed to the converter decides its own family: its config.json's
architecture wins over the converter's flags (`reconcile_hf_flags`, with a notice), and
every tensor must be covered by the family's mapping table (`check_hf_coverage`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindrl.accelerator.device import peak_rss_bytes
from mindrl.checkpoint.atomic import atomic_directory, check_new_target
from mindrl.checkpoint.dist_files import check_dist_checkpoint_files
from mindrl.checkpoint.errors import ConversionError
from mindrl.checkpoint.hf_io import (
    DEFAULT_MAX_SHARD_BYTES,
    HFCheckpointReader,
    HFShardWriter,
    copy_hf_assets,
    copy_tokenizer_files,
    write_hf_config,
)
from mindrl.checkpoint.mapping import (
    IGNORED_HF_SUFFIXES,
    bound_rules,
    dropped_hf_tensors,
    dropped_notice,
    expected_hf_tensors,
    hf_output_plan,
)
from mindrl.checkpoint.mcore_io import (
    HF_ASSETS_DIR,
    McoreCheckpointInfo,
    megatron_core_version,
    read_checkpoint_info,
    resolve_iteration_dir,
    write_iteration_dir,
)
from mindrl.checkpoint.mcore_read import load_group, load_groups
from mindrl.checkpoint.transforms import hf_to_mcore_pieces, mcore_to_hf
from mindrl.config.layer_layout import layer_layout
from mindrl.config.model_arch import ModelArchConfig
from mindrl.models.dtypes import dtype_short_name, torch_dtype
from mindrl.models.gpt import validate_parallel_layout
from mindrl.models.hf_arch import arch_from_hf_config, hf_config_from_arch, read_hf_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConversionResult:
    """What a conversion wrote, and what it cost."""

    path: Path
    seconds: float
    tensors: int
    bytes_written: int
    peak_rss_bytes: int  # this process's RSS high-water mark (VmHWM)


def check_separate_dirs(load_dir: str | Path, save_dir: str | Path) -> None:
    """The output folder must be neither the input folder, inside it, nor around it."""
    load, save = Path(load_dir).resolve(), Path(save_dir).resolve()
    if save == load:
        raise ConversionError(
            f"--save-dir {save_dir} is the --load-dir itself; choose a new folder"
        )
    if load in save.parents:
        raise ConversionError(
            f"--save-dir {save_dir} is inside --load-dir {load_dir}; write the output elsewhere"
        )
    if save in load.parents:
        raise ConversionError(
            f"--load-dir {load_dir} is inside --save-dir {save_dir}; choose a new folder"
        )


def _progress(items: list[Any], desc: str, enabled: bool) -> Any:
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="tensor" if desc.startswith("hf") else "step")


@contextlib.contextmanager
def single_process_world() -> Iterator[None]:
    """A world of one process with megatron parallel_state at TP=1, PP=1 (reused if present)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from mindrl.models.parallel import destroy_parallel, init_parallel

    if dist.is_initialized() and dist.get_world_size() != 1:
        raise ConversionError(
            "offline conversion runs in a single process; torch.distributed is already "
            f"initialised with world size {dist.get_world_size()}"
        )
    owned = not parallel_state.model_parallel_is_initialized()
    if owned:
        init_parallel(1, 1, accelerator="cpu", seed=None)
    try:
        yield
    finally:
        if owned:
            destroy_parallel()


def meta_sharded_state_dict(arch: ModelArchConfig, params_dtype: str) -> dict[str, Any]:
    """megatron-core's sharded state dict of `arch` at TP=1/PP=1, without tensor storage."""
    from mindrl.models.gpt import build_gpt_model

    model = build_gpt_model(arch, params_dtype=params_dtype, use_te=False, meta_device=True)
    return model.sharded_state_dict()


def _fill_entry(entry: Any, pieces: list[Any], name: str) -> Any:
    """Give a meta ShardedTensor / swiglu factory real data; returns the entry to save."""
    import torch
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    if isinstance(entry, ShardedTensorFactory):
        # The swiglu factory splits fc1 = [gate; up] into two shards by chunk(2). Build it on
        # the meta tensor and hand each shard its HF tensor, so no fused copy is made.
        built = entry.build()
        shards = sorted(built, key=lambda sh: sh.global_offset)
        if len(shards) != len(pieces) or any(
            tuple(sh.local_shape) != tuple(p.shape) for sh, p in zip(shards, pieces)
        ):
            raise ConversionError(
                f"{name}: HF pieces {[list(p.shape) for p in pieces]} do not "
                "match megatron-core's shards"
            )
        return [dataclasses.replace(sh, data=p) for sh, p in zip(shards, pieces)]
    if isinstance(entry, ShardedTensor):
        data = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)
        if tuple(data.shape) != tuple(entry.local_shape):
            raise ConversionError(
                f"{name}: built shape {list(data.shape)} but megatron-core expects "
                f"{list(entry.local_shape)}"
            )
        return dataclasses.replace(entry, data=data)
    raise ConversionError(f"{name}: unexpected sharded entry {type(entry).__name__}")


def _check_layout(
    arch: ModelArchConfig, tp: int, pp: int, ep: int, num_layer_list: str | None = None
) -> tuple[int, ...] | None:
    """The target layout splits `arch` (heads, kv heads, ffn, experts evenly; layers evenly
    or as `num_layer_list` says); returns the layers per stage to record (None: even)."""
    try:
        validate_parallel_layout(arch, tp, pp, ep, num_layer_list)
        layout = layer_layout(arch.num_layers, pp, num_layer_list, arch.noop_layers)
    except ValueError as exc:
        raise ConversionError(_flag_names(str(exc))) from exc
    return layout.stage_layers if layout.uneven else None


def _flag_names(message: str) -> str:
    """The converter's flag names for the config keys a layout problem names."""
    for key, flag in (("num_layer_list", "--num-layer-list"), ("noop_layers", "--noop-layers")):
        message = message.replace(f"{key}:", f"{flag}:")
    return message


def with_noop_layers(arch: ModelArchConfig, noop_layers: str | None) -> ModelArchConfig:
    """The megatron model of an HF checkpoint with MindSpeed's noop layers added: num_layers
    counts them (as MindSpeed's does), the HF layers fill the other indices in order."""
    if not noop_layers:
        return arch
    padded = dataclasses.replace(arch, noop_layers=noop_layers)
    try:
        num_layers = padded.mcore_num_layers(arch.num_layers)
    except ValueError as exc:
        raise ConversionError(_flag_names(str(exc))) from exc
    return dataclasses.replace(padded, num_layers=num_layers)


def _open_checkpoint(load_dir: str | Path, save_dir: Path) -> tuple[Path, McoreCheckpointInfo]:
    """A megatron checkpoint's iteration folder and record, once the output folder is known
    to be new and apart from it and the checkpoint's files are all there (before any work)."""
    check_separate_dirs(load_dir, save_dir)
    check_new_target(save_dir)
    iter_dir = resolve_iteration_dir(load_dir)
    info = read_checkpoint_info(iter_dir)
    check_dist_checkpoint_files(iter_dir)
    return iter_dir, info


def check_hf_coverage(reader: HFCheckpointReader, arch: ModelArchConfig) -> list[str]:
    """Every HF tensor is used by the mapping, and every mapped HF tensor is present; returns
    the tensors the family drops by name (DeepSeek's multi-token-prediction layers)."""
    expected = expected_hf_tensors(arch)
    dropped = dropped_hf_tensors(arch, reader.names())
    names = set(reader.names()) - set(dropped)
    for name in expected:
        if name not in names:
            raise ConversionError(f"tensor {name} is missing from the HF checkpoint {reader.dir}")
    for name in sorted(names - set(expected)):
        if name.endswith(IGNORED_HF_SUFFIXES):
            continue
        if name == "lm_head.weight" and arch.tie_word_embeddings:
            continue  # a tied checkpoint that also stored the (identical) output layer
        raise ConversionError(
            f"HF tensor {name} is not covered by the {arch.family} mapping "
            f"(model_type_hf={arch.model_type_hf}, add_qkv_bias={arch.add_qkv_bias})"
        )
    return dropped


def reconcile_hf_flags(
    hf_dir: str | Path, *, model_type_hf: str | None = None, add_qkv_bias: bool | None = None
) -> tuple[ModelArchConfig, tuple[str, ...]]:
    """The HF checkpoint's arch, and one notice per converter flag it overrides.

    The checkpoint's config.json decides the family (the weights are what they are): a
    `--model-type-hf` of another family or an `--add-qkv-bias` that disagrees is overridden
    with a notice, not an error; the tensor coverage check still verifies every weight.
    MindSpeed-RL's spelling for Qwen2.5, `--model-type-hf llama2 --add-qkv-bias`, gets one.
    """
    from mindrl.families import registry

    arch = arch_from_hf_config(hf_dir)
    notices = []
    says = f"the checkpoint's config.json says {arch.family}"
    if model_type_hf is not None:
        family = registry.family_of_variant(model_type_hf)
        if family is None and registry.alias_family(model_type_hf) is None:
            known = registry.known_spellings()
            raise ConversionError(
                f"--model-type-hf {model_type_hf} is not a model family ({', '.join(known)})"
            )
        if family == arch.family:
            arch = dataclasses.replace(arch, model_type_hf=model_type_hf)
        else:
            notices.append(f"--model-type-hf {model_type_hf}: {says}; converting as {arch.family}")
    if add_qkv_bias is not None and add_qkv_bias != arch.add_qkv_bias:
        flag = "--add-qkv-bias" if add_qkv_bias else "add_qkv_bias=False"
        kind = "with" if arch.add_qkv_bias else "without"
        notices.append(f"{flag}: {says}; converting {kind} q/k/v biases")
    return arch, tuple(notices)


def convert_hf_to_mcore(
    hf_dir: str | Path,
    save_dir: str | Path,
    *,
    target_tensor_parallel_size: int = 1,
    target_pipeline_parallel_size: int = 1,
    target_expert_parallel_size: int = 1,
    params_dtype: str | None = None,
    model_type_hf: str | None = None,
    add_qkv_bias: bool | None = None,
    num_layer_list: str | None = None,
    noop_layers: str | None = None,
    tokenizer_dir: str | Path | None = None,
    progress: bool = False,
    notify: Callable[[str], None] | None = None,
) -> ConversionResult:
    """HF folder -> megatron checkpoint folder (SAVE_DIR/release + tracker), atomically.

    The HF folder's config, generation config and tokenizer files (and those of
    `tokenizer_dir`, if given) are kept in release/hf_assets/ for the way back. Flags the
    checkpoint's config.json overrides are reported through `notify` (default: a warning log).
    `num_layer_list` (layers per target pipeline stage) and `noop_layers` (MindSpeed's
    identity layers, counted in the megatron model's num_layers) are recorded with it.
    """
    start = time.perf_counter()
    hf_dir, save_dir = Path(hf_dir), Path(save_dir)
    check_separate_dirs(hf_dir, save_dir)
    check_new_target(save_dir)
    arch, notices = reconcile_hf_flags(
        hf_dir, model_type_hf=model_type_hf, add_qkv_bias=add_qkv_bias
    )
    for notice in notices:
        (notify or logger.warning)(notice)
    arch = with_noop_layers(arch, noop_layers)
    stage_layers = _check_layout(
        arch,
        target_tensor_parallel_size,
        target_pipeline_parallel_size,
        target_expert_parallel_size,
        num_layer_list,
    )
    reader = HFCheckpointReader(hf_dir)
    dropped = check_hf_coverage(reader, arch)
    if dropped:
        (notify or logger.warning)(dropped_notice(dropped))
    rules = bound_rules(arch)
    from mindrl.checkpoint.transforms import check_hf_shapes

    for bound in rules:
        check_hf_shapes(bound, reader)
    dtype_name = dtype_short_name(params_dtype or reader.dtype_name())
    dtype = torch_dtype(dtype_name)
    info = McoreCheckpointInfo(
        arch=arch,
        params_dtype=dtype_name,
        iteration=None,
        tensor_parallel_size=target_tensor_parallel_size,
        pipeline_parallel_size=target_pipeline_parallel_size,
        megatron_core_version=megatron_core_version(),
        hf_config=read_hf_config(hf_dir),
        expert_parallel_size=target_expert_parallel_size,
        num_layer_list=stage_layers,
    )
    with single_process_world(), atomic_directory(save_dir) as temp:
        sharded = meta_sharded_state_dict(arch, dtype_name)
        nbytes = 0
        for bound in _progress(rules, "hf->mcore", progress):
            pieces = [p.to(dtype) for p in hf_to_mcore_pieces(bound, reader, arch, 0, 1)]
            nbytes += sum(p.numel() * p.element_size() for p in pieces)
            if bound.mcore not in sharded:
                raise ConversionError(f"megatron-core model has no parameter {bound.mcore}")
            sharded[bound.mcore] = _fill_entry(sharded[bound.mcore], pieces, bound.mcore)
        _check_all_filled(sharded)
        if progress:
            print("hf->mcore: writing the dist_checkpointing files ...", file=sys.stderr)
        release = write_iteration_dir({"model": sharded}, temp, info, hf_assets_dir=hf_dir)
        del sharded
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, release / HF_ASSETS_DIR)
    reader.close()
    return ConversionResult(
        save_dir, time.perf_counter() - start, len(rules), nbytes, peak_rss_bytes()
    )


def _check_all_filled(sharded: dict[str, Any]) -> None:
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    for name, entry in sharded.items():
        entries = entry if isinstance(entry, list) else [entry]
        for e in entries:
            if isinstance(e, ShardedTensorFactory) or (
                isinstance(e, ShardedTensor) and e.data is not None and e.data.is_meta
            ):
                raise ConversionError(f"megatron parameter {name} has no HF source tensor")


def convert_mcore_to_hf(
    load_dir: str | Path,
    save_dir: str | Path,
    *,
    params_dtype: str | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_BYTES,
    hf_assets_dir: str | Path | None = None,
    tokenizer_dir: str | Path | None = None,
    progress: bool = False,
) -> ConversionResult:
    """megatron checkpoint (root or iteration folder) -> HF folder, atomically.

    config.json / tokenizer files come from `hf_assets_dir` if given, else from the
    checkpoint's own hf_assets/ copy, else config.json is generated from the recorded arch;
    `tokenizer_dir`'s tokenizer files override.
    """
    start = time.perf_counter()
    save_dir = Path(save_dir)
    iter_dir, info = _open_checkpoint(load_dir, save_dir)
    arch = info.arch
    # the recorded layout (uneven stages, noop layers) must describe this model; the stored
    # global tensors themselves do not depend on it
    _check_layout(
        arch,
        1,
        info.pipeline_parallel_size,
        1,
        ",".join(map(str, info.num_layer_list)) if info.num_layer_list else None,
    )
    out_dtype = torch_dtype(params_dtype or info.params_dtype)
    out_dtype_name = str(out_dtype).removeprefix("torch.")
    assets = Path(hf_assets_dir) if hf_assets_dir else iter_dir / HF_ASSETS_DIR
    groups = load_groups(arch, torch_dtype(info.params_dtype).itemsize)
    n_tensors = 0
    with single_process_world(), atomic_directory(save_dir) as temp:
        sharded = meta_sharded_state_dict(arch, info.params_dtype)
        writer = HFShardWriter(temp, hf_output_plan(arch), out_dtype, max_shard_size)
        try:
            for group in _progress(groups, "mcore->hf", progress):
                loaded = load_group(sharded, group, iter_dir)
                for bound in group:
                    for name, tensor in mcore_to_hf(bound, [loaded[bound.mcore]], arch).items():
                        writer.add(name, tensor)
                        n_tensors += 1
                del loaded
            writer.finish()
        finally:
            writer.abort()
        if assets.is_dir():
            copy_hf_assets(assets, temp)
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, temp)
        config = _hf_config_for(assets, info)
        write_hf_config(temp, config, out_dtype_name)
    return ConversionResult(
        save_dir, time.perf_counter() - start, n_tensors, writer.total_bytes, peak_rss_bytes()
    )


def _hf_config_for(assets: Path, info: McoreCheckpointInfo) -> dict[str, Any]:
    if (assets / "config.json").is_file():
        return json.loads((assets / "config.json").read_text())
    if info.hf_config:
        return dict(info.hf_config)
    return hf_config_from_arch(info.arch)


def convert_mcore_to_mcore(
    load_dir: str | Path,
    save_dir: str | Path,
    *,
    target_tensor_parallel_size: int = 1,
    target_pipeline_parallel_size: int = 1,
    target_expert_parallel_size: int = 1,
    num_layer_list: str | None = None,
    params_dtype: str | None = None,
    progress: bool = False,
) -> ConversionResult:
    """megatron -> megatron: re-save (new dtype, new recorded target layout), atomically.

    The stored global tensors are layout-agnostic, so resharding is a validated copy; this is
    also how a checkpoint's dtype changes.
    """
    start = time.perf_counter()
    save_dir = Path(save_dir)
    iter_dir, info = _open_checkpoint(load_dir, save_dir)
    arch = info.arch
    stage_layers = _check_layout(
        arch,
        target_tensor_parallel_size,
        target_pipeline_parallel_size,
        target_expert_parallel_size,
        num_layer_list,
    )
    dtype_name = dtype_short_name(params_dtype or info.params_dtype)
    dtype = torch_dtype(dtype_name)
    new_info = dataclasses.replace(
        info,
        params_dtype=dtype_name,
        tensor_parallel_size=target_tensor_parallel_size,
        pipeline_parallel_size=target_pipeline_parallel_size,
        megatron_core_version=megatron_core_version(),
        expert_parallel_size=target_expert_parallel_size,
        num_layer_list=stage_layers,
    )
    rules = bound_rules(arch)
    assets = iter_dir / HF_ASSETS_DIR
    with single_process_world(), atomic_directory(save_dir) as temp:
        source = meta_sharded_state_dict(arch, info.params_dtype)
        loaded = load_group(source, rules, iter_dir)  # whole model: the save needs it all
        target = meta_sharded_state_dict(arch, dtype_name)
        nbytes = 0
        for bound in _progress(rules, "mcore->mcore", progress):
            tensor = loaded.pop(bound.mcore).to(dtype)
            nbytes += tensor.numel() * tensor.element_size()
            entry = target[bound.mcore]
            target[bound.mcore] = dataclasses.replace(entry, data=tensor)
        del loaded
        write_iteration_dir(
            {"model": target}, temp, new_info, hf_assets_dir=assets if assets.is_dir() else None
        )
        del target
    return ConversionResult(
        save_dir, time.perf_counter() - start, len(rules), nbytes, peak_rss_bytes()
    )
