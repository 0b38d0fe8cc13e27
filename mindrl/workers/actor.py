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

from mindrl.config.dpo_keys import DPO
from mindrl.config.run import RunConfig
from mindrl.workers.profiling import profiled
from mindrl.workers.trainable import TrainableWorker

if TYPE_CHECKING:
    from mindrl.data.batch import SampleBatch
    from mindrl.data.tool_kwargs import ToolsKwargs
    from mindrl.models.optimizer import TrainingOptimizer
    from mindrl.models.weight_snapshot import WeightSnapshot
    from mindrl.rollout.base import RolloutRow, RolloutSampling
    from mindrl.workers.hybrid_engine import HybridEngine
    from mindrl.workers.policy_update import PolicyUpdater


class ActorWorker(TrainableWorker):
    """Trains the policy; owns a rollout engine when `with_rollout` (the hybrid layout)."""

    def __init__(self, run: RunConfig, with_rollout: bool = True):
        super().__init__(run, "actor")
        self.with_rollout = with_rollout
        self.opt: TrainingOptimizer | None = None
        self.updater: PolicyUpdater | None = None
        self.hybrid: HybridEngine | None = None
        self.ref_snapshot: WeightSnapshot | None = None  # rl_config.reference_in_actor

    # -- set-up -----------------------------------------------------------------------------
    def init_model(self, resume_dir: str | None = None) -> dict[str, int]:
        from mindrl.data.packing import pass_packing
        from mindrl.workers.policy_update import PolicyUpdater

        info = super().init_model(resume_dir)
        cfg = self.cfg
        if self.run.reference_snapshot:
            self._snapshot_reference(resumed=resume_dir is not None)
        self.opt = self.build_optimizer()
        updater: type[PolicyUpdater] = PolicyUpdater
        extra: dict[str, Any] = {}
        if cfg.data.stage == DPO:  # offline DPO: pairs, the DPO loss, a step per batch
            from mindrl.workers.dpo_update import DPOUpdater

            updater, extra = DPOUpdater, {"dpo": cfg.dpo.loss_config()}
        self.updater = updater(
            self.model_chunks,
            self.opt,
            self.run.rl.algorithm,
            vocab_size=cfg.model.vocab_size,
            micro_batch=cfg.batch.micro_batch_size,
            clip_grad=cfg.optim.clip_grad,
            dp_size=self.info.dp_size,
            seed=cfg.data.seed,
            max_tokens=self.run.generate.sampling_config.max_tokens,
            packing=pass_packing(self.run.rl.micro_batching, "update"),
            **extra,
        )
        if resume_dir is not None:
            self.resume_from(resume_dir)
        if self.with_rollout:
            self._build_hybrid_engine()
        return {**info, **self._parameter_counts()}

    def _snapshot_reference(self, resumed: bool) -> None:
        """The reference's weights, kept beside the actor's (rl_config.reference_in_actor).
        They are what a reference worker would load (the integrated reference loads
        actor_config.load): on a fresh start the weights just loaded; when resuming, loaded
        here before the checkpoint replaces them."""
        import logging

        from mindrl.models.weight_snapshot import WeightSnapshot

        assert self.run.ref is not None
        own = self.run.ref.ckpt.load != self.cfg.ckpt.load  # DPO's ref_model
        if resumed or own:
            self.load_weights(self.run.ref.ckpt.load)
        self.ref_snapshot = WeightSnapshot(self.model_chunks)
        if own and not resumed:  # the policy starts from its own load
            self.load_weights(self.cfg.ckpt.load)
        logging.getLogger(__name__).info(
            "reference: a %.2f GiB snapshot of the weights in this process",
            self.ref_snapshot.nbytes / (1 << 30),
        )

    def _parameter_counts(self) -> dict[str, int]:
        """Trainable and all parameters of the whole model (summed over TP / PP)."""
        from mindrl.models.lora import model_parameter_counts

        trainable, total = model_parameter_counts(self.model_chunks)
        return {"trainable_params": trainable, "total_params": total}

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

    @profiled("actor_generate")
    def generate(
        self,
        prompts: list[list[int]],
        sampling: RolloutSampling,
        tools_kwargs: list[ToolsKwargs] | None = None,
    ) -> list[RolloutRow] | None:
        return self._hybrid().generate(prompts, sampling, tools_kwargs)

    def sync_weights(self) -> dict[str, float]:
        return self._hybrid().sync_weights(self.model_chunks)

    def rollout_mode(self) -> None:
        self._hybrid().rollout_mode()

    def train_mode(self) -> None:
        if self.hybrid is not None:
            self.hybrid.train_mode()

    @profiled("actor_generate")
    def generate_in_rollout_mode(
        self,
        prompts: list[list[int]],
        sampling: RolloutSampling,
        tools_kwargs: list[ToolsKwargs] | None = None,
    ) -> list[RolloutRow] | None:
        """`rollout_mode`, `generate`, `train_mode` in one call (the driver's step makes one
        round trip instead of three)."""
        self.rollout_mode()
        rows = self.generate(prompts, sampling, tools_kwargs)
        self.train_mode()
        return rows

    def pack_weights(self) -> list[Any]:
        """For a separate rollout group: the weights as object-store buckets (rank 0 sends)."""
        from mindrl.workers.weight_transfer import pack_weight_buckets

        bucket = self.run.generate.weight_sync_bucket_mb << 20
        return pack_weight_buckets(
            self.model_chunks, self.cfg.model, bucket, sender=self.info.rank == 0
        )

    def compute_ref_log_prob(self, batch: SampleBatch) -> Any:
        """The reference held here: the weight snapshot swapped in (reference_in_actor), or
        the shared backbone (share_backbone: this model with its LoRA adapters off)."""
        if self.ref_snapshot is not None:
            with self.ref_snapshot.swapped_in():
                return self.compute_log_prob(batch, "ref")
        from mindrl.models.lora import adapters_disabled

        with adapters_disabled(self.model_chunks):
            return self.compute_log_prob(batch, "ref")

    # -- training ---------------------------------------------------------------------------
    @profiled("actor_update")
    def update(self, batch: SampleBatch, step: int) -> dict[str, float]:
        self.train_mode()
        updater = self._updater()
        first, *later = updater.mini_batches(batch.size, step, 0)
        in_update = (
            self.run.rl.algorithm.recompute_old_log_prob == "in_update"
            and "old_log_probs" not in batch.tensors
            and bool(later)
        )
        extra: dict[str, float] = {}
        if in_update:
            batch, extra = self._old_log_probs_after_first(batch, first)
        with self.releasing_memory():
            return {**updater.update(batch, step, first_on_policy=in_update), **extra}

    def _old_log_probs_after_first(
        self, batch: SampleBatch, first: Any
    ) -> tuple[SampleBatch, dict[str, float]]:
        """`recompute_old_log_prob: in_update`: the old policy's log-probs of the rows the
        first mini-batch (`first`) does not hold (it takes its own: no step has been taken
        yet)."""
        import time

        import torch

        start = time.perf_counter()
        later = torch.ones(batch.size, dtype=torch.bool)
        later[first] = False
        rows = later.nonzero().flatten()
        old = torch.zeros_like(batch.response_mask)
        old[rows] = self.compute_log_prob(batch.select(rows), "actor")
        seconds = time.perf_counter() - start
        return batch.with_tensors(old_log_probs=old), {"timing/update_old_log_prob": seconds}

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

    def export_peft(self, out_dir: str) -> str | None:
        """The LoRA adapters as a PEFT adapter folder over the base this actor loaded."""
        from mindrl.checkpoint.peft_export import export_peft_adapter

        path = export_peft_adapter(
            self.model_chunks,
            out_dir,
            arch=self.cfg.model,
            lora=self.cfg.lora,
            base_model=self.base_dir,
        )
        return str(path) if path is not None else None

    def shutdown(self) -> None:
        if self.hybrid is not None:
            self.hybrid.close()
            self.hybrid = None
        super().shutdown()

    def _hybrid(self) -> HybridEngine:
        if self.hybrid is None:
            raise RuntimeError(
                "this actor holds no rollout engine (rl_config.rollout_resource is set)"
            )
        return self.hybrid
