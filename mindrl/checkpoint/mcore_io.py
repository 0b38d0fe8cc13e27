"""megatron checkpoint folders: dist_checkpointing wrappers, iteration tracker, metadata.

Layout (as megatron's training loop writes it)::

    ROOT/latest_checkpointed_iteration.txt     "release" or the iteration number
    ROOT/release/  or  ROOT/iter_0000100/      one dist_checkpointing checkpoint
        metadata.json, .metadata, common.pt, __*.distcp   (megatron-core)
        mindrl_checkpoint.json                 arch, params dtype, layout saved at
        hf_assets/                             config.json, tokenizer files (optional)

dist_checkpointing stores every tensor as a global tensor with shard offsets, so a folder
saved at one TP/PP loads at any other (`load_mcore_checkpoint` builds the request from the
loading model's own `sharded_state_dict()`). The iteration folder is written into a temporary
sibling and renamed into place; the tracker is then replaced atomically.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindrl.checkpoint.atomic import atomic_write_text, commit_temp, prepare_temp, temp_sibling
from mindrl.checkpoint.dist_files import DIST_CONFIG_FILE, check_dist_checkpoint_files
from mindrl.checkpoint.errors import (
    CheckpointReadError,
    ConversionError,
    CorruptCheckpointError,
    checkpoint_errors,
    short_reason,
)
from mindrl.checkpoint.safe_load import check_dcp_folder
from mindrl.config.model_arch import ModelArchConfig

if TYPE_CHECKING:
    import torch

TRACKER_FILE = "latest_checkpointed_iteration.txt"
META_FILE = "mindrl_checkpoint.json"
HF_ASSETS_DIR = "hf_assets"
RELEASE = "release"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class McoreCheckpointInfo:
    """What `mindrl_checkpoint.json` records, so loading needs no extra flags."""

    arch: ModelArchConfig
    params_dtype: str  # fp32 | bf16 | fp16
    iteration: int | None  # None: a "release" checkpoint (converted, not trained)
    tensor_parallel_size: int  # layout it was saved from (or converted for)
    pipeline_parallel_size: int
    megatron_core_version: str = ""
    format_version: int = FORMAT_VERSION
    hf_config: dict[str, Any] | None = field(default=None, compare=False)
    expert_parallel_size: int = 1  # EP it was saved from (or converted for); MoE only
    # layers per pipeline stage of that layout (MindSpeed's num_layer_list); None: even split
    num_layer_list: tuple[int, ...] | None = None

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = META_FILE) -> McoreCheckpointInfo:
        try:
            data = json.loads(text)
            arch_fields = {f.name for f in dataclasses.fields(ModelArchConfig)}
            arch = ModelArchConfig(**{k: v for k, v in data["arch"].items() if k in arch_fields})
            return cls(
                arch=arch,
                params_dtype=data["params_dtype"],
                iteration=data["iteration"],
                tensor_parallel_size=int(data["tensor_parallel_size"]),
                pipeline_parallel_size=int(data["pipeline_parallel_size"]),
                megatron_core_version=data.get("megatron_core_version", ""),
                format_version=int(data.get("format_version", FORMAT_VERSION)),
                hf_config=data.get("hf_config"),
                expert_parallel_size=int(data.get("expert_parallel_size", 1)),
                num_layer_list=_stage_counts(data.get("num_layer_list")),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptCheckpointError(
                source, f"not a valid mindrl checkpoint record ({type(exc).__name__}: {exc})"
            ) from exc


def _stage_counts(value: Any) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in value)


def model_stage_layers(model_chunks: Sequence[Any]) -> tuple[int, ...] | None:
    """Layers per pipeline stage of a model built with megatron's uneven layout (None: the
    even split), for the checkpoint record."""
    from megatron.core.transformer.enums import LayerType

    model = model_chunks[0]
    while hasattr(model, "module"):
        model = model.module
    layout = getattr(model.config, "pipeline_model_parallel_layout", None)
    if layout is None:
        return None
    return tuple(sum(chunk.count(LayerType.decoder) for chunk in stage) for stage in layout.layout)


def megatron_core_version() -> str:
    try:
        from megatron.core import package_info

        return str(package_info.__version__)
    except ImportError:
        return ""


def iteration_dir_name(iteration: int | None) -> str:
    return RELEASE if iteration is None else f"iter_{iteration:07d}"


def read_tracker(root: Path) -> int | None:
    """The iteration named by ROOT/latest_checkpointed_iteration.txt (None for release)."""
    tracker = root / TRACKER_FILE
    if not tracker.is_file():
        raise ConversionError(
            f"{root} is not a megatron checkpoint: {TRACKER_FILE} is missing "
            "(pass the checkpoint root or an iter_XXXXXXX / release folder)"
        )
    try:
        text = tracker.read_bytes().decode("utf-8").strip()
        if text == RELEASE:
            return None
        return int(text)
    except (UnicodeDecodeError, ValueError) as exc:
        shown = tracker.read_bytes()[:40]
        raise CorruptCheckpointError(
            tracker, f"holds {shown!r}, not an iteration number or 'release'"
        ) from exc


def resolve_iteration_dir(path: str | Path) -> Path:
    """An iteration folder from a checkpoint root (via the tracker) or the folder itself."""
    path = Path(path)
    if not path.exists():
        raise ConversionError(f"megatron checkpoint {path} does not exist")
    if (path / META_FILE).is_file() or (path / "metadata.json").is_file():
        return path
    iter_dir = path / iteration_dir_name(read_tracker(path))
    if not iter_dir.is_dir():
        raise CheckpointReadError(iter_dir, f"missing (named by {path / TRACKER_FILE})")
    return iter_dir


def read_checkpoint_info(path: str | Path) -> McoreCheckpointInfo:
    iter_dir = resolve_iteration_dir(path)
    meta = iter_dir / META_FILE
    if not meta.is_file():
        raise ConversionError(
            f"{iter_dir} has no {META_FILE}: it was not written by mindrl, so its architecture "
            "is unknown"
        )
    if not (iter_dir / DIST_CONFIG_FILE).is_file():
        raise CheckpointReadError(
            iter_dir / DIST_CONFIG_FILE, "missing: not a dist_checkpointing folder"
        )
    try:
        text = meta.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptCheckpointError(meta, f"not UTF-8 text (byte offset {exc.start})") from exc
    return McoreCheckpointInfo.from_json(text, str(meta))


def _state_dict_keys(n_chunks: int) -> list[str]:
    return ["model"] if n_chunks == 1 else [f"model{i}" for i in range(n_chunks)]


class ModelPart(enum.Enum):
    """Which tensors a save / load covers: a LoRA model's base and adapters can travel apart
    (adapter-only step checkpoints; a base checkpoint into a model with adapters)."""

    ALL = "all"
    BASE = "base"
    ADAPTERS = "adapters"

    def keeps(self, name: str) -> bool:
        if self is ModelPart.ALL:
            return True
        return name.endswith(_ADAPTER_SUFFIXES) == (self is ModelPart.ADAPTERS)


_ADAPTER_SUFFIXES = ("lora_A", "lora_B")


def model_sharded_state_dict(
    model_chunks: Sequence[Any], part: ModelPart = ModelPart.ALL
) -> dict[str, Any]:
    """{"model": ...} (or model0, model1, ... for virtual pipeline chunks), as megatron does."""
    from mindrl.models.gpt import unwrap_model

    return {
        key: {
            name: tensor
            for name, tensor in unwrap_model(chunk).sharded_state_dict().items()
            if part.keeps(name)
        }
        for key, chunk in zip(_state_dict_keys(len(model_chunks)), model_chunks)
    }


def _params_dtype_of(model_chunks: Sequence[Any]) -> str:
    from mindrl.models.dtypes import dtype_short_name
    from mindrl.models.gpt import unwrap_model

    param = next(unwrap_model(model_chunks[0]).parameters())
    return dtype_short_name(param.dtype)


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def write_iteration_dir(
    sharded_state_dict: dict[str, Any],
    root: Path,
    info: McoreCheckpointInfo,
    *,
    hf_assets_dir: str | Path | None = None,
    overwrite: bool = True,
) -> Path:
    """Collective: save `sharded_state_dict` as ROOT/<iteration dir>, atomically, + tracker."""
    from megatron.core import dist_checkpointing

    from mindrl.checkpoint.hf_io import copy_hf_assets

    root = Path(root).absolute()
    target = root / iteration_dir_name(info.iteration)
    temp = temp_sibling(target)
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        if target.exists() and not overwrite:
            raise ConversionError(f"{target} already exists")
        prepare_temp(target)
    _barrier()
    try:
        common = {"checkpoint_version": 3.0, "iteration": info.iteration or 0}
        dist_checkpointing.save({**sharded_state_dict, **common}, str(temp))
        if _rank() == 0:
            (temp / META_FILE).write_text(info.to_json())
            if hf_assets_dir is not None:
                assets = temp / HF_ASSETS_DIR
                assets.mkdir()
                copy_hf_assets(hf_assets_dir, assets)
            commit_temp(temp, target, overwrite=overwrite)
            tracker = RELEASE if info.iteration is None else str(info.iteration)
            atomic_write_text(root / TRACKER_FILE, tracker + "\n")
    except BaseException:
        if _rank() == 0:
            shutil.rmtree(temp, ignore_errors=True)
        raise
    _barrier()
    return target


def save_mcore_checkpoint(
    model_chunks: Sequence[Any],
    root: str | Path,
    *,
    arch: ModelArchConfig,
    iteration: int | None = None,
    params_dtype: str | None = None,
    hf_assets_dir: str | Path | None = None,
    hf_config: dict[str, Any] | None = None,
) -> Path:
    """Collective over all ranks: save the model as ROOT/iter_XXXXXXX (or ROOT/release).

    Returns the iteration folder. `hf_assets_dir` (an HF folder) has its config and tokenizer
    files copied into the checkpoint so an HF export needs nothing else.
    """
    from megatron.core import parallel_state as ps

    info = McoreCheckpointInfo(
        arch=arch,
        params_dtype=params_dtype or _params_dtype_of(model_chunks),
        iteration=iteration,
        tensor_parallel_size=ps.get_tensor_model_parallel_world_size(),
        pipeline_parallel_size=ps.get_pipeline_model_parallel_world_size(),
        expert_parallel_size=ps.get_expert_model_parallel_world_size(),
        megatron_core_version=megatron_core_version(),
        hf_config=hf_config,
        num_layer_list=model_stage_layers(model_chunks),
    )
    return write_iteration_dir(
        model_sharded_state_dict(model_chunks), Path(root), info, hf_assets_dir=hf_assets_dir
    )


def check_arch_matches(expected: ModelArchConfig, found: ModelArchConfig, where: str) -> None:
    """The shape-defining fields must agree (names and dropout may differ)."""
    keys = (
        "num_layers",
        "hidden_size",
        "ffn_hidden_size",
        "num_attention_heads",
        "num_kv_heads",
        "head_dim",
        "vocab_size",
        "add_qkv_bias",
        "tie_word_embeddings",
        "family",
        "noop_layer_indices",
    )
    diff = [
        f"{k}: checkpoint {getattr(found, k)} vs model {getattr(expected, k)}"
        for k in keys
        if getattr(expected, k) != getattr(found, k)
    ]
    if diff:
        raise ConversionError(f"{where} does not match the model: " + "; ".join(diff))


def load_mcore_checkpoint(
    model_chunks: Sequence[Any],
    path: str | Path,
    *,
    arch: ModelArchConfig | None = None,
    strict: bool = True,
    part: ModelPart = ModelPart.ALL,
) -> McoreCheckpointInfo:
    """Collective: load a checkpoint (root or iteration folder) into the model chunks, at
    whatever TP/PP the chunks were built with. Returns the checkpoint's recorded info.

    A missing file raises ``CheckpointReadError``, a truncated or corrupt one
    ``CorruptCheckpointError`` (both name the file); an architecture that does not match
    ``arch`` raises ``ConversionError``. `part` loads only the base or only the LoRA
    adapters; the rest of the model is left as it is.
    """
    from megatron.core import dist_checkpointing

    from mindrl.models.gpt import unwrap_model

    iter_dir = resolve_iteration_dir(path)
    info = read_checkpoint_info(iter_dir)
    if arch is not None:
        check_arch_matches(arch, info.arch, str(iter_dir))
    check_dist_checkpoint_files(iter_dir)
    check_dcp_folder(iter_dir)  # its pickled parts hold plain data only
    request = model_sharded_state_dict(model_chunks, part)
    try:
        state = dist_checkpointing.load(request, str(iter_dir))
    except checkpoint_errors() as exc:
        raise CorruptCheckpointError(
            iter_dir, f"megatron checkpoint cannot be loaded ({short_reason(exc)})"
        ) from exc
    for key, chunk in zip(_state_dict_keys(len(model_chunks)), model_chunks):
        missing, unexpected = unwrap_model(chunk).load_state_dict(state[key], strict=False)
        missing = [name for name in missing if part.keeps(name)]
        if strict and (missing or unexpected):
            raise ConversionError(
                f"{iter_dir}: model keys missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
    return info


def tensor_dtype(info: McoreCheckpointInfo) -> torch.dtype:
    from mindrl.models.dtypes import torch_dtype

    return torch_dtype(info.params_dtype)
