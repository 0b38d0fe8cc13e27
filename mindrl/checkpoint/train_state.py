"""A training rank's share of a trainer checkpoint: its model shards (dist_checkpointing,
reshardable), and its optimizer, LR-schedule, skipped-update count and RNG state.

Layout inside an iteration folder::

    model/                 dist_checkpointing folder (+ mindrl_checkpoint.json), all ranks
    optim/rank_00003.pt    per-rank optimizer / scheduler / counters / RNG
    lora_base.json         adapter-only checkpoints (`lora_ckpt_filter`): the base's folder

An adapter-only checkpoint names the folder the frozen base was loaded from (an HF folder or a
megatron checkpoint), so a resume, whose `load` is the save folder, finds the base again; a
resumed run passes the same name on.

Checkpoints are data someone else may have written: the per-rank file is read with
`torch.load(weights_only=True)` (tensors, numbers, strings and containers only; RNG states
as JSON-ready values), so a crafted file fails to load instead of running code.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindrl.checkpoint.atomic import atomic_write_text
from mindrl.checkpoint.errors import CheckpointReadError
from mindrl.checkpoint.rng_state import RngState

OPTIM_DIR = "optim"
MODEL_DIR = "model"
RANK_STATE_FORMAT = 1
LORA_BASE_FILE = "lora_base.json"


def rank_state_path(iter_dir: str | Path, rank: int) -> Path:
    return Path(iter_dir) / OPTIM_DIR / f"rank_{rank:05d}.pt"


@dataclass
class RankTrainState:
    """What one rank restores on resume besides the model weights; a part left out of the
    save (`no_save_optim` / `no_save_rng`) is None."""

    optimizer: dict[str, Any] | None
    scheduler: dict[str, Any] | None
    skipped_updates: int
    rng: RngState | None
    path: Path | None = None  # the file it was read from

    def require(self, *, load_optim: bool, load_rng: bool) -> None:
        """Refuse to resume a part the save left out, naming the flag that skips it."""
        for part, flag, wanted, held in (
            ("optimizer state", "no_load_optim", load_optim, self.optimizer),
            ("RNG state", "no_load_rng", load_rng, self.rng),
        ):
            if wanted and held is None:
                raise CheckpointReadError(
                    self.path, f"saved without its {part} (no_save_*): set {flag} to resume"
                )


def save_rank_state(iter_dir: str | Path, rank: int, state: RankTrainState) -> Path:
    import torch

    path = rank_state_path(iter_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "format": RANK_STATE_FORMAT,
            "optimizer": state.optimizer,
            "scheduler": state.scheduler,
            "skipped_updates": int(state.skipped_updates),
            "rng": state.rng.to_json() if state.rng is not None else None,
        },
        path,
    )
    return path


def _read_plain_data(path: Path, *, mmap: bool = False) -> dict[str, Any]:
    """`torch.load(weights_only=True)` with every failure as one `CheckpointReadError`."""
    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointReadError(
            path, f"refused: it holds more than plain data (weights_only load: {first})"
        ) from exc
    except (RuntimeError, EOFError, ValueError, OSError) as exc:
        raise CheckpointReadError(path, f"unreadable ({type(exc).__name__}: {exc})") from exc
    if not isinstance(data, dict) or data.get("format") != RANK_STATE_FORMAT:
        raise CheckpointReadError(path, "not a mindrl rank-state file (format missing)")
    return data


def load_rank_state(iter_dir: str | Path, rank: int) -> RankTrainState:
    """Read a rank's state without executing anything from the file.

    Raises `CheckpointReadError` naming the file when it is missing, truncated, of another
    format, or holds anything but plain data (a pickled object would need code to run).
    """
    path = rank_state_path(iter_dir, rank)
    if not path.is_file():
        raise CheckpointReadError(
            path,
            "missing: optimizer state resumes only at the TP/PP/DP layout it was saved with "
            "(set no_load_optim and no_load_rng to load weights only)",
        )
    data = _read_plain_data(path)
    try:
        return RankTrainState(
            optimizer=data["optimizer"],
            scheduler=data["scheduler"],
            skipped_updates=int(data["skipped_updates"]),
            rng=RngState.from_json(data["rng"]) if data["rng"] is not None else None,
            path=path,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointReadError(path, f"incomplete ({type(exc).__name__}: {exc})") from exc


def verify_rank_states(iter_dir: str | Path) -> int:
    """Check every rank's file parses as plain data, cheaply (tensor storages are memory-
    mapped, not read), so the driver can refuse a damaged checkpoint before workers start.
    Returns how many rank files there are."""
    files = sorted((Path(iter_dir) / OPTIM_DIR).glob("rank_*.pt"))
    for path in files:
        _read_plain_data(path, mmap=True)
    return len(files)


def save_model_shards(
    model_chunks: list[Any], iter_dir: str | Path, info: Any, part: Any = None
) -> None:
    """Collective: every rank writes its shards of the model (or of `part` of it, a
    `ModelPart`) into ITER/model/."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from mindrl.checkpoint.mcore_io import META_FILE, ModelPart, model_sharded_state_dict

    model_dir = Path(iter_dir) / MODEL_DIR
    if dist.get_rank() == 0:
        model_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    request = model_sharded_state_dict(model_chunks, part or ModelPart.ALL)
    dist_checkpointing.save(request, str(model_dir))
    if dist.get_rank() == 0:
        (model_dir / META_FILE).write_text(info.to_json())


def write_lora_base(iter_dir: str | Path, base_dir: str | None) -> None:
    if base_dir is None:
        raise ValueError("an adapter-only checkpoint needs the base's folder (actor_config.load)")
    atomic_write_text(Path(iter_dir) / LORA_BASE_FILE, json.dumps({"base": base_dir}) + "\n")


def read_lora_base(iter_dir: str | Path) -> str:
    """The base folder recorded by the saving run; it must still exist."""
    path = Path(iter_dir) / LORA_BASE_FILE
    try:
        base = json.loads(path.read_text())["base"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointReadError(
            path, f"unreadable ({exc}): an adapter-only checkpoint (lora_ckpt_filter) needs it"
        ) from exc
    if not isinstance(base, str) or not Path(base).exists():
        raise CheckpointReadError(
            path, f"the LoRA base {base!r} it names is gone; the adapters need that base"
        )
    return base
