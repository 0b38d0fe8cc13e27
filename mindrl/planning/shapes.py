"""What the memory plan reads of a config: each role's model and layout as the run will execute
it, and the sequence lengths its batches can reach.

A key whose declared fate says it does nothing on this backend (`no_effect`, or `handed` to a
component of another backend) is read at its default: the plan describes what will run, not
what the YAML wishes. `sequence_parallel: true` is planned with sequence parallelism only once
mindrl builds it, and `use_flash_attn` only on NPU, where MindSpeed honours it. When a feature
lands its fate becomes `honoured` and the plan follows without a change here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import Any

from mindrl.config.dpo_keys import DPO
from mindrl.config.fates import Handed, NoEffect, default_of, fate_of
from mindrl.config.model_arch import ModelArchConfig
from mindrl.config.role import RoleConfig
from mindrl.config.run import RunConfig

DTYPE_BYTES = {
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
}


def effective(group: Any, key: str, backend: str) -> Any:
    """The value of config key `key` of `group` (a config dataclass) that the run acts on.

    The configured value when mindrl honours the key (or hands it to what honours it on
    `backend`), else the key's default. Read through the key's fate, so a key that is not
    built yet never makes the plan promise memory the run will not save."""
    field = next(f for f in dataclasses.fields(group) if f.name == key)
    fate = fate_of(field)
    value = getattr(group, key)
    if isinstance(fate, NoEffect) or (isinstance(fate, Handed) and not fate.honoured_on(backend)):
        return default_of(field)
    return value


def ignored_settings(run: RunConfig, backend: str) -> list[str]:
    """Memory-saving keys set in the YAML that the plan cannot count (not built, or not
    honoured on this backend), as `section.key` lines for the plan's footnote."""
    keys = {
        "parallel": ("sequence_parallel", "use_distributed_optimizer"),
        "memory": ("recompute_granularity",),
        "kernels": ("use_flash_attn", "use_fused_rmsnorm", "use_fused_swiglu"),
    }
    out = []
    for role in run.roles:
        for group_name, names in keys.items():
            group = getattr(role, group_name)
            for name in names:
                value = getattr(group, name)
                if value not in (None, False) and effective(group, name, backend) != value:
                    line = f"{name}: {value}"
                    if line not in out:
                        out.append(line)
    return out


@dataclass(frozen=True)
class Recompute:
    """megatron's activation recomputation: granularity None / "full" / "selective"; full
    recompute checkpoints groups of `num_layers` layers (uniform) or the first `num_layers`
    layers of each model chunk (block)."""

    granularity: str | None = None
    method: str | None = None
    num_layers: int = 1


@dataclass(frozen=True)
class RoleShape:
    """One megatron role's model and layout as it will run on `backend`."""

    role: str
    arch: ModelArchConfig
    num_devices: int
    tp: int
    pp: int
    dp: int
    vpp: int  # model chunks per pipeline rank (1: the plain pipeline)
    sequence_parallel: bool
    distributed_optimizer: bool
    recompute: Recompute
    micro_batch: int
    params_dtype: str
    flash_attention: bool
    fused_norm: bool
    fused_swiglu: bool
    trains: bool
    hf_model: bool  # the reward model: a whole HF model per device, no megatron
    ep: int = 1  # expert parallel (MoE): each rank holds E / EP experts of every layer
    # CPU: megatron's local attention runs as torch's fused kernel (models/packed_attention.py)
    fused_local_attention: bool = False
    adam_bytes: int = 8  # Adam's two moments per trained parameter (fp32 unless narrowed)
    # layers with weights on each pipeline stage (num_layer_list, noop layers left out);
    # empty: num_layers split evenly
    stage_layers: tuple[int, ...] = ()
    cp: int = 1  # context parallel: each rank runs the layers on seq / CP of every sequence

    @property
    def act_bytes(self) -> int:
        """Bytes of one activation element: megatron computes in the parameters' dtype."""
        return DTYPE_BYTES[self.params_dtype]

    def layers_on_stage(self, stage: int) -> int:
        """Layers with weights on pipeline stage `stage`."""
        if self.stage_layers:
            return self.stage_layers[stage]
        return self.arch.num_layers // self.pp

    def first_layer_of_stage(self, stage: int) -> int:
        """The global index of stage `stage`'s first layer with weights (which of a MoE
        model's layers are dense decides their size)."""
        return sum(self.layers_on_stage(s) for s in range(stage))

    @property
    def layers_per_stage(self) -> int:
        """The largest stage's layers: the stage whose activations decide the peak."""
        return max(self.layers_on_stage(s) for s in range(self.pp))

    def describe(self) -> str:
        vpp = f" VPP{self.vpp}" if self.vpp > 1 else ""
        cp = f" CP{self.cp}" if self.cp > 1 else ""
        return f"TP{self.tp} PP{self.pp}{vpp}{cp} DP{self.dp}"


