"""Rules on the `runtime` section that depend on the accelerator it names."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from mindrl.config.fates import is_default, warn_once

if TYPE_CHECKING:
    from mindrl.config.run import RunConfig


def warn_host_heap_threshold(run: RunConfig) -> None:
    """`runtime.release_memory_min_mb` is about glibc's heap: on npu / cuda a pass's memory is
    the caching allocator's, given back whole (`release_memory_after_pass`)."""
    acc = run.runtime.accelerator
    field = next(f for f in dataclasses.fields(run.runtime) if f.name == "release_memory_min_mb")
    if acc in ("npu", "cuda") and not is_default(field, run.runtime.release_memory_min_mb):
        warn_once(
            "runtime.release_memory_min_mb",
            f"runtime.release_memory_min_mb has no effect on {acc}: it keeps a small free host "
            "heap between passes on cpu; a device's cached blocks are always given back",
        )
