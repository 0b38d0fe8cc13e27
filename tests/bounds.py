"""Hang guards for calls that must honour their own timeout.

A test of "X gives up after its timeout" cannot assert how long X took (that measures the
machine); it asserts what X did (raised its timeout error, named what was pending). If X
ignored its timeout the test would hang instead of failing: `call_within` turns that into a
failure after `limit_s`, a bound the caller derives from configured timeouts, far above what
X's own timeout allows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class DidNotReturn(AssertionError):
    """The call was still running after its hang guard."""


def call_within(fn: Callable[[], T], limit_s: float, what: str = "the call") -> T:
    """fn() in a daemon thread: its value, or its exception re-raised here; DidNotReturn when
    it has not returned after `limit_s`."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name="call_within")
    thread.start()
    thread.join(limit_s)
    if thread.is_alive():
        raise DidNotReturn(f"{what} did not return within {limit_s:g} s (a hang guard)")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
