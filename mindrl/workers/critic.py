"""The PPO critic's Ray shell: one rank of the value model (critic_config, its own TP/PP),
which scores each response token's state before the update and regresses on the GAE returns
after it.

Initial weights: `critic_config.load`, an HF folder (the policy's causal LM: body only, the
value head starts at zero; or a reward model: its `score` head too) or a megatron
checkpoint; on resume, the `critic/` folder of the trainer checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mindrl.config.run import RunConfig
from mindrl.workers.profiling import profiled
from mindrl.workers.trainable import TrainableWorker

if TYPE_CHECKING:
    import torch

    from mindrl.data.batch import SampleBatch

CRITIC_DIR = "critic"  # the critic's part of a trainer checkpoint folder


class CriticWorker(TrainableWorker):
    def __init__(self, run: RunConfig):
        super().__init__(run, "critic")

    def model_arch(self) -> Any:
        from mindrl.models.value_model import critic_arch

        return critic_arch(self.cfg.model)

    def build_chunk(self, vp_stage: int | None, overrides: dict[str, Any]) -> Any:
        from mindrl.models.value_model import attach_value_head

        return attach_value_head(super().build_chunk(vp_stage, overrides))

    def init_model(self, resume_dir: str | None = None) -> dict[str, int]:
        """`resume_dir`: the trainer checkpoint's folder (its critic/ part is read)."""
        from pathlib import Path

        from mindrl.workers.value_update import ValueUpdater

        info = super().init_model(resume_dir)
        cfg, run = self.cfg, self.run
        self.opt = self.build_optimizer()
        self.updater = ValueUpdater(
            self.model_chunks,
            self.opt,
            run.rl.algorithm,
            vocab_size=cfg.model.vocab_size,
            micro_batch=cfg.batch.micro_batch_size,
            clip_grad=cfg.optim.clip_grad,
            dp_size=self.info.dp_size,
            seed=cfg.data.seed,
            cliprange_value=run.rl.algorithm.cliprange_value,
        )
        if resume_dir is not None:
            self.resume_from(str(Path(resume_dir) / CRITIC_DIR))
        return info

    def load_weights(self, load: str | None = None) -> None:
        """As the base class; an HF folder's value head (`score`) comes with its body."""
        load = load or self.cfg.ckpt.load
        from mindrl.checkpoint.hf_io import is_hf_folder

        if load is None or not is_hf_folder(load):
            super().load_weights(load)
            return
        from mindrl.checkpoint.online import load_hf_into_mcore
        from mindrl.models.value_model import VALUE_HEAD_PREFIX, load_score_head

        load_hf_into_mcore(
            self.model_chunks, load, arch=self.model_arch(), unmapped=(VALUE_HEAD_PREFIX,)
        )
        load_score_head(self.model_chunks, load)

    @profiled("critic_compute_values")
    def compute_values(self, batch: SampleBatch) -> torch.Tensor:
        """[B, S-1] values of `batch` (no grad), 0 off the response tokens."""
        from mindrl.data.batch import micro_batch_size
        from mindrl.models.value_model import forward_values

        for chunk in self.model_chunks:
            chunk.eval()
        with self.releasing_memory():
            values = forward_values(
                self.model_chunks,
                batch.input_ids,
                batch.attention_mask,
                micro_batch_size=micro_batch_size(self.cfg.batch.micro_batch_size, batch.size),
            )
        return values * batch.response_mask.to(values.dtype)

    @profiled("critic_update")
    def update(self, batch: SampleBatch, step: int) -> dict[str, float]:
        with self.releasing_memory():
            return self._updater().update(batch, step)

    def save_checkpoint(self, iter_dir: str) -> None:
        from pathlib import Path

        super().save_checkpoint(str(Path(iter_dir) / CRITIC_DIR))
