"""Metric sinks for the GRPO driver: JSONL (crash-safe), TensorBoard, wandb / SwanLab
(`mindrl.trainer.trackers`), one console line per step.

Step numbering follows megatron's iteration counter: step ``s`` is the ``s``-th completed
step (1-based), and checkpoint ``iter_000000s`` holds the state after it. ``start_step`` is
the step the run starts from: 0 for a fresh run, ``k`` for a run resumed from checkpoint
``k`` (``RunState.step``), which then logs ``k+1, k+2, ...``. On opening, every line on disk
with ``step > start_step`` came from steps whose checkpoint never landed: it is dropped, and
rewritten by the resumed run rather than duplicated. A fresh run starts the files over.
Several records may share a step (training metrics, then ``val/*`` metrics): readers merge
them (``tools/plot_metrics.py`` does).

Metric names follow MindSpeed-RL: ``timing/*``, ``actor/pg_loss``, ``actor/pg_clipfrac``,
``actor/ppo_kl``, ``actor/kl_loss``, ``actor/entropy``, ``grad_norm``, ``actor/lr``,
``response_length/*``, ``prompt_length/*``, ``grpo/score``, ``{verifier}_rewards/mean``,
``e2e_tps``, ``update_tps``, ``vllm_tps``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from mindrl.storage import file_unlinked, write_failed
from mindrl.workers.skipped_updates import consecutive_skipped_metric, skipped_updates_metric

if TYPE_CHECKING:
    from mindrl.config.rl import LoggingConfig
    from mindrl.trainer.trackers import Trackers

METRICS_FILE = "metrics.jsonl"
COMPLETIONS_FILE = "completions.jsonl"
TENSORBOARD_DIR = "tensorboard"
REWARD_MEAN_SUFFIX = "_rewards/mean"

# (metric key, console label, format). Reward means are inserted after grpo/score.
_CONSOLE_HEAD: tuple[tuple[str, str, str], ...] = (
    ("grpo/score", "score", ".4f"),
    ("val/score", "val_score", ".4f"),
    # offline DPO (TRL's names)
    ("dpo/loss", "dpo_loss", ".4f"),
    ("rewards/accuracies", "reward_acc", ".3f"),
    ("rewards/margins", "margin", ".4g"),
)
_CONSOLE_TAIL: tuple[tuple[str, str, str], ...] = (
    ("response_length/mean", "resp_len", ".1f"),
    ("actor/pg_loss", "pg_loss", ".4g"),
    ("actor/kl_loss", "kl_loss", ".4g"),
    ("actor/entropy", "entropy", ".4g"),
    ("grad_norm", "grad_norm", ".4g"),
    # non-finite updates skipped: over the run, and in a row now; shown once there are any
    (skipped_updates_metric("actor"), "skipped", "count"),
    (consecutive_skipped_metric("actor"), "skipped_in_a_row", "count"),
    (skipped_updates_metric("critic"), "critic_skipped", "count"),
    (consecutive_skipped_metric("critic"), "critic_skipped_in_a_row", "count"),
    ("timing/step", "step_time", "time"),
    ("e2e_tps", "e2e_tps", ".1f"),
)


# ---------------------------------------------------------------------------- pure helpers
def to_float_or_none(value: Any) -> float | None:
    """A metric value as a JSON-safe float: NaN/inf become None (JSON null)."""
    if value is None:
        return None
    if hasattr(value, "item"):  # torch / numpy scalars
        value = value.item()
    out = float(value)
    return out if math.isfinite(out) else None


def _json_safe(value: Any) -> Any:
    """Recursively replace non-finite floats by None so `allow_nan=False` JSON can be written."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "tolist"):  # torch tensors / numpy arrays and scalars
        return _json_safe(value.tolist())
    return str(value)


