"""The one table of floating dtype names.

Configs and megatron checkpoints spell dtypes short (fp32 / bf16 / fp16); torch, HF config.json
and vLLM spell them long (float32 / bfloat16 / float16). Every conversion goes through here so
the two vocabularies cannot drift. torch is imported only by `torch_dtype`, so config
validation and asset hashing can use the names without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SHORT_TO_LONG = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
LONG_TO_SHORT = {long: short for short, long in SHORT_TO_LONG.items()}
SHORT_DTYPE_NAMES = tuple(SHORT_TO_LONG)  # ("fp32", "bf16", "fp16")
LONG_DTYPE_NAMES = tuple(LONG_TO_SHORT)  # ("float32", "bfloat16", "float16")


def dtype_long_name(dtype: str | torch.dtype) -> str:
    """bf16 / bfloat16 / torch.bfloat16 -> 'bfloat16' (torch's and HF config.json's name)."""
    name = str(dtype).removeprefix("torch.")
    name = SHORT_TO_LONG.get(name, name)
    if name not in LONG_TO_SHORT:
        raise ValueError(
            f"dtype {dtype!r} is not one of {', '.join(SHORT_DTYPE_NAMES + LONG_DTYPE_NAMES)}"
        )
    return name


def dtype_short_name(dtype: str | torch.dtype) -> str:
    """bf16 / bfloat16 / torch.bfloat16 -> 'bf16' (the configs' and checkpoints' name)."""
    return LONG_TO_SHORT[dtype_long_name(dtype)]


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """fp32 / bf16 / fp16 or float32 / bfloat16 / float16 -> torch.dtype; a torch.dtype is
    returned unchanged."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    return getattr(torch, dtype_long_name(dtype))
