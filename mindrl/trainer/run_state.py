"""The driver's share of a checkpoint, and megatron's iteration-folder layout around it.

Layout (what megatron's training loop writes, so its tools find their way)::

    ROOT/latest_checkpointed_iteration.txt   the newest committed step, e.g. "7"
    ROOT/iter_0000007/                        state after step 7 (complete or absent)
        run_state.json                        this module: step, sampler, RNG, KL controller
        ...                                   worker shards (model, optimizer), same folder
    ROOT/.iter_0000008.tmp-1a2b3c4d/          a save in progress (or left by a crash)

A save is ``begin(step)`` -> everyone writes into the returned temporary folder ->
``commit(step)``: fsync, rename onto ``iter_XXXXXXX``, then replace the tracker. A crash at
any point leaves either the previous checkpoint or the new one, never half of one:
``latest()`` ignores temporary folders and the next ``begin()`` removes them.

``run_state.json`` is plain JSON (RNG states included, torch's as base64 bytes): readable,
no pickle, and exact, since Python's float repr and integer lists round-trip bit for bit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindrl.checkpoint.atomic import atomic_write_text, fsync_dir, fsync_tree
from mindrl.checkpoint.mcore_io import RELEASE, TRACKER_FILE, iteration_dir_name
from mindrl.checkpoint.rng_state import RngState

logger = logging.getLogger(__name__)

RUN_STATE_FILE = "run_state.json"
RUN_STATE_FORMAT = 1
_ITER_RE = re.compile(r"^iter_(\d{7,})$")
_SCRATCH_RE = re.compile(r"^\.iter_\d{7,}\.(tmp|old|del)-[0-9a-f]+$")


# ---------------------------------------------------------------------------- run state
@dataclass(frozen=True)
class RunState:
    """Everything the driver needs to continue a run exactly where a checkpoint left it.

    ``step`` is the number of completed steps (the checkpoint folder's iteration);
    ``sampler`` is ``ResumableSampler.state_dict()``; ``kl_ctrl`` the KL controller's
    ``state_dict()``; ``extra`` any JSON-serializable driver data (e.g. best val score).
    """

    step: int
    sampler: dict[str, int]
    rng: RngState
    kl_ctrl: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.step < 0:
            raise ValueError(f"RunState.step must be >= 0, got {self.step}")
        missing = {"epoch", "position"} - set(self.sampler)
        if missing:
            raise ValueError(f"RunState.sampler lacks {sorted(missing)}: {self.sampler}")

    @classmethod
    def capture(
        cls,
        step: int,
        sampler: Mapping[str, int],
        kl_ctrl: Mapping[str, float] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> RunState:
        """A RunState with the driver's RNG states as they are now."""
        return cls(
            step=int(step),
            sampler={k: int(v) for k, v in sampler.items()},
            rng=RngState.capture(),
            kl_ctrl=dict(kl_ctrl or {}),
            extra=dict(extra or {}),
        )


def save_run_state(directory: str | Path, state: RunState) -> Path:
    """Write ``directory/run_state.json`` (fsynced); returns its path."""
    path = Path(directory) / RUN_STATE_FILE
    payload = {
        "format": RUN_STATE_FORMAT,
        "step": state.step,
        "sampler": state.sampler,
        "kl_ctrl": state.kl_ctrl,
        "extra": state.extra,
        "rng": state.rng.to_json(),
    }
    text = json.dumps(payload, indent=1)  # TypeError here names a non-JSON `extra` value
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return path


def load_run_state(directory: str | Path) -> RunState:
    """Read what ``save_run_state`` wrote; call ``state.rng.restore()`` to resume the RNGs."""
    path = Path(directory) / RUN_STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {directory} holds no driver run state")
    data = json.loads(path.read_text(encoding="utf-8"))
    if int(data.get("format", 0)) != RUN_STATE_FORMAT:
        raise ValueError(f"{path}: unsupported run-state format {data.get('format')!r}")
    return RunState(
        step=int(data["step"]),
        sampler={k: int(v) for k, v in data["sampler"].items()},
        rng=RngState.from_json(data["rng"]),
        kl_ctrl=dict(data.get("kl_ctrl", {})),
        extra=dict(data.get("extra", {})),
    )


# ---------------------------------------------------------------------------- folders
class CheckpointDirs:
    """megatron's ``iter_XXXXXXX`` + tracker layout under ``root``, with atomic commits."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._pending: dict[int, Path] = {}

    @property
    def tracker(self) -> Path:
        return self.root / TRACKER_FILE

    def iteration_dir(self, step: int) -> Path:
        """Where a committed checkpoint of ``step`` lives (it may not exist)."""
        return self.root / iteration_dir_name(step)

    # ------------------------------------------------------------------ saving
    def begin(self, step: int) -> Path:
        """Create and return the temporary folder every writer of ``step`` saves into."""
        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0, got {step}")
        if step in self._pending:
            raise RuntimeError(f"begin({step}) called twice without commit/abort")
        self.root.mkdir(parents=True, exist_ok=True)
        self.clean_scratch()
        temp = self._scratch(step, "tmp")
        temp.mkdir()
        self._pending[step] = temp
        return temp

    def pending(self, step: int) -> Path:
        """The temporary folder of a save begun and not yet committed."""
        try:
            return self._pending[step]
        except KeyError:
            raise RuntimeError(f"no checkpoint save of step {step} in progress") from None

    def commit(self, step: int) -> Path:
        """Make ``iter_XXXXXXX`` appear complete, then point the tracker at it."""
        if step not in self._pending:
            raise RuntimeError(f"commit({step}) without begin({step})")
        temp = self._pending[step]
        if not temp.is_dir():
            raise RuntimeError(f"temporary checkpoint folder {temp} vanished before commit")
        final = self.iteration_dir(step)
        fsync_tree(temp)
        old = None
        if final.exists():  # re-saving a step (run resumed from an older checkpoint)
            old = self._scratch(step, "old")
            os.replace(final, old)
        os.replace(temp, final)
        fsync_dir(self.root)
        del self._pending[step]
        atomic_write_text(self.tracker, f"{step}\n")
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def abort(self, step: int) -> None:
        """Drop a save in progress (its temporary folder is removed)."""
        temp = self._pending.pop(step, None)
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)

    @contextlib.contextmanager
    def saving(self, step: int) -> Iterator[Path]:
        """``begin`` / ``commit`` around a block; on an exception the save is aborted."""
        temp = self.begin(step)
        try:
            yield temp
        except BaseException:
            self.abort(step)
            raise
        self.commit(step)

    # ------------------------------------------------------------------ reading
    def steps(self) -> list[int]:
        """Steps with a complete (committed) folder, ascending."""
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            match = _ITER_RE.match(entry.name)
            if match and entry.is_dir():
                found.append(int(match.group(1)))
        return sorted(found)

    def latest(self) -> int | None:
        """The step to resume from: the tracker's, else the newest complete folder."""
        try:
            text = self.tracker.read_text().strip()
        except FileNotFoundError:
            text = None
        if text is not None and text != RELEASE:  # a converted "release" is no trained step
            if text.isdigit() and self.iteration_dir(int(text)).is_dir():
                return int(text)
            logger.warning(
                "%s holds %r, which names no complete iteration folder; scanning %s",
                self.tracker,
                text,
                self.root,
            )
        steps = self.steps()
        return steps[-1] if steps else None

    # ------------------------------------------------------------------ housekeeping
    def prune(self, keep_last: int) -> list[int]:
        """Delete the oldest complete folders beyond ``keep_last`` (0 keeps all).

        The tracker's step is never deleted. A folder is renamed to a scratch name before
        ``rmtree``, so a crash mid-delete cannot leave a partial ``iter_*`` that looks complete.
        """
        if keep_last < 0:
            raise ValueError(f"keep_last must be >= 0, got {keep_last}")
        if keep_last == 0:
            return []
        steps = self.steps()
        latest = self.latest()
        doomed = [s for s in steps[:-keep_last] if s != latest]
        for step in doomed:
            scratch = self._scratch(step, "del")
            os.replace(self.iteration_dir(step), scratch)
            shutil.rmtree(scratch, ignore_errors=True)
        if doomed:
            fsync_dir(self.root)
        return doomed

    def clean_scratch(self) -> list[Path]:
        """Remove temporary folders left by crashed saves (not those of saves in progress)."""
        if not self.root.is_dir():
            return []
        mine = set(self._pending.values())
        removed = []
        for entry in self.root.iterdir():
            if _SCRATCH_RE.match(entry.name) and entry not in mine:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
        return removed

    def _scratch(self, step: int, kind: str) -> Path:
        return self.root / f".{iteration_dir_name(step)}.{kind}-{secrets.token_hex(4)}"
