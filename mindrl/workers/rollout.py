"""A rollout engine in its own worker group (`rl_config.rollout_resource`): it generates on
its own devices, and receives the actor's weights, in HF naming and in buckets, through Ray's
object store after every update."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mindrl.cluster.worker import Worker
from mindrl.config.run import RunConfig
from mindrl.workers.profiling import ProfiledWorker, profiled

if TYPE_CHECKING:
    from mindrl.data.tool_kwargs import ToolsKwargs
    from mindrl.rollout.agent_rollout import AgentRollout
    from mindrl.rollout.base import RolloutEngine, RolloutRow, RolloutSampling


class RolloutWorker(ProfiledWorker, Worker):
    """One inference engine; the group's ranks split the prompts like DP ranks."""

    def __init__(self, run: RunConfig):
        super().__init__()
        self.run = run
        self.engine: RolloutEngine | None = None
        self.agent: AgentRollout | None = None  # multi-turn tool rollout (multi_turn_enable)

    def init_engine(self, model_dir: str) -> int:
        from mindrl.accelerator import get_accelerator
        from mindrl.planning.engine import cpu_kv_cache
        from mindrl.rollout import build_rollout_engine

        self.engine = build_rollout_engine(
            model_dir,
            self.run.generate,
            accelerator=get_accelerator(self.run.runtime.accelerator).name,
            seed=self.run.actor.data.seed,
            kv_cache_bytes=cpu_kv_cache(self.run).bytes,
        )
        if self.run.rl.rollout_mode.multi_turn_enable:
            from mindrl.rollout.agent_rollout import AgentRollout

            tokenizer = self.run.actor.data.tokenizer_name_or_path or model_dir
            self.agent = AgentRollout.from_config(self.run.rl.rollout_mode, tokenizer)
        return self.rank

    def rollout_rank(self) -> int:
        return self.rank

    @profiled("actor_generate")
    def generate(
        self,
        prompts: list[list[int]],
        sampling: RolloutSampling,
        tools_kwargs: list[ToolsKwargs] | None = None,
    ) -> list[RolloutRow]:
        """``sampling.n`` rows per prompt; ``tools_kwargs`` (one per prompt) reach the tools of
        a multi-turn rollout (a single-turn one has no tools to give them to)."""
        from mindrl.rollout.base import rollout_rows

        if self.agent is not None:
            return self.agent.generate(self._engine(), prompts, sampling, tools_kwargs)
        return rollout_rows(self._engine().generate(prompts, sampling))

    def load_weight_buckets(self, bucket_refs: list[Any]) -> int:
        """The actor's packed weight buckets into the engine; bytes moved."""
        from mindrl.workers.weight_transfer import load_weight_buckets

        return load_weight_buckets(self._engine(), bucket_refs)

    def rollout_mode(self) -> None:
        self._engine().wake_up()

    def train_mode(self) -> None:
        self._engine().sleep()

    def _engine(self) -> RolloutEngine:
        if self.engine is None:
            raise RuntimeError("init_engine has not run")
        return self.engine

    def shutdown(self) -> None:
        if self.agent is not None:
            self.agent.close()
            self.agent = None
        if self.engine is not None:
            self.engine.close()
            self.engine = None
