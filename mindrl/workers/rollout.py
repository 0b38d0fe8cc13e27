"""A rollout engine in its own worker group (`use_integrated_worker: false`): it generates on
its own devices, and receives the actor's weights, in HF naming and in buckets, through Ray's
object store after every update."""

from __future__ import annotations

from typing import Any

from mindrl.cluster.worker import Worker
from mindrl.config.run import RunConfig


class RolloutWorker(Worker):
    """One inference engine; the group's ranks split the prompts like DP ranks."""

    def __init__(self, run: RunConfig):
        super().__init__()
        self.run = run
        self.engine: Any = None

    def init_engine(self, model_dir: str) -> int:
        import os

        import torch

        from mindrl.accelerator import get_accelerator
        from mindrl.rollout import build_rollout_engine

        threads = int(os.environ.get("MINDRL_NUM_THREADS", "0"))
        if threads > 0:
            torch.set_num_threads(threads)  # before vLLM replaces it with a no-op
        self.engine = build_rollout_engine(
            model_dir,
            self.run.generate,
            accelerator=get_accelerator(self.run.runtime.accelerator).name,
            seed=self.run.actor.data.seed,
        )
        return self.rank

    def rollout_rank(self) -> int:
        return self.rank

    def generate(self, prompts: list[list[int]], sampling: Any) -> list[dict[str, Any]]:
        from mindrl.workers.actor import results_to_rows

        return results_to_rows(self.engine.generate(prompts, sampling))

    def load_weight_buckets(self, bucket_refs: list[Any]) -> int:
        """Fetch the actor's weight buckets one at a time (bounded memory) into the engine."""
        import ray
        import torch

        moved = 0
        for ref in bucket_refs:
            bucket = [(name, torch.from_numpy(array)) for name, array in ray.get(ref)]
            self.engine.update_weights(bucket)
            moved += sum(t.numel() * t.element_size() for _, t in bucket)
        return moved

    def rollout_mode(self) -> None:
        self.engine.wake_up()

    def train_mode(self) -> None:
        self.engine.sleep()

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
