"""MindSpeed on NPU: its megatron adaptor imported first, with its switches, in every process.

MindSpeed patches megatron-core, and megatron-core computes flags when it is imported (TE
presence, `jit_fuser`, CUDA device calls) that a later patch cannot undo: the adaptor must be
imported before any `megatron` module in each process that uses megatron (the driver, every
Ray worker, the converter). `prepare_megatron(accelerator)` is that first call; on NPU it
refuses to go on without MindSpeed (megatron fails later at `torch.cuda.current_device()`
with a far less helpful message) or after megatron was already imported.

MindSpeed reads its switches once, from `sys.argv` (`mindspeed.args_utils.get_mindspeed_args`,
`parse_known_args`, every unknown flag kept as an option), when the adaptor is imported. In a
Ray actor `sys.argv` is Ray's worker command line, whose flags MindSpeed would take as its own.
So the driver carries the handed values (`handoffs(run, "npu").to(MINDSPEED)`) to each worker
in `MINDRL_MINDSPEED_ARGS` (JSON), and the adaptor is imported with `sys.argv` set to just
those flags, then restored.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from mindrl.accelerator.errors import AcceleratorError

ENV = "MINDRL_MINDSPEED_ARGS"
ADAPTOR = "mindspeed.megatron_adaptor"
ARGV0 = "mindrl"  # the program name MindSpeed's parser sees
INSTALL_HINT = (
    "install MindSpeed from Ascend's source (git clone https://gitee.com/ascend/MindSpeed, "
    "the branch for your megatron-core, e.g. core_r0.12.1; pip install -e MindSpeed); it is "
    "not on PyPI"
)


class MindSpeedError(AcceleratorError):
    """MindSpeed is missing on NPU, or came too late to patch megatron-core."""


def to_flags(values: Mapping[str, Any]) -> list[str]:
    """megatron-style flags: `use_fused_rmsnorm: true` -> `--use-fused-rmsnorm`; a false
    switch is left out; other values follow their flag (lists as several words)."""
    flags: list[str] = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                flags.append(flag)
        elif value is None:
            continue
        elif isinstance(value, (list, tuple)):
            flags += [flag, *(str(v) for v in value)]
        else:
            flags += [flag, str(value)]
    return flags


def worker_env(values: Mapping[str, Any]) -> dict[str, str]:
    return {ENV: json.dumps(dict(values))} if values else {}


def flags_from_env() -> list[str]:
    """The handed switches of this process (`MINDRL_MINDSPEED_ARGS`) as flags."""
    raw = os.environ.get(ENV)
    return to_flags(json.loads(raw)) if raw else []


@contextlib.contextmanager
def argv_for_mindspeed(flags: list[str]) -> Iterator[list[str]]:
    """`sys.argv` is `[ARGV0, *flags]` inside, the caller's again after."""
    saved = sys.argv
    sys.argv = [ARGV0, *flags]
    try:
        yield sys.argv
    finally:
        sys.argv = saved


def megatron_modules_loaded() -> list[str]:
    return sorted(m for m in sys.modules if m == "megatron" or m.startswith("megatron."))


def prepare_megatron(accelerator: str) -> bool:
    """Call before the process's first megatron import. On "npu": import MindSpeed's adaptor
    with the handed switches (once); True when it is in place. Elsewhere nothing (False).

    Raises `MindSpeedError` on NPU when MindSpeed is not installed, or when megatron was
    imported before the adaptor (naming the module that came first)."""
    if accelerator != "npu":
        return False
    if ADAPTOR in sys.modules:
        return True
    early = megatron_modules_loaded()
    if early:
        raise MindSpeedError(
            f"megatron-core ({early[0]}) was imported before MindSpeed's adaptor in this "
            "process: its import-time choices (transformer-engine, jit fuser, CUDA calls) can "
            "no longer be patched for NPU; call mindrl.accelerator.prepare_megatron('npu') "
            "before anything imports megatron"
        )
    if importlib.util.find_spec("mindspeed") is None:
        raise MindSpeedError(f"megatron-core on NPU needs MindSpeed's adaptor: {INSTALL_HINT}")
    with argv_for_mindspeed(flags_from_env()):
        importlib.import_module(ADAPTOR)
    return True