def summarize(values: Iterable[float], prefix: str) -> dict[str, float]:
    """``{prefix/mean, prefix/max, prefix/min}``; NaN for an empty input (logged as null)."""
    vals = [float(v) for v in values]
    if not vals:
        nan = float("nan")
        return {f"{prefix}/mean": nan, f"{prefix}/max": nan, f"{prefix}/min": nan}
    return {
        f"{prefix}/mean": math.fsum(vals) / len(vals),
        f"{prefix}/max": max(vals),
        f"{prefix}/min": min(vals),
    }


def format_duration(seconds: float | None) -> str:
    """Compact duration for the console: ``45s``, ``1m23s``, ``2h05m``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    total = int(round(seconds))
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def progress_prefix(step: int, total_steps: int, mean_step_seconds: float | None) -> str:
    """``[12/40  30%] eta 1m23s``: ETA = mean step time x steps left (floor of the percent)."""
    width = len(str(total_steps))
    pct = int(100 * step / total_steps) if total_steps > 0 else 0
    left = max(total_steps - step, 0)
    eta = None if mean_step_seconds is None else mean_step_seconds * left
    return f"[{step:>{width}}/{total_steps} {pct:>3d}%] eta {format_duration(eta)}"


def console_fields(metrics: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, text) pairs of the key metrics, in a fixed order; absent metrics are skipped,
    and so are counts (format `count`) while they are 0."""
    names = [k[: -len(REWARD_MEAN_SUFFIX)] for k in metrics if k.endswith(REWARD_MEAN_SUFFIX)]
    names.sort(key=lambda n: ("/" in n, n))  # training rewards, then val/..., each by name
    spec = list(_CONSOLE_HEAD)
    spec += [(n + REWARD_MEAN_SUFFIX, n.replace("/", "_"), ".4f") for n in names]
    spec += list(_CONSOLE_TAIL)
    out = []
    for key, label, fmt in spec:
        if key not in metrics:
            continue
        value = to_float_or_none(metrics[key])
        if fmt == "count" and not value:
            continue
        if value is None:
            text = "nan"
        elif fmt == "count":
            text = str(int(value))
        elif fmt == "time":
            text = f"{value:.2f}s"
        else:
            text = format(value, fmt)
        out.append((label, text))
    return out


def console_line(
    step: int, total_steps: int, metrics: Mapping[str, Any], mean_step_seconds: float | None
) -> str:
    """The whole console line for one step (plain text, no carriage returns)."""
    prefix = progress_prefix(step, total_steps, mean_step_seconds)
    fields = " ".join(f"{label}={text}" for label, text in console_fields(metrics))
    return f"{prefix} | {fields}" if fields else prefix


# ---------------------------------------------------------------------------- timing
class Timer:
    """Accumulates wall-clock seconds per name; ``metrics()`` gives ``timing/<name>``.

    Entering the same name twice in a step adds up (e.g. several reward batches), which is
    why this is not a plain ``time.perf_counter()`` pair in the loop.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = self._clock()
        try:
            yield
        finally:
            self.record(name, self._clock() - start)

    def record(self, name: str, seconds: float) -> None:
        """Add a duration measured elsewhere (e.g. work that overlapped another timed one)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def metrics(self) -> dict[str, float]:
        return {f"timing/{name}": secs for name, secs in self.seconds.items()}

    def reset(self) -> None:
        self.seconds.clear()


# ---------------------------------------------------------------------------- file helpers
def _fsync_write(fh: IO[str], text: str) -> None:
    fh.write(text)
    fh.flush()
    os.fsync(fh.fileno())


