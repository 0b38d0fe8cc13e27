"""Where a run's log lines go: mindrl's progress on the console, engine and Ray chatter in files.

A tiny run used to print ~80 lines of vLLM (weight reloads, prefix-cache resets, start-up INFO),
megatron and Ray output between mindrl's per-step progress lines. With `runtime.log_level`:

- ``info`` (default): the console shows the driver's mindrl lines (progress, placement,
  checkpoints), warnings and errors of mindrl from every process, and errors of everything
  else. Everything, INFO and up, goes to ``OUTPUT_DIR/logs/``: ``driver.log`` (the driver, Ray's
  driver-side lines included) and one ``<role>_rank<N>.log`` per worker (its Python logging,
  vLLM's records, prints, library warnings and native stderr output).
- ``warning``: as ``info`` without the driver's mindrl INFO lines (the progress line stays).
- ``debug``: mindrl's DEBUG records as well, and every worker's output (vLLM, Ray, prints) on
  the console as before, besides the files.

The driver calls `run_logging(output_dir, level)` around the run; it exports
``MINDRL_LOG_DIR`` / ``MINDRL_LOG_LEVEL``, which reach every Ray worker through the job's
runtime_env (`mindrl.cluster.ray_cluster.worker_env_vars` forwards ``MINDRL_*``). A worker calls
`setup_worker_logging()` when it starts (before vLLM is imported): without those variables
(tests, tools, a plain script) it changes nothing.

Only the standard library (and `mindrl.storage`, which is standard library only) is imported
here: this runs before torch, Ray or vLLM are loaded. A failed write to ``driver.log`` is kept
(`driver_log_failure`) and stops the run at the next step, named.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from mindrl.storage import StorageError, file_unlinked, write_failed

LOG_DIR_ENV = "MINDRL_LOG_DIR"
LOG_LEVEL_ENV = "MINDRL_LOG_LEVEL"
LEVELS = ("debug", "info", "warning")
DRIVER_LOG = "driver.log"

_FILE_FORMAT = "%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s"
_DRIVER_CONSOLE_FORMAT = "%(asctime)s %(name)s: %(message)s"
_WORKER_CONSOLE_FORMAT = "%(levelname)s %(name)s: %(message)s"
# Loggers whose records are the run's own (shown on the console at the run's level).
_OWN = ("mindrl", "__main__")

_state: dict[str, str] = {}  # "mode": "driver" or "worker" once this process is set up


def _level_number(level: str) -> int:
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    return {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}[level]


def _is_own(name: str) -> bool:
    return any(name == own or name.startswith(own + ".") for own in _OWN)


class ConsoleFilter(logging.Filter):
    """Lets through the run's own records at `own_level` and up, every other record (vLLM,
    Ray, megatron, transformers, Python warnings) at `other_level` and up."""

    def __init__(self, own_level: int, other_level: int) -> None:
        super().__init__()
        self.own_level, self.other_level = own_level, other_level

    def filter(self, record: logging.LogRecord) -> bool:
        floor = self.own_level if _is_own(record.name) else self.other_level
        return record.levelno >= floor


class LogFileHandler(logging.FileHandler):
    """A log file that keeps its first failed write (a full disk, the file or its folder
    removed) for `driver_log_failure`, instead of printing logging's "--- Logging error ---"
    traceback and going on with lines lost."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, mode="a", encoding="utf-8")
        self.path = path
        self.failure: StorageError | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.failure is not None:
            return
        if self.stream is not None and file_unlinked(self.stream.fileno()):
            self.failure = write_failed(
                self.path.parent,
                self.path.name,
                FileNotFoundError(f"{self.path} was removed while the run wrote it"),
            )
            return
        super().emit(record)

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as exc:
            self._keep(exc)

    def close(self) -> None:
        try:
            super().close()
        except OSError as exc:  # the last buffered lines: kept as the failure, not raised
            self._keep(exc)

    def _keep(self, exc: OSError) -> None:
        if self.failure is None:
            self.failure = write_failed(self.path.parent, self.path.name, exc)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            self._keep(exc)
            return
        super().handleError(record)


def _file_handler(path: Path) -> LogFileHandler:
    handler = LogFileHandler(path)
    handler.setFormatter(logging.Formatter(_FILE_FORMAT))
    return handler


