"""Per-role training config: `{**model, **megatron_training, **<role>_config}` grouped by concern.

Key names are megatron's / MindSpeed-RL's, so users' YAML files carry over; each key lives in
exactly one group (checked when groups are built).
"""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.fields import spec
from mindrl.config.model_arch import ModelArchConfig


@dataclass(frozen=True)
class ParallelConfig:
    tensor_model_parallel_size: int = spec(1, ge=1)
    pipeline_model_parallel_size: int = spec(1, ge=1)
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = spec(
        False,
        help="megatron's ZeRO-1 optimizer: accepted, not used yet (the replicated optimizer runs; logged)",
    )
    distributed_backend: str = spec(
        "auto",
        choices=("auto", "nccl", "hccl", "gloo"),
        help="informational: the accelerator picks hccl / nccl / gloo",
    )


@dataclass(frozen=True)
class BatchConfig:
    micro_batch_size: int = spec(1, ge=1, help="sequences per forward/backward on one DP rank")
    global_batch_size: int = spec(1, ge=1, help="prompts per RL step (MindSpeed-RL semantics)")
    seq_length: int = spec(1024, ge=1)
    variable_seq_lengths: bool = True


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = spec(1e-6, ge=0.0)
    min_lr: float = spec(0.0, ge=0.0)
    lr_decay_style: str = spec("constant", choices=("constant", "linear", "cosine"))
    lr_warmup_fraction: float = spec(0.0, ge=0.0, le=1.0)
    lr_warmup_iters: int = spec(0, ge=0)
    weight_decay: float = spec(0.0, ge=0.0)
    clip_grad: float = spec(1.0, ge=0.0, help="global grad-norm clip; 0 disables")
    adam_beta1: float = spec(0.9, ge=0.0, lt=1.0)
    adam_beta2: float = spec(0.999, ge=0.0, lt=1.0)
    adam_eps: float = spec(1e-8, gt=0.0)
    initial_loss_scale: float = spec(4096.0, gt=0.0, help="fp16 only")
    train_iters: int = spec(1000, ge=1, help="RL steps (each step: one global batch)")


@dataclass(frozen=True)
class PrecisionConfig:
    bf16: bool = False
    fp16: bool = False

    @property
    def params_dtype(self) -> str:
        return "bf16" if self.bf16 else "fp16" if self.fp16 else "fp32"


@dataclass(frozen=True)
class CheckpointConfig:
    load: str | None = spec(
        None, help="megatron checkpoint folder, or an HF folder (converted online)"
    )
    save: str | None = None
    save_interval: int = spec(0, ge=0, help="steps between checkpoints; 0 = only at the end")
    finetune: bool = spec(False, help="load weights only and start at step 0")
    no_load_optim: bool = False
    no_load_rng: bool = False
    load_fallback: str = spec(
        "none",
        choices=("none", "previous"),
        help="a damaged latest checkpoint: stop naming the file (none), or resume from the "
        "newest older complete one (previous)",
    )
    no_save_optim: bool = False
    no_save_rng: bool = False
    no_shared_storage: bool = False
    keep_last_n_checkpoints: int = spec(0, ge=0, help="0 keeps all")


@dataclass(frozen=True)
class DataConfig:
    data_path: str | None = None
    tokenizer_name_or_path: str | None = None
    tokenizer_type: str = spec("PretrainedFromHF", choices=("PretrainedFromHF",))
    tokenizer_not_use_fast: bool = False
    split: str = "100,0,0"
    dataset_additional_keys: tuple[str, ...] = ()
    no_shuffle: bool = False
    full_shuffle_instruction_dataset: bool = False
    seed: int = spec(1234, ge=0)
    stage: str = spec("ray_grpo", choices=("ray_grpo",))


@dataclass(frozen=True)
class KernelConfig:
    """Fused-kernel switches users bring from MindSpeed/megatron YAMLs.

    Honoured where the backend has the kernel (TE / MindSpeed on GPU / NPU); on CPU they are
    accepted and have no effect.
    """

    use_fused_rmsnorm: bool = False
    use_flash_attn: bool = False
    no_masked_softmax_fusion: bool = False
    attention_softmax_in_fp32: bool = True
    no_gradient_accumulation_fusion: bool = True
    use_fused_swiglu: bool = False
    use_fused_rotary_pos_emb: bool = False


ROLE_GROUPS: dict[str, type] = {
    "model": ModelArchConfig,
    "parallel": ParallelConfig,
    "batch": BatchConfig,
    "optim": OptimizerConfig,
    "precision": PrecisionConfig,
    "ckpt": CheckpointConfig,
    "data": DataConfig,
    "kernels": KernelConfig,
}

ROLE_NAMES = {"actor": "actor_config", "ref": "ref_config", "reward": "reward_config"}


@dataclass(frozen=True)
class RoleConfig:
    """Everything one role (actor, ref, reward) needs to build and run its model."""

    role: str
    model: ModelArchConfig
    parallel: ParallelConfig
    batch: BatchConfig
    optim: OptimizerConfig
    precision: PrecisionConfig
    ckpt: CheckpointConfig
    data: DataConfig
    kernels: KernelConfig
    num_devices: int

    @property
    def tp(self) -> int:
        return self.parallel.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.parallel.pipeline_model_parallel_size

    @property
    def dp(self) -> int:
        """Data-parallel size; 0 when TP x PP does not divide the devices (a validation error)."""
        mp = self.tp * self.pp
        return self.num_devices // mp if self.num_devices % mp == 0 else 0
