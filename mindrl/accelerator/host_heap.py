"""Handing the host heap's freed memory back to the OS between passes (glibc malloc_trim).

CPU workers keep freed memory in glibc's heap (`Accelerator.worker_env`: no per-tensor mmap,
no automatic trim), which keeps a pass fast: its micro-batches reuse the pages the previous
one freed instead of faulting fresh zeroed ones. Without a trim, each process then holds its
own high-water mark for the whole run, and a run's footprint is the sum of every worker's
peak although its passes run one after another. Trimming when a pass ends gives that memory
back once per pass; the next pass faults it in once, not once per tensor.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def trim_host_heap() -> bool:
    """Return the free memory of every malloc arena to the OS; False where there is no
    malloc_trim (nothing done) or nothing could be released."""
    fn = _malloc_trim()
    return bool(fn(0)) if fn is not None else False
