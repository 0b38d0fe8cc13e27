"""Megatron / MindSpeed keys about memory, speed and megatron's own training loop.

None of them changes what a GRPO run computes: activation recompute, overlapped gradient
reduction and parameter gathering are built through megatron-core (`mindrl/models/scale.py`);
MindSpeed's own NPU switches are handed to its megatron adaptor on NPU; megatron's eval /
logging cadence is accepted, and a value other than the default is warned once.
"""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.fates import MINDSPEED, handed, no_effect, refused
from mindrl.config.fields import spec

MEGATRON_LOOP = no_effect(
    "megatron's own train / eval loop does not run in mindrl; RL validation is "
    "rl_config.test_freq, progress is logged every step"
)
GENERATION = no_effect(
    "megatron's text generation is not used; rollout is generate_config / sampling_config"
)
MINDSPEED_MEMORY = handed(
    MINDSPEED,
    cpu_refusal="MindSpeed's NPU memory switch; megatron-core on CPU has no such path (use "
    "recompute_granularity / use_distributed_optimizer, which run everywhere)",
)


@dataclass(frozen=True)
class MemoryConfig:
    """Memory / speed trade-offs of the training step."""

    recompute_granularity: str | None = spec(
        None,
        choices=(None, "full", "selective"),
        help="megatron's activation recomputation: full (whole layers, with recompute_method) "
        "or selective (the attention core)",
    )
    recompute_method: str | None = spec(
        None,
        choices=(None, "uniform", "block"),
        help="full recompute: uniform (groups of recompute_num_layers layers) or block (the "
        "first recompute_num_layers layers of each pipeline stage)",
    )
    recompute_num_layers: int | None = spec(None, ge=1)
    recompute_activation_function: bool = spec(False, fate=MINDSPEED_MEMORY)
    swap_attention: bool = spec(False, fate=MINDSPEED_MEMORY)
    swap_optimizer: bool = spec(False, fate=MINDSPEED_MEMORY)
    reuse_fp32_param: bool = spec(False, fate=MINDSPEED_MEMORY)
    overlap_grad_reduce: bool = spec(
        False, help="megatron's DDP reduces gradient buckets during the backward pass"
    )
    overlap_param_gather: bool = spec(
        False,
        help="the distributed optimizer all-gathers updated parameters during the next forward "
        "(needs use_distributed_optimizer and overlap_grad_reduce)",
    )
    ddp_bucket_size: int | None = spec(
        None, ge=1, help="elements per DDP gradient bucket (megatron's default when unset)"
    )
    accumulate_allreduce_grads_in_fp32: bool = spec(
        True, fate=no_effect("gradients are always reduced in fp32")
    )


@dataclass(frozen=True)
class MegatronLoopConfig:
    """Knobs of megatron's pretraining loop and of MindSpeed-LLM's other trainers."""

    log_interval: int = spec(100, fate=MEGATRON_LOOP)
    log_throughput: bool = spec(False, fate=MEGATRON_LOOP)
    eval_iters: int = spec(100, fate=MEGATRON_LOOP)
    eval_interval: int = spec(1000, fate=MEGATRON_LOOP)
    skip_train: bool = spec(
        False, fate=refused("skipping training: use rl_config.val_only to only validate")
    )
    do_sample: bool = spec(False, fate=GENERATION)
    use_kv_cache: bool = spec(False, fate=GENERATION)
    no_check_for_nan_in_loss_and_grad: bool = spec(
        False, fate=no_effect("megatron's NaN check of loss and gradients is not run")
    )
    enable_high_availability: bool = spec(
        False,
        fate=no_effect(
            "MindIO high availability is not built; mindrl resumes from its last checkpoint"
        ),
    )
    npu_deterministic: bool = spec(False, fate=handed(MINDSPEED))
    ai_framework: str | None = spec(
        None, fate=refused("the MindSpore backend: not built yet (mindrl runs PyTorch)")
    )
    algorithm: str | None = spec(None, fate=no_effect("not read by MindSpeed-RL either"))
