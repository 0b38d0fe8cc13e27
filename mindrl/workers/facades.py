"""Typed role facades over worker groups: what the driver calls, one method per job.

`actor.update(batch, step)` instead of `group.dispatch_by_dp("update", ...)[0]`: each
facade knows how its role's calls are spread (same call on every rank, one chunk per
data-parallel rank, per-rank prompt slices) and which rank's answer counts. Worker methods
are passed as function objects, so a renamed method fails at import, not mid-run.

The generating side is a protocol (`RolloutGenerator`) met by the hybrid actor and by a
separate rollout group alike, so the loop is the same for every placement; tests drive the
loop with small in-process fakes of these facades.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from mindrl.workers.actor import ActorWorker
from mindrl.workers.critic import CriticWorker
from mindrl.workers.megatron_worker import MegatronModelWorker
from mindrl.workers.reward import RewardWorker
from mindrl.workers.rollout import RolloutWorker

if TYPE_CHECKING:
    import torch

    from mindrl.cluster.worker_group import WorkerGroup
    from mindrl.data.batch import SampleBatch
    from mindrl.data.tool_kwargs import ToolsKwargs
    from mindrl.rollout.base import RolloutRow, RolloutSampling

    # per rank, one tools_kwargs per prompt of its slice (None: no prompt has any)
    ToolsKwargsPerRank = list[list[ToolsKwargs]] | None


class RolloutGenerator(Protocol):
    """Whoever generates: the hybrid actor or a separate rollout group."""

    def rollout_ranks(self) -> list[int]:
        """The prompt slice each rank generates (ranks of one inference-TP group share one)."""
        ...

    def generate(
        self,
        prompts_per_rank: list[list[list[int]]],
        sampling: RolloutSampling,
        tools_kwargs_per_rank: ToolsKwargsPerRank = None,
    ) -> list[list[RolloutRow] | None]: ...

    def rollout_mode(self) -> None: ...

    def train_mode(self) -> None: ...

    def generate_in_rollout_mode(
        self,
        prompts_per_rank: list[list[list[int]]],
        sampling: RolloutSampling,
        tools_kwargs_per_rank: ToolsKwargsPerRank = None,
    ) -> list[list[RolloutRow] | None]:
        """Rollout mode, `generate`, train mode: one batch between two mode switches. A
        generator whose ranks can switch on their own does the three in one call per rank."""
        self.rollout_mode()
        rows = self.generate(prompts_per_rank, sampling, tools_kwargs_per_rank)
        self.train_mode()
        return rows


class PendingLogProbs:
    """Per-token results (log-probs, a critic's values) being computed on a group's workers,
    one chunk per DP rank; `result()` waits for them. Lets the
    driver start the reference pass and run the old-policy pass while it goes (the two sit
    on different workers unless the reference lives in the actor)."""

    def __init__(self, group: WorkerGroup, refs: list[Any]) -> None:
        self.group = group
        self.refs = refs

    def result(self) -> torch.Tensor:
        import torch

        return torch.cat(self.group.collect_by_dp(self.group.gather(self.refs)), dim=0)


def _dispatch_generate(
    group: WorkerGroup,
    method: Any,
    prompts_per_rank: list[list[list[int]]],
    sampling: RolloutSampling,
    tools_kwargs_per_rank: ToolsKwargsPerRank,
) -> list[Any]:
    """Each rank's `method(prompts, sampling[, tools_kwargs])`, refs in rank order."""
    if tools_kwargs_per_rank is None:
        return group.dispatch_async(method, prompts_per_rank, sampling)
    return [
        group.execute_rank_async(r, method, prompts_per_rank[r], sampling, kwargs)
        for r, kwargs in enumerate(tools_kwargs_per_rank)
    ]


def _start_log_probs(
    group: WorkerGroup, batch: SampleBatch, method: Any = MegatronModelWorker.compute_log_prob
) -> PendingLogProbs:
    return PendingLogProbs(group, group.dispatch_by_dp_async(method, batch.chunks(group.dp_size)))


def _log_probs(
    group: WorkerGroup, batch: SampleBatch, method: Any = MegatronModelWorker.compute_log_prob
) -> torch.Tensor:
    return _start_log_probs(group, batch, method).result()


class ActorGroup(RolloutGenerator):
    """The trained policy (and, in the hybrid layout, its rollout engines)."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group
        self._slices: list[int] | None = None

    @property
    def dp_size(self) -> int:
        return self.group.dp_size

    def init_model(self, resume_dir: str | None) -> dict[str, int]:
        """Build and load every rank's model; rank 0's summary (ranks, parameter counts)."""
        return self.group.execute_all(ActorWorker.init_model, resume_dir)[0]

    def engine_model_dir(self) -> str:
        return self.group.execute_rank(0, ActorWorker.engine_model_dir)

    def log_probs(self, batch: SampleBatch) -> torch.Tensor:
        """Old-policy log-probs of the batch's tokens, [B, S-1]."""
        return _log_probs(self.group, batch)

    def update(self, batch: SampleBatch, step: int) -> dict[str, float]:
        """One RL step's optimizer steps; the metrics are global (every rank agrees)."""
        chunks = batch.chunks(self.dp_size)
        return self.group.dispatch_by_dp(ActorWorker.update, chunks, step)[0]

    def sync_weights(self) -> dict[str, float]:
        """Trained weights into the engines on the actor's own ranks (hybrid layout)."""
        return self.group.execute_all(ActorWorker.sync_weights)[0]

    def pack_weights(self) -> list[Any]:
        """Trained weights as object-store buckets for a separate rollout group."""
        return next((refs for refs in self.group.execute_all(ActorWorker.pack_weights) if refs), [])

    def save_checkpoint(self, iter_dir: str) -> None:
        self.group.execute_all(ActorWorker.save_checkpoint, iter_dir)

    def export_hf(self, out_dir: str, hf_assets_dir: str | None) -> None:
        self.group.execute_all(ActorWorker.export_hf, out_dir, hf_assets_dir)

    def export_peft(self, out_dir: str) -> None:
        self.group.execute_all(ActorWorker.export_peft, out_dir)

    # -- RolloutGenerator (hybrid layout) ---------------------------------------------------
    def rollout_ranks(self) -> list[int]:
        if self._slices is None:
            self._slices = self.group.execute_all(ActorWorker.rollout_rank)
        return list(self._slices)

    def generate(
        self,
        prompts_per_rank: list[list[list[int]]],
        sampling: RolloutSampling,
        tools_kwargs_per_rank: ToolsKwargsPerRank = None,
    ) -> list[list[RolloutRow] | None]:
        return self.group.gather(
            _dispatch_generate(
                self.group, ActorWorker.generate, prompts_per_rank, sampling, tools_kwargs_per_rank
            )
        )

    def rollout_mode(self) -> None:
        self.group.execute_all(ActorWorker.rollout_mode)

    def train_mode(self) -> None:
        self.group.execute_all(ActorWorker.train_mode)

    def generate_in_rollout_mode(
        self,
        prompts_per_rank: list[list[list[int]]],
        sampling: RolloutSampling,
        tools_kwargs_per_rank: ToolsKwargsPerRank = None,
    ) -> list[list[RolloutRow] | None]:
        """Each rank switches, generates and switches back in one call (every rank runs the
        same sequence, so the collectives of the switches meet as before): two round trips
        to all ranks fewer a batch."""
        method = ActorWorker.generate_in_rollout_mode
        return self.group.gather(
            _dispatch_generate(
                self.group, method, prompts_per_rank, sampling, tools_kwargs_per_rank
            )
        )


class ReferenceGroup:
    """The frozen reference policy."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def init_model(self) -> None:
        self.group.execute_all(MegatronModelWorker.init_model)

    def log_probs(self, batch: SampleBatch) -> torch.Tensor:
        return self.start_log_probs(batch).result()

    def start_log_probs(self, batch: SampleBatch) -> PendingLogProbs:
        """Start the pass on the reference's own workers and return at once."""
        return _start_log_probs(self.group, batch)


class TeacherGroup(ReferenceGroup):
    """On-policy distillation's frozen teacher: the same calls as the reference (a
    forward-only model on its own workers), another model."""


class ReferenceInActor:
    """The reference in the actor's processes (no model of its own): the actor's LoRA base
    (rl_config.share_backbone, adapters off) or a snapshot of its weights swapped in for the
    pass (rl_config.reference_in_actor)."""

    def __init__(self, actor: ActorGroup) -> None:
        self.actor = actor

    def init_model(self) -> None:
        """Nothing to build: the actor's model (and its snapshot) is the reference."""

    def log_probs(self, batch: SampleBatch) -> torch.Tensor:
        return self.start_log_probs(batch).result()

    def start_log_probs(self, batch: SampleBatch) -> PendingLogProbs:
        """Queued on the actor's workers: it runs before the actor's next call, not beside."""
        return _start_log_probs(self.actor.group, batch, ActorWorker.compute_ref_log_prob)


class RolloutGroup(RolloutGenerator):
    """Rollout engines on their own devices (`rl_config.rollout_resource`)."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def start(self, actor: ActorGroup) -> None:
        """An engine on every rank, built from the actor's model (its HF export)."""
        self.group.execute_all(RolloutWorker.init_engine, actor.engine_model_dir())

    def load_weights(self, bucket_refs: list[Any]) -> int:
        """The actor's packed buckets into every engine; bytes moved per engine."""
        return self.group.execute_all(RolloutWorker.load_weight_buckets, bucket_refs)[0]

    def rollout_ranks(self) -> list[int]:
        return list(range(self.group.world_size))

    def generate(
        self,
        prompts_per_rank: list[list[list[int]]],
        sampling: RolloutSampling,
        tools_kwargs_per_rank: ToolsKwargsPerRank = None,
    ) -> list[list[RolloutRow] | None]:
        return self.group.gather(
            self.generate_async(prompts_per_rank, sampling, tools_kwargs_per_rank)
        )

    def generate_async(
        self,
        prompts_per_rank: list[list[list[int]]],
        sampling: RolloutSampling,
        tools_kwargs_per_rank: ToolsKwargsPerRank = None,
    ) -> list[Any]:
        """Start generating and return at once (the rollout pipeline; a worker runs the
        calls it is given one after another); `collect` waits for the rows."""
        return _dispatch_generate(
            self.group, RolloutWorker.generate, prompts_per_rank, sampling, tools_kwargs_per_rank
        )

    def collect(self, refs: list[Any]) -> list[list[RolloutRow] | None]:
        return self.group.gather(refs)

    def rollout_mode(self) -> None:
        self.group.execute_all(RolloutWorker.rollout_mode)

    def train_mode(self) -> None:
        self.group.execute_all(RolloutWorker.train_mode)

    def close(self) -> None:
        """Nothing of its own: the worker group is shut down with the others."""


class RewardModelGroup:
    """A reward model scoring whole sequences (alone with `rule_reward: false`, else added to
    the rule rewards with `reward_model_weight`)."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def init_model(self) -> None:
        self.group.execute_all(RewardWorker.init_model)

    def scores(self, batch: SampleBatch) -> torch.Tensor:
        import torch

        chunks = batch.chunks(self.group.world_size)
        return torch.cat(self.group.dispatch(RewardWorker.compute_rm_score, chunks))


class CriticGroup:
    """PPO's value model (critic_config + critic_resource)."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def init_model(self, resume_dir: str | None) -> None:
        self.group.execute_all(CriticWorker.init_model, resume_dir)

    def values(self, batch: SampleBatch) -> torch.Tensor:
        """[B, S-1] values of the states before each response token."""
        return _start_log_probs(self.group, batch, CriticWorker.compute_values).result()

    def update(self, batch: SampleBatch, step: int) -> dict[str, float]:
        chunks = batch.chunks(self.group.dp_size)
        return self.group.dispatch_by_dp(CriticWorker.update, chunks, step)[0]

    def save_checkpoint(self, iter_dir: str) -> None:
        self.group.execute_all(CriticWorker.save_checkpoint, iter_dir)
