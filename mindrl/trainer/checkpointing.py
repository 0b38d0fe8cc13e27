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
from mindrl.checkpoint.safe_load import check_dcp_folder
from mindrl.checkpoint.train_state import MODEL_DIR, verify_rank_states
from mindrl.config.run import RunConfig
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


class CheckpointWriter:
    """Saves trainer checkpoints under `actor_config.save` on the configured steps."""

    def __init__(self, run: RunConfig) -> None:
        self.run = run
        save = run.actor.ckpt.save
        self.dirs = CheckpointDirs(save) if save else None

    def due(self, step: int) -> bool:
        interval = self.run.actor.ckpt.save_interval
        if self.dirs is None:
            return False
        return step == self.run.actor.optim.train_iters or (interval > 0 and step % interval == 0)

    def save(
        self, step: int, actor: ActorGroup, state: RunState, critic: CriticGroup | None = None
    ) -> Path:
        """Workers write into a temporary folder; it appears as `iter_XXXXXXX` only when
        complete (a crash at any point leaves the previous checkpoint). PPO's critic saves
        into its `critic/` subfolder: one step, one folder, one manifest."""
        assert self.dirs is not None, "no actor_config.save folder"
        pending = self.dirs.begin(step)
        try:
            actor.save_checkpoint(str(pending))
            if critic is not None:
                critic.save_checkpoint(str(pending))
            save_run_state(pending, state)
            write_manifest(pending)
        except BaseException:
            self.dirs.abort(step)
            raise
        final = self.dirs.commit(step)
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
    actor.export_hf(str(target), run.actor.data.tokenizer_name_or_path)
    logger.info("final actor exported to %s", target)
    if run.actor.lora.enabled:
        adapter = root / "hf_final_adapter"
        actor.export_peft(str(adapter))
        logger.info("final LoRA adapters exported to %s (PEFT)", adapter)
    return target
