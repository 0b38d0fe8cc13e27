"""The driver's side of trainer checkpoints: where a run resumes, saving a step atomically,
and the final HF export.

Resume is MindSpeed-RL style: `actor_config.load` = a `save` folder (its newest committed
step), unless `finetune` asks for weights only. A latest checkpoint that is incomplete or
corrupt is never skipped silently: the run stops with one line naming the file, or, with
`actor_config.load_fallback: previous`, resumes from the newest older complete one and says
so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from mindrl.checkpoint.atomic import verify_manifest, write_manifest
from mindrl.checkpoint.errors import CheckpointReadError
from mindrl.checkpoint.mcore_io import iteration_dir_name
from mindrl.checkpoint.safe_load import check_dcp_folder
from mindrl.checkpoint.train_state import MODEL_DIR, verify_rank_states
from mindrl.config.run import RunConfig
from mindrl.storage import StorageError, check_room, is_out_of_space, write_failed
from mindrl.trainer.run_state import CheckpointDirs, RunState, load_run_state, save_run_state
from mindrl.workers.critic import CRITIC_DIR
from mindrl.workers.facades import ActorGroup, CriticGroup

logger = logging.getLogger("mindrl.trainer")


@dataclass(frozen=True)
class ResumePoint:
    iter_dir: Path
    state: RunState


def _read_complete(dirs: CheckpointDirs, step: int, reads_rank_states: bool) -> ResumePoint:
    """The driver state of `step`, after checking every file the save recorded and that
    the files the workers will read are plain data."""
    iter_dir = dirs.iteration_dir(step)
    verify_manifest(iter_dir)
    parts = [iter_dir] + ([iter_dir / CRITIC_DIR] if (iter_dir / CRITIC_DIR).is_dir() else [])
    for part in parts:  # the actor's, and PPO's critic's
        if reads_rank_states:
            verify_rank_states(part)
        check_dcp_folder(part / MODEL_DIR)
    try:
        state = load_run_state(iter_dir)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointReadError(iter_dir / "run_state.json", f"unreadable ({exc})") from exc
    return ResumePoint(iter_dir, state)


def find_resume_point(run: RunConfig) -> ResumePoint | None:
    """The checkpoint this run continues from, or None for a fresh start."""
    ckpt = run.actor.ckpt
    if not ckpt.load or ckpt.finetune or not Path(ckpt.load).is_dir():
        return None
    dirs = CheckpointDirs(ckpt.load)
    latest = dirs.latest()
    if latest is None:
        return None
    reads_rank_states = not (ckpt.no_load_optim and ckpt.no_load_rng)
    try:
        return _read_complete(dirs, latest, reads_rank_states)
    except CheckpointReadError as exc:
        older = [s for s in dirs.steps() if s < latest]
        if ckpt.load_fallback != "previous" or not older:
            hint = (
                f"; set actor_config.load_fallback=previous to resume from "
                f"{dirs.iteration_dir(older[-1]).name}"
                if older
                else "; no older complete checkpoint to fall back to"
            )
            raise CheckpointReadError(exc.path, exc.what + hint) from exc
        logger.warning(
            "checkpoint %s is damaged (%s); falling back to %s",
            dirs.iteration_dir(latest).name,
            exc,
            dirs.iteration_dir(older[-1]).name,
        )
        return _read_complete(dirs, older[-1], reads_rank_states)


def checkpoint_bytes_estimate(run: RunConfig) -> int:
    """A lower bound on one checkpoint's size from the parameter count: the actor's weights
    in their dtype, plus Adam's two fp32 moments when the optimizer is saved (its fp32 master
    copy and the critic's share are left out, so a save is never refused when it would fit)."""
    from mindrl.planning.params import model_params

    actor = run.actor
    params = model_params(actor.model)
    weight_bytes = 4 if actor.precision.params_dtype == "fp32" else 2
    optimizer_bytes = 0 if actor.ckpt.no_save_optim or actor.lora.enabled else 8
    return params * (weight_bytes + optimizer_bytes)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