def driver_log_failure() -> StorageError | None:
    """The driver log file's failed write, if any (the trainer stops on it each step)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, LogFileHandler) and handler.failure is not None:
            return handler.failure
    return None


def _console_handler(stream: IO[str], fmt: str, own: int, other: int) -> logging.Handler:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(fmt))
    handler.addFilter(ConsoleFilter(own, other))
    return handler


def _install(handlers: list[logging.Handler], debug: bool) -> None:
    """Our handlers on the root logger (replacing what an earlier set-up left there)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(logging.INFO)  # third-party DEBUG records stay out even of the files
    logging.getLogger("mindrl").setLevel(logging.DEBUG if debug else logging.NOTSET)
    logging.captureWarnings(True)  # warnings.warn -> "py.warnings" -> file (console: debug)


def driver_logging_active() -> bool:
    """True inside `run_logging` in this (driver) process."""
    return _state.get("mode") == "driver"


def route_ray_driver_logs() -> None:
    """Ray's driver-side logger ("ray") through the root handlers instead of its own stderr
    handler; `ray.init(configure_logging=False)` keeps Ray from installing it again."""
    route_logger_to_root("ray")


@contextlib.contextmanager
def run_logging(output_dir: str | os.PathLike[str], level: str = "info") -> Iterator[Path]:
    """Driver side: console and ``OUTPUT_DIR/logs/driver.log`` for the run; the log folder and
    level exported for the workers. Undone on exit (handlers, variables)."""
    number = _level_number(level)
    log_dir = (Path(output_dir) / "logs").resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    debug = level == "debug"
    saved_env = {name: os.environ.get(name) for name in (LOG_DIR_ENV, LOG_LEVEL_ENV)}
    root = logging.getLogger()
    saved_root = (list(root.handlers), root.level)
    other = logging.INFO if debug else logging.ERROR
    handlers = [
        _file_handler(log_dir / DRIVER_LOG),
        _console_handler(sys.stderr, _DRIVER_CONSOLE_FORMAT, number, other),
    ]
    _install(handlers, debug)
    os.environ[LOG_DIR_ENV], os.environ[LOG_LEVEL_ENV] = str(log_dir), level
    _state["mode"] = "driver"
    logging.getLogger("mindrl.logs").info(
        "worker, engine and Ray logs: %s%s",
        log_dir,
        "" if debug else " (runtime.log_level=debug also prints them here)",
    )
    try:
        yield log_dir
    finally:
        _state.clear()
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
        for handler in saved_root[0]:
            root.addHandler(handler)
        root.setLevel(saved_root[1])
        logging.getLogger("mindrl").setLevel(logging.NOTSET)
        logging.captureWarnings(False)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def worker_log_path(log_dir: str | os.PathLike[str], role: str, rank: int) -> Path:
    return Path(log_dir) / f"{role}_rank{rank}.log"


def setup_worker_logging(role: str | None = None, rank: int | None = None) -> Path | None:
    """Worker side, once per process, before vLLM is imported: this worker's log file, and the
    console only for what the run's level shows. A no-op without ``MINDRL_LOG_DIR``, in the
    driver, or when already done; returns the log file.

    Below ``debug`` the process's stdout and stderr (file descriptors 1 and 2, so prints, tqdm
    bars and native warnings too) are pointed at the file; the console handler keeps a copy of
    the original stderr, which Ray forwards to the driver.
    """
    log_dir = os.environ.get(LOG_DIR_ENV)
    if not log_dir or _state.get("mode"):
        return None
    level = os.environ.get(LOG_LEVEL_ENV, "info")
    number = _level_number(level if level in LEVELS else "info")
    debug = number == logging.DEBUG
    role = role or os.environ.get("MINDRL_ROLE", "worker")
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    path = worker_log_path(log_dir, role, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    # vLLM then leaves its "vllm" logger to the root handlers instead of printing to stdout
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    log_file = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (process-long)
    if debug:
        console: IO[str] = sys.stderr
    else:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        console = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
    own = logging.DEBUG if debug else logging.WARNING
    other = logging.INFO if debug else logging.ERROR
    file_handler = logging.StreamHandler(log_file)
    file_handler.setFormatter(logging.Formatter(_FILE_FORMAT))
    _install([file_handler, _console_handler(console, _WORKER_CONSOLE_FORMAT, own, other)], debug)
    if "vllm" in sys.modules:  # imported before us: undo its own stdout handler
        route_logger_to_root("vllm")
    _state["mode"] = "worker"
    if number <= logging.INFO:
        print(f"{role} rank {rank}: log {path}", file=console, flush=True)
    return path


def route_logger_to_root(name: str) -> None:
    """A library logger that installed its own handlers: send its records to ours instead."""
    lib = logging.getLogger(name)
    for handler in list(lib.handlers):
        lib.removeHandler(handler)
    lib.propagate = True