def iter_step_records(path: str | Path) -> Iterator[tuple[str, dict[str, Any], int]]:
    """(line, record, step) for every well-formed line of a metrics JSONL file; torn or
    malformed lines (a crash mid-write) are skipped."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                record = json.loads(line)
                step = int(record["step"])
            except (ValueError, KeyError, TypeError):
                continue
            yield line, record, step


def merged_step_records(path: str | Path) -> list[dict[str, Any]]:
    """One merged record per step, sorted by step; torn lines are skipped. Records sharing
    a step (training metrics, then val/* ones) are merged; for a key logged twice at one
    step the later value wins."""
    by_step: dict[int, dict[str, Any]] = {}
    for _, record, step in iter_step_records(path):
        by_step.setdefault(step, {}).update(record)
    return [by_step[s] for s in sorted(by_step)]


def truncate_jsonl(path: Path, keep_through: int) -> int:
    """Keep only well-formed lines with ``step <= keep_through`` (atomically); returns the count.

    A negative ``keep_through`` empties the file. A torn last line (crash mid-write) is not
    valid JSON and is dropped too.
    """
    if not path.exists():
        return 0
    kept = [
        line if line.endswith("\n") else line + "\n"
        for line, _, step in iter_step_records(path)
        if step <= keep_through
    ]
    temp = path.with_name(f".{path.name}.tmp")
    with open(temp, "w", encoding="utf-8") as fh:
        _fsync_write(fh, "".join(kept))
    os.replace(temp, path)
    return len(kept)


# ---------------------------------------------------------------------------- the logger
class MetricsLogger:
    """Writes each step's metrics to JSONL (fsynced), TensorBoard (optional) and the console.

    Use as a context manager around the training loop; see the module docstring for the
    meaning of ``start_step``. ETA uses the mean wall-clock time between the first ``log``
    calls of consecutive new steps in this session, so checkpoint and validation time are
    part of the estimate; a further ``log`` of the same step (validation) adds no interval.
    The first step uses its ``timing/step`` metric when given (the time since the logger
    opened includes start-up), else the time since opening.
    """

    def __init__(
        self,
        output_dir: str | Path,
        *,
        use_tensorboard: bool,
        total_steps: int,
        console: bool = True,
        log_completions: int = 0,
        start_step: int = 0,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        tracking: LoggingConfig | None = None,
        run_config: Mapping[str, Any] | None = None,
    ) -> None:
        """``tracking``: the run's `LoggingConfig`, whose use_wandb / use_swanlab open trackers
        (``run_config`` is stored as their run config)."""
        if total_steps <= 0:
            raise ValueError(f"total_steps must be > 0, got {total_steps}")
        if log_completions < 0 or start_step < 0:
            raise ValueError("log_completions and start_step must be >= 0")
        self.output_dir = Path(output_dir)
        self.use_tensorboard = use_tensorboard
        self.total_steps = total_steps
        self.console = console
        self.max_completions = log_completions
        self.start_step = start_step
        self._stream = stream
        self._clock = clock
        self._metrics_fh: IO[str] | None = None
        self._completions_fh: IO[str] | None = None
        self._writer: Any = None
        self._last_time: float | None = None
        self._last_step = start_step
        self._step_seconds: list[float] = []
        self._tracking, self._run_config = tracking, run_config
        self._trackers: Trackers | None = None

    @property
    def metrics_path(self) -> Path:
        return self.output_dir / METRICS_FILE

    @property
    def completions_path(self) -> Path:
        return self.output_dir / COMPLETIONS_FILE

    @property
    def tensorboard_dir(self) -> Path:
        return self.output_dir / TENSORBOARD_DIR

    @property
    def mean_step_seconds(self) -> float | None:
        """Mean duration of the steps logged by this session (None before the first)."""
        if not self._step_seconds:
            return None
        return math.fsum(self._step_seconds) / len(self._step_seconds)

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> MetricsLogger:
        if self._metrics_fh is not None:
            return self
        self.output_dir.mkdir(parents=True, exist_ok=True)
        keep_through = self.start_step if self.start_step > 0 else -1
        truncate_jsonl(self.metrics_path, keep_through)
        self._metrics_fh = open(self.metrics_path, "a", encoding="utf-8")
        if self.max_completions > 0:
            truncate_jsonl(self.completions_path, keep_through)
            self._completions_fh = open(self.completions_path, "a", encoding="utf-8")
        if self.use_tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step hides events of steps > start_step left by the crashed run.
            purge = self.start_step + 1 if self.start_step > 0 else None
            self._writer = SummaryWriter(log_dir=str(self.tensorboard_dir), purge_step=purge)
        if self._tracking is not None and (self._tracking.use_wandb or self._tracking.use_swanlab):
            from mindrl.trainer.trackers import open_trackers

            try:
                self._trackers = open_trackers(self._tracking, self.output_dir, self._run_config)
            except BaseException:
                self.close()
                raise
        self._last_time = self._clock()
        return self

    def close(self, failed: bool = False) -> None:
        """Close every sink; ``failed`` marks the tracker runs as failed."""
        if self._trackers is not None:
            self._trackers.close(failed)
            self._trackers = None
        # a write that failed was already raised, named; closing must not mask it
        for fh in (self._metrics_fh, self._completions_fh):
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.close()
        self._metrics_fh = self._completions_fh = None
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None

    def __enter__(self) -> MetricsLogger:
        return self.open()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(failed=exc_type is not None)

    # ------------------------------------------------------------------ logging
    @staticmethod
    def _append(fh: IO[str], path: Path, text: str) -> None:
        """Append and fsync; a failure (full disk, the file or its folder removed, so the
        lines would reach no file) is a `StorageError` naming the file."""
        try:
            if file_unlinked(fh.fileno()):
                raise FileNotFoundError(f"{path} was removed while the run wrote it")
            _fsync_write(fh, text)
        except OSError as exc:
            raise write_failed(path.parent, path.name, exc) from None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record one step's metrics in every enabled sink (JSONL is fsynced before return)."""
        if self._metrics_fh is None:
            raise RuntimeError("MetricsLogger.log() called outside its `with` block")
        if "step" in metrics or "time" in metrics:
            raise ValueError("'step' and 'time' are reserved keys of metrics.jsonl records")
        if step > self._last_step:  # a new step: one more interval for the ETA
            now = self._clock()
            elapsed = now - self._last_time if self._last_time is not None else 0.0
            if not self._step_seconds and "timing/step" in metrics:
                elapsed = to_float_or_none(metrics["timing/step"]) or elapsed
            self._step_seconds.append(elapsed)
            self._last_time, self._last_step = now, step

        values = {str(k): to_float_or_none(v) for k, v in metrics.items()}
        record = {"step": int(step), "time": time.time(), **values}
        self._append(
            self._metrics_fh, self.metrics_path, json.dumps(record, allow_nan=False) + "\n"
        )
        if self._writer is not None:
            try:
                for key, value in values.items():
                    if value is not None:
                        self._writer.add_scalar(key, value, global_step=int(step))
                self._writer.flush()  # raises what the writer's thread met
            except Exception as exc:
                raise write_failed(
                    self.tensorboard_dir, f"TensorBoard events of step {step}", exc
                ) from None
        if self._trackers:
            self._trackers.log(int(step), values)
        if self.console:
            line = console_line(step, self.total_steps, metrics, self.mean_step_seconds)
            print(line, file=self._stream or sys.stdout, flush=True)

    def log_completions(self, step: int, records: list[dict[str, Any]]) -> int:
        """Append the first ``log_completions`` records (prompt, response, label, rewards).

        Returns how many were written (0 when completion logging is off).
        """
        if self.max_completions == 0:
            return 0
        if self._completions_fh is None:
            raise RuntimeError("MetricsLogger.log_completions() called outside its `with` block")
        chosen = records[: self.max_completions]
        lines = [
            json.dumps(_json_safe({"step": int(step), **rec}), allow_nan=False, ensure_ascii=False)
            + "\n"
            for rec in chosen
        ]
        self._append(self._completions_fh, self.completions_path, "".join(lines))
        return len(chosen)