class CheckpointWriter:
    """Saves trainer checkpoints under `actor_config.save` on the configured steps.

    A save that cannot fit is refused before it starts (the newest checkpoint's size, or
    before the first one the parameter count, against the folder's free space), and one that
    fails while writing for lack of space or because the folder vanished is named in one
    line (`StorageError`); either way the previous checkpoint stays the newest."""

    def __init__(self, run: RunConfig) -> None:
        self.run = run
        save = run.actor.ckpt.save
        self.dirs = CheckpointDirs(save) if save else None
        # the folder holds this run's checkpoints (resumed from, or committed): it must stay
        self._folder_in_use = self.dirs is not None and self.dirs.latest() is not None

    def due(self, step: int) -> bool:
        interval = self.run.actor.ckpt.save_interval
        if self.dirs is None:
            return False
        return step == self.run.actor.optim.train_iters or (interval > 0 and step % interval == 0)

    def expected_bytes(self) -> int:
        """What the next checkpoint needs: as large as the newest one, else the estimate."""
        assert self.dirs is not None
        latest = self.dirs.latest()
        if latest is not None:
            return max(folder_bytes(self.dirs.iteration_dir(latest)), 1)
        return checkpoint_bytes_estimate(self.run)

    def save(
        self, step: int, actor: ActorGroup, state: RunState, critic: CriticGroup | None = None
    ) -> Path:
        """Workers write into a temporary folder; it appears as `iter_XXXXXXX` only when
        complete (a crash at any point leaves the previous checkpoint). PPO's critic saves
        into its `critic/` subfolder: one step, one folder, one manifest."""
        assert self.dirs is not None, "no actor_config.save folder"
        root, what = self.dirs.root, f"checkpoint {iteration_dir_name(step)}"
        if self._folder_in_use and not root.is_dir():
            raise StorageError(
                f"cannot write {what}: the save folder {root.absolute()} vanished during the "
                "run (it held the checkpoints this run continues)"
            )
        needed = self.expected_bytes()
        check_room(root, what, needed)
        pending = self.dirs.begin(step)
        try:
            actor.save_checkpoint(str(pending))
            if critic is not None:
                critic.save_checkpoint(str(pending))
            save_run_state(pending, state)
            write_manifest(pending)
        except BaseException as exc:
            self.dirs.abort(step)
            if isinstance(exc, Exception) and (is_out_of_space(exc) or not root.is_dir()):
                raise write_failed(root, what, exc, needed) from None
            raise
        try:
            final = self.dirs.commit(step)
        except Exception as exc:
            self.dirs.abort(step)
            raise write_failed(root, what, exc, needed) from None
        self._folder_in_use = True
        self.dirs.prune(self.run.actor.ckpt.keep_last_n_checkpoints)
        return final

    def latest_name(self) -> str | None:
        """The newest committed checkpoint folder's name (for the interrupt message)."""
        if self.dirs is None:
            return None
        step = self.dirs.latest()
        return None if step is None else self.dirs.iteration_dir(step).name


def export_final(run: RunConfig, actor: ActorGroup) -> Path:
    """The final actor as an HF folder beside the checkpoints (or in the output dir); with
    LoRA that is the merged model, and the adapters go beside it as a PEFT folder."""
    root = Path(run.actor.ckpt.save or run.output_dir)
    target = root / "hf_final"
    try:
        actor.export_hf(str(target), run.actor.data.tokenizer_name_or_path)
    except Exception as exc:
        if is_out_of_space(exc) or not root.is_dir():
            raise write_failed(root, "the final HF export hf_final", exc) from None
        raise
    logger.info("final actor exported to %s", target)
    if run.actor.lora.enabled:
        adapter = root / "hf_final_adapter"
        actor.export_peft(str(adapter))
        logger.info("final LoRA adapters exported to %s (PEFT)", adapter)
    return target
