"""What the actor and reference roles share: one megatron-core model on this rank's TP/PP
position, loaded from an HF folder (converted online) or a megatron checkpoint, and per-token
log-probs through megatron's pipeline schedule.

A worker is a plain class; `mindrl.cluster.worker_group` runs one per rank as a Ray actor and
hands it RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the environment.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mindrl.cluster.worker import Worker
from mindrl.config.role import RoleConfig
from mindrl.config.run import RunConfig
from mindrl.workers.profiling import ProfiledWorker

if TYPE_CHECKING:
    import torch

    from mindrl.data.batch import SampleBatch

logger = logging.getLogger(__name__)


class MegatronModelWorker(ProfiledWorker, Worker):
    """One rank of a role's megatron-core model (forward only unless a subclass trains it)."""

    def __init__(self, run: RunConfig, role: str):
        super().__init__()
        from mindrl.accelerator.mindspeed_args import prepare_megatron

        # first: MindSpeed's adaptor before any megatron import of this process (on NPU)
        prepare_megatron(os.environ.get("MINDRL_ACCELERATOR", run.runtime.accelerator))
        self.run = run
        roles = {
            "actor": run.actor,
            "ref": run.ref,
            "reward": run.reward,
            "critic": run.critic,
            "teacher": run.teacher,
        }
        self.cfg: RoleConfig = roles[role]  # type: ignore[assignment]
        self.role = role
        self.model_chunks: list[Any] = []
        self.info: Any = None
        self.base_dir: str | None = None  # where the weights (a LoRA model's base) came from

    # -- set-up -----------------------------------------------------------------------------
    def init_model(self, resume_dir: str | None = None) -> dict[str, int]:
        """Join the process group, build this rank's model chunk and load its weights (from
        `resume_dir`, a trainer checkpoint, when resuming)."""
        from mindrl.models.parallel import init_parallel
        from mindrl.models.scale import transformer_overrides, virtual_pipeline_size

        cfg = self.cfg
        vpp = virtual_pipeline_size(cfg)
        self.info = init_parallel(
            cfg.tp,
            cfg.pp,
            expert_parallel_size=cfg.moe.expert_model_parallel_size,
            context_parallel_size=cfg.cp,
            virtual_pipeline_size=vpp,
            local_rank=self._visible_device_index(),
            accelerator=self.run.runtime.accelerator,
            seed=cfg.data.seed,
            timeout_s=self.run.runtime.worker_timeout_s,
        )
        overrides = transformer_overrides(cfg)
        self.model_chunks = [
            self.wrap_model(self.build_chunk(stage, overrides), index)
            for index, stage in enumerate([None] if vpp is None else range(vpp))
        ]
        if resume_dir is None:
            self.load_weights()
        return {"rank": self.info.rank, "dp_rank": self.info.dp_rank, "dp_size": self.info.dp_size}

    def model_arch(self) -> Any:
        """The architecture this role's chunks are built with (checkpoints record it)."""
        return self.cfg.model

    @property
    def has_adapters(self) -> bool:
        """LoRA adapters train on the actor only (the reference is the frozen base)."""
        return self.role == "actor" and self.cfg.lora.enabled

    def build_chunk(self, vp_stage: int | None, overrides: dict[str, Any]) -> Any:
        """One model chunk at this rank's TP/PP position: the policy's GPT (the critic
        swaps the output layer for a value head), with LoRA adapters and the fused RMSNorm
        (`use_fused_rmsnorm`) when configured."""
        from mindrl.models.gpt import build_gpt_model

        lora = self.cfg.lora if self.has_adapters else None
        model = build_gpt_model(
            self.model_arch(),
            params_dtype=self.cfg.precision.params_dtype,
            vp_stage=vp_stage,
            config_overrides=overrides,
            lora=lora,
            context_parallel_algo=self.cfg.parallel.context_parallel_algo,
            ulysses_degree_in_cp=self.cfg.parallel.ulysses_degree_in_cp,
        )
        if lora is not None:
            from mindrl.models.lora import init_adapters

            init_adapters(model, self.cfg.data.seed)
        if self.cfg.kernels.use_fused_rmsnorm:
            from mindrl.models.host_fusions import mindrl_fuses_here, use_fused_rms_norm

            if mindrl_fuses_here():
                use_fused_rms_norm(model)
        return model

    def _visible_device_index(self) -> int | None:
        """Ray narrows CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES to this worker's
        device, which is then index 0 (LOCAL_RANK keeps its torchrun meaning)."""
        from mindrl.accelerator import get_accelerator

        env = get_accelerator(self.run.runtime.accelerator).visible_devices_env
        visible = os.environ.get(env, "") if env else ""
        return 0 if visible and "," not in visible else None

    def wrap_model(self, model: Any, chunk_index: int) -> Any:
        """Hook for subclasses (the actor wraps each chunk in megatron's DDP)."""
        model.eval()
        return model

    def load_weights(self, load: str | None = None) -> None:
        """Weights from `load` (default: the role's `load`), an HF folder or a megatron
        checkpoint; a LoRA actor takes only the base from it."""
        load = load or self.cfg.ckpt.load
        if load is None:
            logger.warning("%s: no load path, weights stay randomly initialised", self.role)
            return
        from mindrl.checkpoint.hf_io import is_hf_folder

        if is_hf_folder(load):
            from mindrl.checkpoint.online import load_hf_into_mcore

            load_hf_into_mcore(self.model_chunks, load, arch=self.cfg.model)
        else:
            from mindrl.checkpoint.mcore_io import ModelPart, load_mcore_checkpoint

            part = ModelPart.BASE if self.has_adapters else ModelPart.ALL
            load_mcore_checkpoint(self.model_chunks, load, part=part)
        self.base_dir = os.path.abspath(load)

    # -- queries ----------------------------------------------------------------------------
    def dp_rank(self) -> int:
        return int(self.info.dp_rank)

    def parallel_info(self) -> dict[str, int]:
        i = self.info
        return {"rank": i.rank, "tp_rank": i.tp_rank, "pp_rank": i.pp_rank, "dp_rank": i.dp_rank}

    # -- compute ----------------------------------------------------------------------------
    def compute_log_prob(self, batch: SampleBatch, pass_name: str | None = None) -> torch.Tensor:
        """Per-token log-probs [B, S-1] of `batch` under this model (no grad), fp32; 0 off the
        response columns (only those are computed). `pass_name` picks the packing settings
        ("ref" or "actor"; default: "actor" for the actor, else "ref": the frozen models'
        forward passes, the reference's and the distillation teacher's, share them)."""
        from mindrl.data.batch import micro_batch_size
        from mindrl.data.packing import pass_packing
        from mindrl.models.forward_pass import forward_only

        for chunk in self.model_chunks:
            chunk.eval()
        pass_name = pass_name or ("actor" if self.role == "actor" else "ref")
        ref = pass_name == "ref"
        stage = "reference_compute_log_prob" if ref else "actor_compute_log_prob"
        with self.stage_profiler().stage(stage), self.releasing_memory():
            return forward_only(
                self.model_chunks,
                batch.input_ids,
                vocab_size=self.cfg.model.vocab_size,
                attention_mask=batch.attention_mask,
                micro_batch_size=micro_batch_size(self.cfg.batch.micro_batch_size, batch.size),
                response_mask=batch.response_mask,
                prompt_lengths=batch.prompt_lengths,
                packing=pass_packing(self.run.rl.micro_batching, pass_name),
            ).cpu()

    @contextlib.contextmanager
    def releasing_memory(self) -> Iterator[None]:
        """Around a model pass: the memory it freed goes back when it ends
        (`runtime.release_memory_after_pass`), so a worker does not hold its pass's
        high-water mark while the other roles run theirs (a small free heap stays:
        `runtime.release_memory_min_mb`)."""
        try:
            yield
        finally:
            runtime = self.run.runtime
            if runtime.release_memory_after_pass:
                from mindrl.accelerator import get_accelerator

                get_accelerator(runtime.accelerator).release_cached_memory(
                    runtime.release_memory_min_mb << 20
                )

    def shutdown(self) -> None:
        from mindrl.models.parallel import destroy_parallel

        destroy_parallel()


class ReferenceWorker(MegatronModelWorker):
    """The frozen reference policy: log-probs only, never updated."""

    def __init__(self, run: RunConfig):
        super().__init__(run, "ref")


class TeacherWorker(MegatronModelWorker):
    """On-policy distillation's frozen teacher (teacher_config): its log-probs of the
    student's sampled tokens, never updated. Its model may be of another family or size
    than the actor's; the tokenizer is the same (checked before the run starts)."""

    def __init__(self, run: RunConfig):
        super().__init__(run, "teacher")
