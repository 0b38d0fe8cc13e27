"""The hybrid engine: a rollout engine on every training rank of the actor, kept in sync
with the trained weights, and the mode switches that share the rank's memory between
training and generation.

Ray-free: the actor's Ray shell builds one and forwards calls. vLLM joins megatron's
process group (its external launcher) when the role spans several ranks, so every rank
generates its slice of the prompts and all-gathered weights reach every engine.

Memory follows `memory_phases` (vLLM's RL order, sleep level 2):

    sync_weights:  engine wake_up(["weights"]) -> stream the weights from the
                   device-resident training parameters (collective over TP/PP)
    rollout_mode:  offload the training state (generate_config.offload_train_*) ->
                   engine wake_up(["kv_cache"])            [from TRAIN: the sync first]
    generate
    train_mode:    engine sleep(level=2) -> restore the training state

`sync_weights` leaves the training state on the device (checkpointing and validation may
run between it and the next rollout); `rollout_mode` completes the switch, and `generate`
right after `sync_weights` completes it too. After each switch the ledger (resident bytes
per part, measured from the tensors) is kept as `memory/<phase>/...` metrics, which
`sync_weights` returns with its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mindrl.checkpoint.hf_io import is_hf_folder
from mindrl.config.model_arch import ModelArchConfig
from mindrl.config.run import RunConfig
from mindrl.rollout.base import RolloutEngine, RolloutRow, RolloutSampling, rollout_rows
from mindrl.workers.memory_phases import MemoryPhases, Phase, memory_metrics
from mindrl.workers.offload import TrainingStateOffload
from mindrl.workers.weight_transfer import stream_weights

if TYPE_CHECKING:
    from mindrl.data.tool_kwargs import ToolsKwargs
    from mindrl.rollout.agent_rollout import AgentRollout

logger = logging.getLogger(__name__)


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
    """One rank's rollout engine and the memory phase of that rank (`memory_phases`)."""

    def __init__(self, run: RunConfig, rank: int, arch: ModelArchConfig) -> None:
        self.run = run
        self.arch = arch
        self.slice = RolloutSlice(rank, run.generate.infer_tensor_parallel_size)
        self.engine: RolloutEngine | None = None
        self.agent: AgentRollout | None = None  # multi-turn tool rollout (multi_turn_enable)
        self.offload: TrainingStateOffload | None = None
        self.phases = MemoryPhases()
        self.events: list[str] = []  # what was done, in order (bounded): the choreography
        self._snapshots: dict[str, dict[str, float]] = {}

    @property
    def mode(self) -> str:
        """ "rollout" once the engine is fully awake, else "train"."""
        return "rollout" if self.phases.phase is Phase.ROLLOUT else "train"

    def build(self, model_dir: str, seed: int, offload: TrainingStateOffload) -> None:
        """The engine, started from `model_dir` and put to sleep at once (level 2): the
        rank starts in TRAIN and `sync_weights` brings the trained weights in."""
        import torch.distributed as dist

        from mindrl.accelerator import get_accelerator
        from mindrl.planning.engine import cpu_kv_cache
        from mindrl.rollout import build_rollout_engine

        self.offload = offload
        self.engine = build_rollout_engine(
            model_dir,
            self.run.generate,
            accelerator=get_accelerator(self.run.runtime.accelerator).name,
            seed=seed,
            # colocated with megatron's world: vLLM joins it instead of starting its own
            external_launcher=dist.get_world_size() > 1,
            # built after the model, master weights and grad buffers: vLLM demands that its
            # share of the device be free, so it takes what training left
            beside_training=True,
            kv_cache_bytes=cpu_kv_cache(self.run).bytes,
        )
        if self.run.rl.rollout_mode.multi_turn_enable:
            from mindrl.rollout.agent_rollout import AgentRollout

            tokenizer = self.run.actor.data.tokenizer_name_or_path or model_dir
            self.agent = AgentRollout.from_config(self.run.rl.rollout_mode, tokenizer)
        self.engine.sleep(level=2)
        self._event("engine.sleep(level=2)")
        self.phases = MemoryPhases(Phase.TRAIN)
        self._snapshot("train")

    # -- the calls the trainer makes --------------------------------------------------------
    def sync_weights(self, model_chunks: list[Any]) -> dict[str, float]:
        """Stream the trained weights, in HF naming, into this rank's engine (collective):
        engine wake_up(["weights"]) -> stream from the device-resident parameters. Ends in
        WEIGHTS_SYNCED (training state still on the device); from ROLLOUT it goes through
        train_mode first, since the parameters may be offloaded. Returns the stream's
        metrics and the memory ledger's last snapshots."""
        if self.phases.phase is Phase.ROLLOUT:
            self.train_mode()
        if self.phases.phase is Phase.TRAIN:
            self._wake_weights()
        metrics = self._load_weights(model_chunks)
        return {**metrics, **self.memory_metrics()}

    def rollout_mode(self) -> None:
        """Offload the training state (as generate_config.offload_train_* ask) and wake the
        engine's KV cache; from TRAIN the weights are woken and streamed first. Idempotent."""
        if self.phases.phase is Phase.ROLLOUT:
            return
        if self.phases.phase is Phase.TRAIN:
            self._wake_weights()
        if self.phases.phase is Phase.WEIGHTS_AWAKE:
            self._load_weights(self._model_chunks())
        self._enter_rollout()

    def generate(
        self,
        prompts: list[list[int]],
        sampling: RolloutSampling,
        tools_kwargs: list[ToolsKwargs] | None = None,
    ) -> list[RolloutRow] | None:
        """Rows for this rank's slice (None on inference-TP ranks other than the first,
        which take part in the same SPMD generation). Right after `sync_weights` the switch
        to rollout is completed first; with the engine asleep (TRAIN) it raises
        `IllegalMemoryTransition`."""
        if self.phases.phase is Phase.WEIGHTS_SYNCED:
            self._enter_rollout()
        self.phases.check("generate")
        if self.agent is not None:
            rows = self.agent.generate(self._engine(), prompts, sampling, tools_kwargs)
        else:
            rows = rollout_rows(self._engine().generate(prompts, sampling))
        self.phases.step("generate")
        self._event("engine.generate")
        return rows if self.slice.returns_rows else None

    def train_mode(self) -> None:
        """Engine sleep(level=2) (weights and KV cache released), then the training state
        back on the device. Idempotent."""
        if self.phases.phase is Phase.TRAIN:
            return
        self.phases.check("enter_train")
        self._engine().sleep(level=2)
        self._event("engine.sleep(level=2)")
        moved = self.offload.to_device() if self.offload is not None else {}
        if moved:
            self._event("offload.to_device")
        self.phases.step("enter_train")
        self._snapshot("train", {"timing/train_state_onload": moved.get("seconds", 0.0)})

    def close(self) -> None:
        if self.phases.phase is not Phase.CLOSED:
            self.phases.step("close")
        if self.agent is not None:
            self.agent.close()
            self.agent = None
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    # -- the memory ledger ------------------------------------------------------------------
    def ledger(self) -> dict[str, int]:
        """Bytes now: the training state resident on the device per part, what sits in
        host buffers / left the device, and the engine's resident weights (-1: unknown)."""
        out: dict[str, int] = {}
        if self.offload is not None:
            out.update(self.offload.resident_bytes())
            out["offloaded"] = self.offload.offloaded_bytes()
            out["released"] = sum(self.offload.released_bytes().values())
        engine_bytes = self.engine.resident_weight_bytes() if self.engine is not None else None
        out["engine_weights"] = -1 if engine_bytes is None else engine_bytes
        return out

    def memory_metrics(self) -> dict[str, float]:
        """The ledger as taken after the last switch into each phase (`memory/<phase>/...`
        in GiB, and the offload / onload times)."""
        out: dict[str, float] = {}
        for snapshot in self._snapshots.values():
            out.update(snapshot)
        return out

    # -- transitions ------------------------------------------------------------------------
    def _wake_weights(self) -> None:
        self.phases.check("wake_weights")
        self._engine().wake_up(["weights"])
        self._event("engine.wake_up(weights)")
        self.phases.step("wake_weights")

    def _load_weights(self, model_chunks: list[Any]) -> dict[str, float]:
        self.phases.check("load_weights")
        bucket = self.run.generate.weight_sync_bucket_mb << 20
        metrics = stream_weights(model_chunks, self.arch, self._engine(), bucket)
        self._event("engine.update_weights")
        self.phases.step("load_weights")
        self._snapshot("sync")
        return metrics

    def _enter_rollout(self) -> None:
        self.phases.check("enter_rollout")
        moved = self.offload.to_host() if self.offload is not None else {}
        if moved:
            self._event("offload.to_host")
        self._engine().wake_up(["kv_cache"])
        self._event("engine.wake_up(kv_cache)")
        self.phases.step("enter_rollout")
        self._snapshot("rollout", {"timing/train_state_offload": moved.get("seconds", 0.0)})

    def _snapshot(self, phase: str, extra: dict[str, float] | None = None) -> None:
        ledger = self.ledger()
        resident: dict[str, int] = {
            p: ledger[p] for p in ("params", "grads", "optimizer") if p in ledger
        }
        engine_bytes = ledger["engine_weights"]
        snapshot = memory_metrics(
            phase,
            resident,
            ledger.get("offloaded", 0),
            ledger.get("released", 0),
            None if engine_bytes < 0 else engine_bytes,
        )
        snapshot.update(extra or {})
        self._snapshots[phase] = snapshot
        logger.debug("memory after entering %s: %s", phase, ledger)

    def _event(self, what: str) -> None:
        self.events.append(what)
        del self.events[:-256]

    def _model_chunks(self) -> list[Any]:
        if self.offload is None:
            raise RuntimeError("the hybrid engine is not built: no training model to stream")
        return self.offload.model_chunks

    def _engine(self) -> RolloutEngine:
        if self.engine is None:
            raise RuntimeError("the hybrid engine is not built (or already closed)")
        return self.engine
