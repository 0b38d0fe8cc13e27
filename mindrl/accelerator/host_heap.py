"""Handing the host heap's freed memory back to the OS between passes (glibc malloc_trim).

CPU workers keep freed memory in glibc's heap (`Accelerator.worker_env`: no per-tensor mmap,
no automatic trim), which keeps a pass fast: its micro-batches reuse the pages the previous
one freed instead of faulting fresh zeroed ones. Without a trim, each process then holds its
own high-water mark for the whole run, and a run's footprint is the sum of every worker's
peak although its passes run one after another. Trimming when a pass ends gives that memory
back once per pass; the next pass faults it in once, not once per tensor. A small free heap
is not worth giving back (`trim_host_heap(min_free_bytes)`): faulting it in again every pass
costs more time than holding it costs memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
    libc = _libc()
    fn = getattr(libc, "malloc_trim", None) if libc is not None else None
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


class _MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (2.33+): byte counts over every arena."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    libc = _libc()
    fn = getattr(libc, "mallinfo2", None) if libc is not None else None
    if fn is None:
        return None
    fn.argtypes = []
    fn.restype = _MallInfo2
    return fn


def free_heap_bytes() -> int | None:
    """Bytes free in malloc's arenas (what a trim could give back, at most); None where
    glibc's `mallinfo2` is missing."""
    fn = _mallinfo2()
    return int(fn().fordblks) if fn is not None else None


def trim_host_heap(min_free_bytes: int = 0) -> bool:
    """Return the free memory of every malloc arena to the OS, unless less than
    `min_free_bytes` is free (unknown counts as enough); False where there is no
    malloc_trim, the heap was kept, or nothing could be released."""
    fn = _malloc_trim()
    if fn is None:
        return False
    if min_free_bytes > 0:
        free = free_heap_bytes()
        if free is not None and free < min_free_bytes:
            return False
    return bool(fn(0))
