"""Handing freed heap memory back between passes (`mindrl/accelerator/host_heap.py`), in a
process started with the CPU workers' allocator settings (read by glibc at start): without a
trim the freed memory stays resident, with one it goes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mindrl.accelerator import get_accelerator
from mindrl.accelerator.host_heap import _malloc_trim, free_heap_bytes

pytestmark = pytest.mark.skipif(_malloc_trim() is None, reason="no glibc malloc_trim here")

_CHILD = r"""
import json, sys
import torch
from mindrl.accelerator import get_accelerator

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

base = rss_mib()
blocks = [torch.ones(8 << 20) for _ in range(16)]  # 16 x 32 MiB, touched
held = rss_mib()
del blocks
freed = rss_mib()
if sys.argv[1] == "trim":
    get_accelerator("cpu").release_cached_memory()
elif sys.argv[1].startswith("trim-above-"):  # only if at least that many MiB are free
    get_accelerator("cpu").release_cached_memory(int(sys.argv[1][11:]) << 20)
print(json.dumps({"base": base, "held": held, "freed": freed, "after": rss_mib()}))
"""


def _run(mode: str) -> dict[str, float]:
    env = {**os.environ, **get_accelerator("cpu").worker_env()}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_heap_stays_resident_until_the_pass_ends_then_goes_back():
    kept = _run("keep")
    assert kept["held"] - kept["base"] > 400  # 512 MiB allocated and touched
    # the workers' settings keep freed memory in the heap (fast reuse within a pass) ...
    assert kept["after"] - kept["base"] > 400
    trimmed = _run("trim")
    # ... and the release at the end of a pass gives it back to the OS
    assert trimmed["freed"] - trimmed["base"] > 400
    assert trimmed["after"] - trimmed["base"] < 100


@pytest.mark.skipif(free_heap_bytes() is None, reason="no glibc mallinfo2 here")
def test_a_free_heap_below_the_threshold_stays_for_the_next_pass():
    # 512 MiB free: a 1 GiB threshold keeps it, a 256 MiB one gives it back
    kept = _run("trim-above-1024")
    assert kept["after"] - kept["base"] > 400
    trimmed = _run("trim-above-256")
    assert trimmed["after"] - trimmed["base"] < 100


@pytest.mark.skipif(free_heap_bytes() is None, reason="no glibc mallinfo2 here")
def test_free_heap_bytes_counts_what_was_freed():
    env = {**os.environ, **get_accelerator("cpu").worker_env()}
    code = (
        "import torch; from mindrl.accelerator.host_heap import free_heap_bytes as f\n"
        "a = f(); x = torch.ones(64 << 20 >> 2); del x; print(f() - a)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip().splitlines()[-1]) >= 60 << 20
