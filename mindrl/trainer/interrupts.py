"""SIGTERM / SIGINT end a run cleanly: the loop stops at the next phase boundary (or,
after a grace period, wherever it is), nothing half-written is kept (checkpoint saves are
atomic), one line says where the run stopped, and the exit code is 128 + the signal.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}


class RunInterrupted(Exception):
    """Raised in the driver's main thread when a stop signal must end the run now."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(signal.Signals(self.signum), 128 + self.signum)


class StopRequest:
    """Set by the first stop signal; `check()` at phase boundaries raises `RunInterrupted`.

    A phase that runs on past `grace_s` (a long generation on a cluster) is interrupted by
    an alarm; a second signal interrupts at once.
    """

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # a second signal: stop now
            raise RunInterrupted(self.signum)
        self.signum = signum
        if self.grace_s > 0:
            signal.setitimer(signal.ITIMER_REAL, self.grace_s)

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise RunInterrupted(self.signum)

    def check(self) -> None:
        if self.signum is not None:
            raise RunInterrupted(self.signum)

    def install(self) -> None:
        """(Re)install the handlers; call again after libraries that set their own (Ray)."""
        for signum, handler in (
            (signal.SIGTERM, self._on_signal),
            (signal.SIGINT, self._on_signal),
            (signal.SIGALRM, self._on_alarm),
        ):
            previous = signal.signal(signum, handler)
            self._previous.setdefault(signum, previous)

    def restore(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        self._previous.clear()


@contextlib.contextmanager
def stop_on_signals(grace_s: float) -> Iterator[StopRequest]:
    stop = StopRequest(grace_s)
    stop.install()
    try:
        yield stop
    finally:
        stop.restore()
