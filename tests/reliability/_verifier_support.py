"""Broken custom verifiers (the text of a `rl_config.verifier_files` file) and helpers to
run scoring steps under a hard wall-clock limit and to check processes are gone."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil

from mindrl.config.rl import RewardConfig
from tests.bounds import call_within

T = TypeVar("T")

# Each misbehaves on every call unless the docstring says otherwise. Names are process-wide
# in the registry, so the file is written once per session.
VERIFIERS = '''
import ctypes, math, os, time
from mindrl.rewards.registry import register_verifier

@register_verifier("rel_hang")
def hang(response, label, meta=None):
    time.sleep(10**6)

@register_verifier("rel_hang_marked")
def hang_marked(response, label, meta=None):
    """Hangs on responses containing HANG, else 1.0."""
    if "HANG" in response:
        time.sleep(10**6)
    return 1.0

@register_verifier("rel_exit")
def exit_(response, label, meta=None):
    os._exit(7)

@register_verifier("rel_segv")
def segv(response, label, meta=None):
    ctypes.string_at(0)

@register_verifier("rel_raise")
def raise_(response, label, meta=None):
    raise RuntimeError("verifier bug")

@register_verifier("rel_memory")
def memory(response, label, meta=None):
    """Grows in 32 MB blocks up to `label` MB; returns 1.0 only if nothing stopped it."""
    blocks = []
    while len(blocks) * 32 < int(label):
        blocks.append(bytearray(32 << 20))
    return 1.0

@register_verifier("rel_value")
def value(response, label, meta=None):
    """Returns the float named by the response."""
    return float(response)
'''


def reward_config(verifier_file: Path, functions: list[str], **overrides: Any) -> RewardConfig:
    """`rl_config`'s reward keys as the trainer gets them, loading `verifier_file`."""
    return RewardConfig(
        verifier_function=tuple(functions),
        verifier_weight=(1.0,) * len(functions),
        verifier_files=(str(verifier_file),),
        **overrides,
    )


def bounded(fn: Callable[[], T], limit_s: float) -> tuple[T, float]:
    """fn()'s value and wall time; a failure (not a hang) if it runs past limit_s."""
    start = time.monotonic()
    value = call_within(fn, limit_s)
    return value, time.monotonic() - start


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_gone(pids: list[int], within_s: float = 5.0) -> None:
    """Every pid has exited (killed workers are reaped synchronously; allow a moment)."""
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)]
