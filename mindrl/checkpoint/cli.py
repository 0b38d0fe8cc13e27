"""`cli/convert_ckpt.py`: HF <-> megatron checkpoint conversion (MindSpeed-RL's flags).

Errors the user can fix (missing files, bad shapes, unknown architectures, TP that does not
divide the heads, an existing save dir) end the process with exit status 1 and one line on
stderr naming the tensor, file or flag; `--debug` shows the traceback instead. Nothing is left
in --save-dir unless the conversion completed.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mindrl.checkpoint.errors import ConversionError, short_reason
from mindrl.families import registry

MODEL_TYPES = ("hf", "mg")
DTYPES = ("fp32", "bf16", "fp16")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="convert_ckpt.py",
        description="Convert checkpoints between HF safetensors and megatron-core "
        "(dist_checkpointing) folders, or re-save a megatron checkpoint.",
    )
    p.add_argument("--load-model-type", choices=MODEL_TYPES, required=True)
    p.add_argument("--save-model-type", choices=MODEL_TYPES, required=True)
    p.add_argument("--load-dir", required=True, help="HF folder, or megatron checkpoint root")
    p.add_argument("--save-dir", required=True, help="must not exist; written atomically")
    p.add_argument("--target-tensor-parallel-size", type=int, default=1)
    p.add_argument("--target-pipeline-parallel-size", type=int, default=1)
    p.add_argument(
        "--target-expert-parallel-size",
        type=int,
        default=1,
        help="MoE experts split over this many ranks (must divide num_experts)",
    )
    p.add_argument(
        "--num-layer-list",
        metavar="N,N,...",
        help="layers per target pipeline stage (MindSpeed's uneven stages, e.g. 16,17,16,15; "
        "adds up to num_layers, one count per stage); mg -> hf reads it from the checkpoint",
    )
    p.add_argument(
        "--noop-layers",
        metavar="I,I,...",
        help="hf -> mg: MindSpeed's noop layers (global indices of identity layers without "
        "weights, counted in the megatron model's num_layers; absent from the HF checkpoint); "
        "mg -> hf reads them from the checkpoint",
    )
    p.add_argument(
        "--tokenizer-model",
        help="tokenizer.json (or its folder); its tokenizer files go into the output",
    )
    p.add_argument(
        "--model-type-hf",
        metavar="NAME",
        help="HF architecture variant "
        f"({', '.join(registry.MODEL_TYPE_HF_NAMES)}); optional: the "
        "checkpoint's config.json decides the family, a flag that disagrees gets a notice",
    )
    p.add_argument(
        "--add-qkv-bias",
        action="store_true",
        default=None,
        help="the model has q/k/v biases (Qwen2); optional, reconciled with the checkpoint",
    )
    p.add_argument(
        "--params-dtype", choices=DTYPES, help="dtype of the written tensors (default: as loaded)"
    )
    p.add_argument(
        "--use-mcore-models", action="store_true", help="accepted for compatibility (always on)"
    )
    p.add_argument("--model-type", choices=("GPT",), default="GPT")
    p.add_argument("--max-shard-size", default="5GB", help="HF output shard size (e.g. 2GB)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def _check_args(args: argparse.Namespace) -> None:
    from mindrl.checkpoint.offline import check_separate_dirs
    from mindrl.config.writable import unwritable_reason

    if args.load_model_type == "hf" and args.save_model_type == "hf":
        raise ConversionError("--load-model-type hf with --save-model-type hf: nothing to do")
    for flag, value in (
        ("--target-tensor-parallel-size", args.target_tensor_parallel_size),
        ("--target-pipeline-parallel-size", args.target_pipeline_parallel_size),
        ("--target-expert-parallel-size", args.target_expert_parallel_size),
    ):
        if value < 1:
            raise ConversionError(f"{flag} must be >= 1, not {value}")
    if not Path(args.load_dir).exists():
        raise ConversionError(f"--load-dir {args.load_dir} does not exist")
    check_separate_dirs(args.load_dir, args.save_dir)
    if Path(args.save_dir).exists():
        raise ConversionError(
            f"--save-dir {args.save_dir} already exists; choose a new folder or remove it first"
        )
    reason = unwritable_reason(args.save_dir)
    if reason:
        raise ConversionError(f"--save-dir {args.save_dir}: {reason}")
    if args.tokenizer_model and not Path(args.tokenizer_model).exists():
        raise ConversionError(f"--tokenizer-model {args.tokenizer_model} does not exist")


def _tokenizer_dir(args: argparse.Namespace) -> Path | None:
    if not args.tokenizer_model:
        return None
    path = Path(args.tokenizer_model)
    return path if path.is_dir() else path.parent


def _notice(message: str) -> None:
    print(f"convert_ckpt: note: {' '.join(message.split())}", file=sys.stderr)


def _check_flags_against_record(args: argparse.Namespace) -> None:
    """A megatron checkpoint records its family: family flags that disagree get a notice
    (they change nothing; the record decides, as config.json does for HF input)."""
    from mindrl.checkpoint.mcore_io import read_checkpoint_info

    info = read_checkpoint_info(args.load_dir)
    _check_layout_flags_against_record(args, info)
    if args.model_type_hf is None and args.add_qkv_bias is None:
        return
    arch = info.arch
    says = f"the checkpoint records {arch.family}"
    named = registry.family_of_variant(args.model_type_hf) if args.model_type_hf else None
    if args.model_type_hf is not None and named != arch.family:
        _notice(f"--model-type-hf {args.model_type_hf}: {says}; converting as {arch.family}")
    if args.add_qkv_bias and not arch.add_qkv_bias:
        _notice(f"--add-qkv-bias: {says}; converting without q/k/v biases")


def _check_layout_flags_against_record(args: argparse.Namespace, info: Any) -> None:
    """Read from a megatron checkpoint, the noop layers are its own: a flag that disagrees
    is an error (the HF layer numbering would differ); converting to HF, the recorded stage
    layout is read back and a --num-layer-list is not needed."""
    from mindrl.config.layer_layout import parse_index_list

    if args.noop_layers is not None:
        try:
            given = tuple(sorted(set(parse_index_list(args.noop_layers, "--noop-layers"))))
        except ValueError as exc:
            raise ConversionError(str(exc)) from exc
        recorded = info.arch.noop_layer_indices
        if given != recorded:
            raise ConversionError(
                f"--noop-layers {args.noop_layers}: the checkpoint records noop layers "
                f"{','.join(map(str, recorded)) or 'none'}"
            )
    if args.num_layer_list is not None and args.save_model_type == "hf":
        _notice(
            f"--num-layer-list {args.num_layer_list}: an HF checkpoint has no pipeline "
            "stages; the flag is not needed to convert to hf"
        )


def run(args: argparse.Namespace) -> str:
    """Do the conversion; returns the summary line."""
    from mindrl.checkpoint import offline

    _check_args(args)
    progress = not args.no_progress
    if args.load_model_type == "mg":
        _check_flags_against_record(args)
    if args.save_model_type == "hf":  # from mg: hf -> hf is refused above
        result = offline.convert_mcore_to_hf(
            args.load_dir,
            args.save_dir,
            params_dtype=args.params_dtype,
            max_shard_size=args.max_shard_size,
            tokenizer_dir=_tokenizer_dir(args),
            progress=progress,
        )
    else:  # to a megatron checkpoint laid out for the --target-* flags
        convert: Callable[..., offline.ConversionResult] = offline.convert_mcore_to_mcore
        if args.load_model_type == "hf":
            convert = functools.partial(
                offline.convert_hf_to_mcore,
                model_type_hf=args.model_type_hf,
                add_qkv_bias=args.add_qkv_bias,
                noop_layers=args.noop_layers,
                tokenizer_dir=_tokenizer_dir(args),
                notify=_notice,
            )
        result = convert(
            args.load_dir,
            args.save_dir,
            target_tensor_parallel_size=args.target_tensor_parallel_size,
            target_pipeline_parallel_size=args.target_pipeline_parallel_size,
            target_expert_parallel_size=args.target_expert_parallel_size,
            num_layer_list=args.num_layer_list,
            params_dtype=args.params_dtype,
            progress=progress,
        )
    return (
        f"converted {args.load_model_type} -> {args.save_model_type}: {result.path} "
        f"({result.tensors} tensors, {result.bytes_written / 2**20:.1f} MiB) in "
        f"{result.seconds:.1f} s, peak RSS {result.peak_rss_bytes / 2**30:.2f} GiB"
    )


def _quiet_megatron() -> None:
    """megatron-core warns at import about apex/TE fallbacks; the converter needs neither."""
    warnings.filterwarnings("ignore", module=r"megatron(\.|$)")
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("megatron").setLevel(logging.ERROR)


def _prepare_megatron() -> None:
    """On an NPU machine MindSpeed's adaptor comes before megatron here too (the converter
    builds megatron's sharded-tensor layout); `MINDRL_ACCELERATOR` names the machine's kind
    without probing it."""
    import os

    from mindrl.accelerator import AcceleratorError, detect_accelerator_name
    from mindrl.accelerator.mindspeed_args import prepare_megatron

    try:
        prepare_megatron(os.environ.get("MINDRL_ACCELERATOR") or detect_accelerator_name())
    except AcceleratorError as exc:
        raise ConversionError(str(exc)) from exc


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.debug:
        _quiet_megatron()
    try:
        _prepare_megatron()
        print(run(args))
    except ConversionError as exc:
        if args.debug:
            raise
        message = " ".join(str(exc).split())  # always one line
        print(f"convert_ckpt: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("convert_ckpt: interrupted (no output written)", file=sys.stderr)
        return 130
    except BaseException as exc:  # unexpected (torch's CheckpointException is a BaseException)
        if args.debug or isinstance(exc, SystemExit):
            raise
        print(f"convert_ckpt: error: {short_reason(exc)}", file=sys.stderr)
        return 1
    return 0
