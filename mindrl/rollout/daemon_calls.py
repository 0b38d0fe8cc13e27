"""Calls on daemon threads, answered through a `concurrent.futures.Future`.

A request to a rollout server or a gloo broadcast can block for its whole timeout. On a
ThreadPoolExecutor such a call would hold the interpreter's exit until it returns (its
threads are joined at exit), so a stop signal could not end the run; a daemon thread is
dropped at exit instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


def call_in_daemon(
    fn: Callable[..., Any],
    *args: Any,
    name: str = "mindrl-call",
    limit: threading.Semaphore | None = None,
) -> Future:
    """`fn(*args)` on a new daemon thread (after taking `limit`, when given)."""
    future: Future = Future()

    def run() -> None:
        if limit is not None:
            limit.acquire()
        try:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args))
            except BaseException as err:  # handed to whoever waits on the future
                future.set_exception(err)
        finally:
            if limit is not None:
                limit.release()

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
