"""The actor's Ray shell: one rank of the trained policy, with the hybrid rollout engine on
the same rank unless rollout has its own devices (`rl_config.rollout_resource`).

The work is done by Ray-free parts this shell wires together: the optimizer
(`models/optimizer.py`), the policy update (`workers/policy_update.py`), the hybrid engine
(`workers/hybrid_engine.py`), the weight transfer to a separate rollout group
(`workers/weight_transfer.py`) and the per-rank checkpoint state
(`checkpoint/train_state.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mindrl.config.run import RunConfig
from mindrl.workers.megatron_worker import MegatronModelWorker

if TYPE_CHECKING:
    from mindrl.data.batch import SampleBatch
    from mindrl.models.optimizer import TrainingOptimizer
    from mindrl.rollout.base import RolloutSampling
    from mindrl.rollout.rows import RolloutRow
    from mindrl.workers.hybrid_engine import HybridEngine
    from mindrl.workers.policy_update import PolicyUpdater


class ActorWorker(MegatronModelWorker):
    """Trains the policy; owns a rollout engine when `with_rollout` (the hybrid layout)."""

    def __init__(self, run: RunConfig, with_rollout: bool = True):
        super().__init__(run, "actor")
        self.with_rollout = with_rollout
        self.opt: TrainingOptimizer | None = None
        self.updater: PolicyUpdater | None = None
        self.hybrid: HybridEngine | None = None

    # -- set-up -----------------------------------------------------------------------------
    def wrap_model(self, model: Any, chunk_index: int) -> Any:
        from mindrl.models.optimizer import wrap_for_training

        return wrap_for_training(model, self.cfg, chunk_index)

    def init_model(self, resume_dir: str | None = None) -> dict[str, int]:
        from mindrl.accelerator import get_accelerator
        from mindrl.models.optimizer import build_optimizer
        from mindrl.workers.policy_update import PolicyUpdater

        info = super().init_model(resume_dir)
        cfg = self.cfg
        total = cfg.optim.train_iters * self.run.optimizer_steps_per_rl_step
        on_cpu = get_accelerator(self.run.runtime.accelerator).is_cpu
        self.opt = build_optimizer(cfg, self.model_chunks, total, on_cpu=on_cpu)
        self.updater = PolicyUpdater(
            self.model_chunks,
            self.opt,
            self.run.rl.algorithm,
            vocab_size=cfg.model.vocab_size,
            micro_batch=cfg.batch.micro_batch_size,
            clip_grad=cfg.optim.clip_grad,
            dp_size=self.info.dp_size,
            seed=cfg.data.seed,
            max_tokens=self.run.generate.sampling_config.max_tokens,
        )
        if resume_dir is not None:
            self.load_checkpoint(resume_dir, not cfg.ckpt.no_load_optim, not cfg.ckpt.no_load_rng)
        if self.with_rollout:
            self._build_hybrid_engine()
        return info

    def _build_hybrid_engine(self) -> None:
        from mindrl.workers.hybrid_engine import HybridEngine
        from mindrl.workers.offload import TrainingStateOffload

        assert self.opt is not None
        self.hybrid = HybridEngine(self.run, self.info.rank, self.cfg.model)
        offload = TrainingStateOffload(
            self.model_chunks, self.opt.optimizer, self.run.generate, self.run.runtime.accelerator
        )
        self.hybrid.build(self.engine_model_dir(), self.cfg.data.seed, offload)

    def engine_model_dir(self) -> str:
        """The HF folder (config + tokenizer) a rollout engine starts from."""
        from mindrl.workers.hybrid_engine import engine_model_dir

        return engine_model_dir((self.cfg.ckpt.load, self.cfg.data.tokenizer_name_or_path))

    # -- rollout (hybrid layout) ------------------------------------------------------------
    def rollout_rank(self) -> int:
        return self._hybrid().slice.index

    def generate(
        self, prompts: list[list[int]], sampling: RolloutSampling
    ) -> list[RolloutRow] | None:
        return self._hybrid().generate(prompts, sampling)

    def sync_weights(self) -> dict[str, float]:
        return self._hybrid().sync_weights(self.model_chunks)

    def rollout_mode(self) -> None:
        self._hybrid().rollout_mode()

    def train_mode(self) -> None:
        if self.hybrid is not None:
            self.hybrid.train_mode()

    def pack_weights(self) -> list[Any]:
        """For a separate rollout group: the weights as object-store buckets (rank 0 sends)."""
        from mindrl.workers.weight_transfer import pack_weight_buckets

        bucket = self.run.generate.weight_sync_bucket_mb << 20
        return pack_weight_buckets(
            self.model_chunks, self.cfg.model, bucket, sender=self.info.rank == 0
        )

    # -- training ---------------------------------------------------------------------------
    def update(self, batch: SampleBatch, step: int) -> dict[str, float]:
        self.train_mode()
        return self._updater().update(batch, step)

    # -- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self, iter_dir: str) -> None:
        """Collective: model shards (reshardable) + this rank's optimizer / RNG state."""
        import torch.distributed as dist

        from mindrl.checkpoint.mcore_io import McoreCheckpointInfo, megatron_core_version
        from mindrl.checkpoint.rng_state import RngState
        from mindrl.checkpoint.train_state import RankTrainState, save_model_shards, save_rank_state

        cfg = self.cfg
        info = McoreCheckpointInfo(
            arch=cfg.model,
            params_dtype=cfg.precision.params_dtype,
            iteration=None,
            tensor_parallel_size=cfg.tp,
            pipeline_parallel_size=cfg.pp,
            megatron_core_version=megatron_core_version(),
        )
        save_model_shards(self.model_chunks, iter_dir, info)
        opt, updater, ckpt = self._opt(), self._updater(), cfg.ckpt
        optimizer_state = None
        if not ckpt.no_save_optim:
            optimizer_state = self._save_optimizer_state(iter_dir)
        state = RankTrainState(
            optimizer=optimizer_state,
            scheduler=None if ckpt.no_save_optim else opt.scheduler.state_dict(),
            skipped_updates=updater.skipped_updates,
            rng=None if ckpt.no_save_rng else RngState.capture(),
        )
        save_rank_state(iter_dir, self.info.rank, state)
        dist.barrier()

    def load_checkpoint(
        self, iter_dir: str, load_optim: bool = True, load_rng: bool = True
    ) -> None:
        from pathlib import Path

        from mindrl.checkpoint.mcore_io import load_mcore_checkpoint
        from mindrl.checkpoint.train_state import MODEL_DIR, load_rank_state

        load_mcore_checkpoint(self.model_chunks, Path(iter_dir) / MODEL_DIR, arch=self.cfg.model)
        if not (load_optim or load_rng):
            return
        state = load_rank_state(iter_dir, self.info.rank)
        state.require(load_optim=load_optim, load_rng=load_rng)
        if load_optim:
            opt = self._opt()
            self._load_optimizer_state(iter_dir, state.optimizer)
            opt.scheduler.load_state_dict(state.scheduler)
            self._updater().skipped_updates = state.skipped_updates
        if load_rng and state.rng is not None:
            state.rng.restore()

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

    def export_hf(self, out_dir: str, hf_assets_dir: str | None = None) -> str | None:
        from mindrl.checkpoint.online import export_mcore_to_hf

        path = export_mcore_to_hf(
            self.model_chunks,
            out_dir,
            arch=self.cfg.model,
            hf_assets_dir=hf_assets_dir,
            overwrite=True,
        )
        return str(path) if path is not None else None

    def shutdown(self) -> None:
        if self.hybrid is not None:
            self.hybrid.close()
            self.hybrid = None
        super().shutdown()

    # -- typed access to what init_model built ----------------------------------------------
    def _hybrid(self) -> HybridEngine:
        if self.hybrid is None:
            raise RuntimeError(
                "this actor holds no rollout engine (rl_config.rollout_resource is set)"
            )
        return self.hybrid

    def _opt(self) -> TrainingOptimizer:
        if self.opt is None:
            raise RuntimeError("init_model has not run")
        return self.opt

    def _updater(self) -> PolicyUpdater:
        if self.updater is None:
            raise RuntimeError("init_model has not run")
        return self.updater
