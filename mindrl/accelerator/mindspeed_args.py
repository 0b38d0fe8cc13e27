"""MindSpeed's own switches, handed from the config to the adaptor on NPU.

MindSpeed reads its options from the command line (`sys.argv`, megatron-style flags) when
`mindspeed.megatron_adaptor` is imported; inside a Ray actor that is Ray's command line. The
driver therefore carries the handed values (`handoffs(run, "npu").to(MINDSPEED)`) to each
worker in `MINDRL_MINDSPEED_ARGS` (JSON), and the worker puts them on `sys.argv` as flags just
before the adaptor is imported.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

ENV = "MINDRL_MINDSPEED_ARGS"


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


def extend_argv_from_env() -> list[str]:
    """Append the handed flags to `sys.argv` (once); returns the flags added."""
    raw = os.environ.get(ENV)
    if not raw:
        return []
    flags = [f for f in to_flags(json.loads(raw)) if f not in sys.argv]
    sys.argv.extend(flags)
    return flags