def _te_here() -> bool:
    """megatron-core's transformer-engine layer spec (flash attention, fused norms) is what
    mindrl builds on CUDA when transformer_engine is installed where the plan is made."""
    return importlib.util.find_spec("transformer_engine") is not None


def role_shape(role: RoleConfig, backend: str) -> RoleShape:
    par, mem, kern = role.parallel, role.memory, role.kernels
    tp = role.tp
    per_chunk = effective(par, "num_layers_per_virtual_pipeline_stage", backend)
    vpp = role.model.num_layers // (role.pp * per_chunk) if per_chunk else 1
    granularity = effective(mem, "recompute_granularity", backend)
    recompute = Recompute(
        granularity,
        effective(mem, "recompute_method", backend) if granularity == "full" else None,
        (effective(mem, "recompute_num_layers", backend) or 1) if granularity == "full" else 1,
    )
    te = backend == "cuda" and _te_here()
    return RoleShape(
        role=role.role,
        arch=role.model,
        num_devices=role.num_devices,
        tp=tp,
        pp=role.pp,
        dp=max(role.dp, 1),
        vpp=max(vpp, 1),
        # megatron turns sequence parallelism off at TP 1
        sequence_parallel=bool(effective(par, "sequence_parallel", backend)) and tp > 1,
        distributed_optimizer=bool(effective(par, "use_distributed_optimizer", backend)),
        recompute=recompute,
        # a DPO micro-batch of n pairs holds 2n rows (each pair's chosen and rejected)
        micro_batch=role.batch.micro_batch_size * (2 if role.data.stage == DPO else 1),
        params_dtype=role.precision.params_dtype,
        flash_attention=te or bool(effective(kern, "use_flash_attn", backend)),
        fused_norm=te or bool(effective(kern, "use_fused_rmsnorm", backend)),
        fused_swiglu=bool(effective(kern, "use_fused_swiglu", backend)),
        trains=role.role in ("actor", "critic"),
        hf_model=role.role == "reward",
        ep=role.moe.expert_model_parallel_size,
        fused_local_attention=backend == "cpu" and role.model.attention_dropout == 0,
        adam_bytes=_adam_bytes(role),
        stage_layers=role.layer_layout.weighted_layers_per_stage(),
        cp=role.cp,
    )


def _adam_bytes(role: RoleConfig) -> int:
    o = role.optim
    if not o.use_precision_aware_optimizer:
        return 2 * DTYPE_BYTES["fp32"]
    return DTYPE_BYTES[o.exp_avg_dtype] + DTYPE_BYTES[o.exp_avg_sq_dtype]


@dataclass(frozen=True)
class Lengths:
    """The longest sequence a micro-batch can hold: prompts up to max_prompt_length (longer
    ones are left out of training), responses up to sampling max_tokens, both within the
    engine's max_model_len. Micro-batches are padded to their longest sample."""

    prompt: int
    response: int

    @property
    def seq(self) -> int:
        return self.prompt + self.response

    @classmethod
    def of(cls, run: RunConfig) -> Lengths:
        if run.offline:  # DPO: pair sequences up to seq_length (longer pairs left out)
            return cls(prompt=run.actor.batch.seq_length, response=0)
        gen = run.generate
        prompt = min(run.rl.algorithm.max_prompt_length, gen.max_model_len - 1)
        response = min(gen.sampling_config.max_tokens, gen.max_model_len - prompt)
        return cls(prompt=prompt, response=max(response, 1))

    def describe(self) -> str:
        if not self.response:
            return f"pair sequences up to {self.seq} tokens (seq_length), padded to their longest"
        return (
            f"sequences up to {self.seq} tokens (max_prompt_length {self.prompt} + max_tokens "
            f"{self.response}), micro-batches padded to their longest"
        )


def with_token_budget(shape: RoleShape, run: RunConfig, lengths: Lengths) -> RoleShape:
    """Under `use_dynamic_bsz` a micro-batch holds up to its pass's token budget instead of
    micro_batch_size sequences: the shape is planned as the budget's worth of longest
    sequences (rounded up)."""
    cfg = run.rl.micro_batching
    if not cfg.use_dynamic_bsz or shape.role not in ("actor", "ref"):
        return shape
    # the actor's training micro-batches hold what its memory peaks on; its forward-only
    # passes keep no activations for backward
    budget = (
        cfg.update_max_packing_token_size
        if shape.role == "actor"
        else cfg.ref_max_packing_token_size
    )
    return dataclasses.replace(shape, micro_batch=max(1, -(-budget // lengths.seq)))
