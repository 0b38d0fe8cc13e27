"""Per-role training config: `{**model, **megatron_training, **<role>_config}` grouped by concern.

Key names are megatron's / MindSpeed-RL's, so users' YAML files carry over; each key lives in
exactly one group (checked when groups are built).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mindrl.config.dpo_keys import DPOKeys
from mindrl.config.fates import MINDSPEED, handed, no_effect, refused
from mindrl.config.fields import spec
from mindrl.config.layer_layout import LayerLayout, layer_layout
from mindrl.config.megatron_features import (
    LayerVariantConfig,
    LoRAConfig,
    MoEConfig,
)
from mindrl.config.megatron_runtime import MegatronLoopConfig, MemoryConfig
from mindrl.config.model_arch import ModelArchConfig

CONTEXT_PARALLEL_ALGOS = ("ulysses_cp_algo", "megatron_cp_algo", "hybrid_cp_algo")
RING_ALWAYS_OVERLAPS = no_effect(
    "mindrl's ring attention (megatron's local attention) always sends the next key / value "
    "block while it attends the current one"
)
RING_UPDATE_UNFUSED = no_effect(
    "mindrl's ring attention merges the blocks' softmax with torch ops (no fused kernel)"
)
MINDSPEED_KERNEL = handed(
    MINDSPEED,
    elsewhere="mindrl builds a fused kernel of its own (torch.compile: models/host_fusions.py)",
)
# MindSpeed's fused rotary embedding: off the NPU mindrl's own (one autograd node, megatron's
# arithmetic; hand-written rather than torch.compile'd, which did not beat it on CPU)
MINDSPEED_ROPE = handed(
    MINDSPEED,
    elsewhere="mindrl's own fused rotary embedding in megatron's fused-rope slots "
    "(models/fused_rope.py)",
)
UNFUSED = no_effect(
    "mindrl builds the unfused megatron-core path (identical numerics on every device)"
)


@dataclass(frozen=True)
class ParallelConfig:
    tensor_model_parallel_size: int = spec(1, ge=1)
    pipeline_model_parallel_size: int = spec(1, ge=1)
    sequence_parallel: bool = spec(
        False,
        help="megatron's sequence parallelism: norms / dropout activations split over TP "
        "(needs TP > 1; a warning and no effect at TP 1)",
    )
    use_distributed_optimizer: bool = spec(
        False,
        help="megatron's distributed (ZeRO-1) optimizer: fp32 master weights and Adam state "
        "sharded over DP; its checkpoints resume at another DP size",
    )
    distributed_backend: str = spec(
        "auto",
        choices=("auto", "nccl", "hccl", "gloo"),
        help="informational: the accelerator picks hccl / nccl / gloo",
        fate=no_effect("the accelerator picks the backend: hccl on NPU, nccl on GPU, gloo on CPU"),
    )
    context_parallel_size: int = spec(
        1,
        ge=1,
        help="context parallelism: each sequence split over this many ranks (megatron's "
        "load-balanced 2 x CP chunks), attention exchanging keys / values among them",
    )
    context_parallel_algo: str = spec(
        "ulysses_cp_algo",
        help="how CP ranks attend across the split (read with context_parallel_size > 1): "
        "megatron_cp_algo (ring: keys / values of every rank), ulysses_cp_algo "
        "(all-to-all over heads) or hybrid_cp_algo (MindSpeed's: Ulysses inside groups of "
        "ulysses_degree_in_cp ranks, ring across them)",
        fate=refused(
            "MindSpeed's context parallel algorithms are ulysses_cp_algo, megatron_cp_algo "
            "and hybrid_cp_algo",
            allowed=CONTEXT_PARALLEL_ALGOS,
        ),
    )
    ulysses_degree_in_cp: int | None = spec(
        None,
        ge=2,
        help="hybrid_cp_algo: CP ranks per Ulysses group (MindSpeed's --ulysses-degree-in-cp); "
        "it divides context_parallel_size, leaving a ring of 2 or more",
    )
    use_cp_send_recv_overlap: bool = spec(False, fate=RING_ALWAYS_OVERLAPS)
    use_fused_ring_attention_update: bool = spec(False, fate=RING_UPDATE_UNFUSED)
    num_layers_per_virtual_pipeline_stage: int | None = spec(
        None,
        ge=1,
        help="virtual pipeline (interleaved 1F1B): layers per model chunk; each PP rank holds "
        "num_layers / (PP x this) chunks",
    )
    num_layer_list: str | int | None = spec(
        None,
        help='layers per pipeline stage ("16,17,16,15"; adds up to num_layers, one count '
        "per PP stage): megatron-core's pipeline_model_parallel_layout",
    )
    use_tp_pp_dp_mapping: bool = spec(
        False, fate=no_effect("ranks are ordered as megatron-core's parallel_state does by default")
    )


@dataclass(frozen=True)
class BatchConfig:
    micro_batch_size: int = spec(1, ge=1, help="sequences per forward/backward on one DP rank")
    global_batch_size: int = spec(1, ge=1, help="prompts per RL step (MindSpeed-RL semantics)")
    seq_length: int = spec(
        1024,
        ge=1,
        help="stage dpo: the longest pair sequence trained (longer pairs are left out) and "
        "planned for; other stages warn that it has no effect (SEQ_LENGTH_ELSEWHERE)",
    )
    variable_seq_lengths: bool = spec(
        True, fate=no_effect("every micro-batch is padded to its own longest sample")
    )
    no_pad_to_seq_lengths: bool = spec(
        False,
        fate=no_effect(
            "micro-batches are padded to their longest sample, not seq_length (packed ones under "
            "pipeline parallelism to the longest packed micro-batch)"
        ),
    )
    pad_to_multiple_of: int = spec(
        8,
        fate=no_effect("MindSpeed-RL overwrites it with TP x CP; mindrl pads micro-batches itself"),
    )
    reset_position_ids: bool = spec(
        False,
        fate=no_effect(
            "packed sequences (rl_config.use_remove_padding) always restart positions per sample"
        ),
    )
    reset_attention_mask: bool = spec(
        False,
        fate=no_effect(
            "packed sequences (rl_config.use_remove_padding) always stop attention at each "
            "sample's end (MindSpeed-RL requires true there)"
        ),
    )


MOMENT_DTYPES = ("fp32", "bf16")  # megatron's fp16 / fp8 moments: not built


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
    optimizer: str = spec(
        "adam", fate=refused("only the Adam optimizer is built", allowed=("adam",))
    )
    use_precision_aware_optimizer: bool = spec(
        False,
        help="megatron's precision-aware optimizer: Adam's moments stored in exp_avg_dtype / "
        "exp_avg_sq_dtype, the update computed in fp32 (TE's FusedAdam on a GPU, mindrl's "
        "host Adam on CPU)",
    )
    exp_avg_dtype: str = spec(
        "fp32", choices=MOMENT_DTYPES, help="Adam's first moment (use_precision_aware_optimizer)"
    )
    exp_avg_sq_dtype: str = spec(
        "fp32",
        choices=MOMENT_DTYPES,
        help="Adam's second moment (use_precision_aware_optimizer); in bf16 a change under half "
        "a bf16 step (0.2-0.4%) is lost, so with adam_beta2 above ~0.996 it stops decaying",
    )


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
    no_save_optim: bool = spec(
        False, help="checkpoints leave out the optimizer and LR-schedule state (weights only)"
    )
    no_save_rng: bool = spec(False, help="checkpoints leave out the RNG state")
    no_shared_storage: bool = spec(
        False,
        fate=no_effect(
            "mindrl writes each checkpoint from the ranks that hold it; a multi-node run needs "
            "the save folder on storage every node sees"
        ),
    )
    load_checkpoint_loosely: bool = spec(
        False, fate=no_effect("checkpoints are always loaded strictly (every tensor must match)")
    )
    keep_last_n_checkpoints: int = spec(0, ge=0, help="0 keeps all")


@dataclass(frozen=True)
class DataConfig:
    data_path: str | None = None
    tokenizer_name_or_path: str | None = None
    tokenizer_type: str = spec(
        "PretrainedFromHF",
        fate=refused(
            "only Hugging Face tokenizers (PretrainedFromHF) are built",
            allowed=("PretrainedFromHF",),
        ),
    )
    tokenizer_not_use_fast: bool = spec(False, help="load the slow (python) tokenizer class")
    tokenizer_padding_side: str = spec(
        "right", fate=no_effect("mindrl lays out and pads its batches itself (right-padded)")
    )
    vocab_extra_ids: int = spec(
        0, fate=no_effect("mindrl uses the Hugging Face tokenizer's vocabulary as it is")
    )
    split: str = spec(
        "100,0,0",
        fate=refused(
            "a train / valid / test split of the prompt store: not built yet (mindrl trains on "
            "the whole store; validation data is rl_config.val_data_path)",
            allowed=("100,0,0",),
        ),
    )
    dataset_additional_keys: tuple[str, ...] = spec(
        ("labels",),
        fate=no_effect(
            "the columns a prompt store carries were chosen when it was made (the dataset "
            "YAML's dataset_additional_keys); they all reach the verifiers as "
            "SampleMeta.extra, and labels are always kept"
        ),
    )
    no_shuffle: bool = False
    full_shuffle_instruction_dataset: bool = spec(
        False, fate=no_effect("the prompt sampler shuffles every epoch unless no_shuffle")
    )
    is_instruction_dataset: bool = spec(
        False, fate=no_effect("the prompt store's layout is fixed by cli/preprocess_data.py")
    )
    is_pairwise_dataset: bool = spec(
        False,
        help="data_path is a pairwise store (stage dpo; cli/preprocess_data.py with "
        "AlpacaStylePairwiseHandler)",
    )
    dataloader_type: str | None = spec(
        None, fate=no_effect("mindrl's resumable prompt sampler feeds the steps")
    )
    num_workers: int = spec(2, fate=no_effect("prompts are read from an in-memory store"))
    prompt_type: str | None = spec(
        None,
        fate=no_effect(
            "the chat template is applied when the prompt store is made (prompt_type in the "
            "dataset YAML)"
        ),
    )
    prompt_type_path: str | None = spec(
        None, fate=no_effect("the chat templates are read when the prompt store is made")
    )
    seed: int = spec(1234, ge=0)
    stage: str = spec(
        "ray_grpo",
        help="ray_grpo, ray_dapo (DAPO's loss, dynamic sampling, no reference model), "
        "ray_ppo (a critic, GAE) or dpo (offline DPO on pairs: cli/train_dpo.py)",
        fate=refused(
            "mindrl trains GRPO, DAPO, PPO and offline DPO (stage: ray_grpo / ray_dapo / "
            "ray_ppo / dpo)",
            allowed=("ray_grpo", "ray_dapo", "ray_ppo", "dpo"),
            reasons={
                "ray_online_dpo": "online DPO (stage ray_online_dpo): not built yet",
            },
        ),
    )


@dataclass(frozen=True)
class KernelConfig:
    """Fused-kernel switches users bring from MindSpeed/megatron YAMLs.

    MindSpeed's NPU kernels are handed to its megatron adaptor on NPU; elsewhere mindrl builds
    its own fused RMSNorm and megatron's own fused SwiGLU for `use_fused_rmsnorm` /
    `use_fused_swiglu` (`models/host_fusions.py`), and megatron's unfused path for the rest, so
    their switches have no effect there.
    """

    use_fused_rmsnorm: bool = spec(False, fate=MINDSPEED_KERNEL)
    use_flash_attn: bool = spec(False, fate=handed(MINDSPEED))
    use_fused_swiglu: bool = spec(False, fate=MINDSPEED_KERNEL)
    use_fused_rotary_pos_emb: bool = spec(False, fate=MINDSPEED_ROPE)
    shape_order: str = spec("SBH", fate=handed(MINDSPEED))
    use_ascend_coc: bool = spec(False, fate=handed(MINDSPEED))
    coc_mode: int = spec(-1, fate=handed(MINDSPEED))
    coc_parallel_num: int = spec(1, fate=handed(MINDSPEED))
    coc_fused_kernel: bool = spec(False, fate=handed(MINDSPEED))
    gemm_gradient_accumulation_fusion: bool = spec(False, fate=handed(MINDSPEED))
    no_masked_softmax_fusion: bool = spec(True, fate=UNFUSED)
    attention_softmax_in_fp32: bool = spec(
        True, fate=no_effect("mindrl always computes the attention softmax in fp32")
    )
    no_gradient_accumulation_fusion: bool = spec(True, fate=UNFUSED)
    no_bias_dropout_fusion: bool = spec(True, fate=UNFUSED)


ROLE_GROUPS: dict[str, type] = {
    "model": ModelArchConfig,
    "parallel": ParallelConfig,
    "batch": BatchConfig,
    "optim": OptimizerConfig,
    "precision": PrecisionConfig,
    "ckpt": CheckpointConfig,
    "data": DataConfig,
    "kernels": KernelConfig,
    "memory": MemoryConfig,
    "megatron_loop": MegatronLoopConfig,
    "moe": MoEConfig,
    "lora": LoRAConfig,
    "layer_variant": LayerVariantConfig,
    "dpo": DPOKeys,
}

ROLE_NAMES = {
    "actor": "actor_config",
    "ref": "ref_config",
    "reward": "reward_config",
    "critic": "critic_config",
    "teacher": "teacher_config",
}


@dataclass(frozen=True)
class RoleConfig:
    """Everything one role (actor, ref, reward, critic, teacher) needs to build and run its model."""

    FLAT_GROUPS: ClassVar[bool] = True  # the groups' keys sit directly in the role's section

    role: str
    model: ModelArchConfig
    parallel: ParallelConfig
    batch: BatchConfig
    optim: OptimizerConfig
    precision: PrecisionConfig
    ckpt: CheckpointConfig
    data: DataConfig
    kernels: KernelConfig
    memory: MemoryConfig
    megatron_loop: MegatronLoopConfig
    moe: MoEConfig
    lora: LoRAConfig
    layer_variant: LayerVariantConfig
    dpo: DPOKeys
    num_devices: int

    @property
    def tp(self) -> int:
        return self.parallel.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.parallel.pipeline_model_parallel_size

    @property
    def layer_layout(self) -> LayerLayout:
        """num_layers over the pipeline stages (`num_layer_list`, else the even split) and the
        noop layers; the config check has refused contradicting keys."""
        return layer_layout(
            self.model.num_layers, self.pp, self.parallel.num_layer_list, self.model.noop_layers
        )

    @property
    def cp(self) -> int:
        return self.parallel.context_parallel_size

    @property
    def dp(self) -> int:
        """Data-parallel size; 0 when TP x PP x CP does not divide the devices (a validation
        error)."""
        mp = self.tp * self.pp * self.cp
        return self.num_devices // mp if self.num_devices % mp == 0 else 0
