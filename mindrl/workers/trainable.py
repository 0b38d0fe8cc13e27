"""What the trained roles (actor, critic) share on top of a megatron model: an optimizer, an
updater counting skipped steps, and the per-rank checkpoint (model shards, optimizer,
scheduler, RNG) that makes resume exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from mindrl.workers.megatron_worker import MegatronModelWorker
from mindrl.workers.skipped_updates import SkippedUpdates

if TYPE_CHECKING:
    from mindrl.models.optimizer import TrainingOptimizer


class CountsSkippedUpdates(Protocol):
    skips: SkippedUpdates


class TrainableWorker(MegatronModelWorker):
    """A megatron role that trains: `init_model` of a subclass sets `opt` and `updater`."""

    opt: TrainingOptimizer | None = None
    updater: CountsSkippedUpdates | None = None

    def wrap_model(self, model: Any, chunk_index: int) -> Any:
        """Each chunk in megatron's DDP (grad buffers the optimizer steps on)."""
        from mindrl.models.optimizer import wrap_for_training

        return wrap_for_training(model, self.cfg, chunk_index)

    def build_optimizer(self) -> TrainingOptimizer:
        """This role's optimizer and LR schedule over the whole run's optimizer steps."""
        from mindrl.accelerator import get_accelerator
        from mindrl.models.optimizer import build_optimizer

        total = self.cfg.optim.train_iters * self.run.optimizer_steps_per_rl_step
        on_cpu = get_accelerator(self.run.runtime.accelerator).is_cpu
        return build_optimizer(self.cfg, self.model_chunks, total, on_cpu=on_cpu)

    def resume_from(self, iter_dir: str) -> None:
        """Load a trainer checkpoint's part for this role, optimizer / RNG as the role asks."""
        ckpt = self.cfg.ckpt
        self.load_checkpoint(iter_dir, not ckpt.no_load_optim, not ckpt.no_load_rng)

    # -- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self, iter_dir: str) -> None:
        """Collective: model shards (reshardable) + this rank's optimizer / RNG state."""
        import torch.distributed as dist

        from mindrl.checkpoint.mcore_io import McoreCheckpointInfo, ModelPart, megatron_core_version
        from mindrl.checkpoint.rng_state import RngState
        from mindrl.checkpoint.train_state import (
            RankTrainState,
            save_model_shards,
            save_rank_state,
            write_lora_base,
        )

        cfg = self.cfg
        info = McoreCheckpointInfo(
            arch=self.model_arch(),
            params_dtype=cfg.precision.params_dtype,
            iteration=None,
            tensor_parallel_size=cfg.tp,
            pipeline_parallel_size=cfg.pp,
            megatron_core_version=megatron_core_version(),
        )
        part = self._checkpoint_part()
        save_model_shards(self.model_chunks, iter_dir, info, part)
        if part is ModelPart.ADAPTERS and self.info.rank == 0:
            write_lora_base(iter_dir, self.base_dir)
        opt, updater, ckpt = self._opt(), self._updater(), cfg.ckpt
        optimizer_state = None
        if not ckpt.no_save_optim:
            optimizer_state = self._save_optimizer_state(iter_dir)
        state = RankTrainState(
            optimizer=optimizer_state,
            scheduler=None if ckpt.no_save_optim else opt.scheduler.state_dict(),
            skipped_updates=updater.skips.total,
            rng=None if ckpt.no_save_rng else RngState.capture(),
        )
        save_rank_state(iter_dir, self.info.rank, state)
        dist.barrier()

    def load_checkpoint(
        self, iter_dir: str, load_optim: bool = True, load_rng: bool = True
    ) -> None:
        from pathlib import Path

        from mindrl.checkpoint.mcore_io import ModelPart, load_mcore_checkpoint
        from mindrl.checkpoint.train_state import MODEL_DIR, load_rank_state, read_lora_base

        part = self._checkpoint_part()
        if part is ModelPart.ADAPTERS:  # the frozen base: from where the saving run had it
            self.load_weights(read_lora_base(iter_dir))
        load_mcore_checkpoint(
            self.model_chunks, Path(iter_dir) / MODEL_DIR, arch=self.model_arch(), part=part
        )
        if not (load_optim or load_rng):
            return
        state = load_rank_state(iter_dir, self.info.rank)
        state.require(load_optim=load_optim, load_rng=load_rng)
        if load_optim:
            opt = self._opt()
            self._load_optimizer_state(iter_dir, state.optimizer)
            opt.scheduler.load_state_dict(state.scheduler)
            # the streak starts over: with the stop on, no checkpoint is saved inside one
            self._updater().skips = SkippedUpdates(total=state.skipped_updates)
        if load_rng and state.rng is not None:
            state.rng.restore()

    def _checkpoint_part(self) -> Any:
        """lora_ckpt_filter: step checkpoints hold the adapters only (MindSpeed-LLM's filter)."""
        from mindrl.checkpoint.mcore_io import ModelPart

        if self.has_adapters and self.cfg.lora.lora_ckpt_filter:
            return ModelPart.ADAPTERS
        return ModelPart.ALL

    def _save_optimizer_state(self, iter_dir: str) -> dict[str, Any]:
        """The replicated optimizer's state goes in the rank file; the distributed one's is
        written (collectively) in parameter space, and the rank file points to it."""
        from mindrl.checkpoint import distributed_optimizer as dist_optim

        optimizer = self._opt().optimizer
        if not dist_optim.is_distributed(optimizer):
            return optimizer.state_dict()
        dist_optim.save_distributed_optimizer(optimizer, self.model_chunks, iter_dir)
        return dict(dist_optim.RANK_FILE_MARKER)

    def _load_optimizer_state(self, iter_dir: str, saved: dict[str, Any] | None) -> None:
        from mindrl.checkpoint import distributed_optimizer as dist_optim
        from mindrl.checkpoint.errors import CheckpointReadError
        from mindrl.models.host_adam import fuse_host_adam

        optimizer = self._opt().optimizer
        in_folder = saved == dist_optim.RANK_FILE_MARKER
        if dist_optim.is_distributed(optimizer) != in_folder:
            raise CheckpointReadError(
                iter_dir,
                "saved "
                + ("with" if in_folder else "without")
                + " the distributed optimizer and resumed "
                + ("without" if in_folder else "with")
                + " it: set use_distributed_optimizer as when it was saved, or no_load_optim",
            )
        if in_folder:
            dist_optim.load_distributed_optimizer(optimizer, self.model_chunks, iter_dir)
        else:
            optimizer.load_state_dict(saved)
        fuse_host_adam(optimizer)  # the loaded param groups carry the saving run's options

    def _opt(self) -> TrainingOptimizer:
        if self.opt is None:
            raise RuntimeError("init_model has not run")
        return self.opt

    def _updater(self) -> Any:
        if self.updater is None:
            raise RuntimeError("init_model has not run")
        return self.updater
