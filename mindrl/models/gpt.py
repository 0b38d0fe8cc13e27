"""Build megatron-core's GPTModel from a `ModelArchConfig` at the current TP/PP.

Llama / Qwen2 / Qwen3 / Qwen3-MoE / Qwen2-MoE / DeepSeek-V3 map onto GPTModel as: RMSNorm (eps), RoPE (theta, non-interleaved like
HF's rotate_half; Llama 3.x frequency scaling), SwiGLU (gated_linear_unit + silu), GQA
(num_query_groups), explicit head_dim (kv_channels), bias only on QKV (Qwen2), RMSNorm per
query / key head (Qwen3: qk_layernorm), tied or untied output layer, vocab padded to a multiple
of make_vocab_size_divisible_by x TP; Qwen3-MoE's experts are megatron's MoE layer
(`mindrl.models.moe`; with Qwen2-MoE's and DeepSeek's shared experts, DeepSeek's
sigmoid routing and dense first layers); DeepSeek's multi-latent attention is megatron's MLA
spec with an `MLATransformerConfig` (YaRN RoPE). The transformer-engine layer spec is used when
transformer_engine imports, the local (pure megatron-core) spec otherwise.

megatron-core >= 0.12: only long-standing TransformerConfig fields are set, and keyword
arguments newer releases dropped or renamed are filtered against the installed signature.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mindrl.accelerator import get_accelerator
from mindrl.accelerator.megatron_shims import gloo_pipeline_overrides, tensor_cuda_is_identity
from mindrl.config.layer_layout import layout_problems
from mindrl.config.model_arch import ModelArchConfig
from mindrl.models.dtypes import dtype_short_name, torch_dtype
from mindrl.models.moe import moe_transformer_kwargs, validate_expert_layout
from mindrl.models.row_grad_embedding import use_row_grad_embedding

if TYPE_CHECKING:
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from mindrl.config.megatron_features import LoRAConfig


def te_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def validate_parallel_layout(
    arch: ModelArchConfig,
    tp: int,
    pp: int,
    ep: int = 1,
    num_layer_list: str | Sequence[int] | None = None,
) -> None:
    """Raise ValueError when TP/PP/EP (and MindSpeed's `num_layer_list` / `noop_layers`)
    cannot split this architecture (names the flag)."""
    problems = validate_expert_layout(arch, ep)
    problems += layout_problems(arch.num_layers, pp, num_layer_list, arch.noop_layers)
    sizes = [
        ("num_attention_heads", arch.num_attention_heads),
        ("num_query_groups (kv heads)", arch.num_kv_heads),
        ("moe_ffn_hidden_size" if arch.is_moe else "ffn_hidden_size", arch.expert_ffn_hidden_size),
    ]
    if arch.has_dense_layers:
        sizes.append(("ffn_hidden_size", arch.ffn_hidden_size))
    if arch.shared_expert_ffn_hidden_size:
        sizes.append(("the shared expert's ffn size", arch.shared_expert_ffn_hidden_size))
    if arch.multi_latent_attention:  # the latent down projections are split over TP too
        if arch.q_lora_rank:
            sizes.append(("q_lora_rank", arch.q_lora_rank))
        kv_down = (arch.kv_lora_rank or 0) + (arch.qk_pos_emb_head_dim or 0)
        sizes.append(("kv_lora_rank + qk_pos_emb_head_dim", kv_down))
    for what, value in sizes:
        if value % tp:
            problems.append(
                f"--target-tensor-parallel-size {tp} does not divide {what}={value} "
                "(tensor_parallel_size must divide it)"
            )
    if arch.num_layers % pp and not num_layer_list:
        problems.append(
            f"--target-pipeline-parallel-size {pp} does not divide num_layers={arch.num_layers} "
            "(pipeline_parallel_size must divide it)"
        )
    if problems:
        raise ValueError("; ".join(problems))


def stage_layer_counts(layout: Any) -> list[int] | None:
    """Decoder layers per stage of a `pipeline_model_parallel_layout` given as a list of
    lists (`LayerLayout.megatron_layout`), None without one."""
    if layout is None:
        return None
    return [list(stage).count("decoder") for stage in layout]


def _filter_fields(cls: type, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in kwargs.items() if k in names}


def transformer_config_from_arch(
    arch: ModelArchConfig,
    *,
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
    expert_parallel_size: int = 1,
    params_dtype: str | torch.dtype = "fp32",
    use_cpu_initialization: bool | None = None,
    perform_initialization: bool = True,
    overrides: Mapping[str, Any] | None = None,
) -> TransformerConfig:
    """megatron-core TransformerConfig for `arch` (bf16/fp16 flags follow params_dtype).

    `overrides` sets further TransformerConfig fields (recompute, sequence_parallel, ...);
    unknown names raise so a typo cannot pass silently.
    """
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = torch_dtype(params_dtype)
    short = dtype_short_name(dtype)
    if use_cpu_initialization is None:
        use_cpu_initialization = get_accelerator().is_cpu
    kwargs: dict[str, Any] = dict(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        hidden_dropout=arch.hidden_dropout,
        attention_dropout=arch.attention_dropout,
        layernorm_epsilon=arch.norm_epsilon,
        normalization="RMSNorm",
        add_bias_linear=not arch.disable_bias_linear,
        add_qkv_bias=arch.add_qkv_bias,
        qk_layernorm=arch.qk_layernorm,
        gated_linear_unit=arch.swiglu,
        activation_func=F.silu if arch.swiglu else F.gelu,
        init_method_std=arch.init_method_std,
        tensor_model_parallel_size=tensor_parallel_size,
        pipeline_model_parallel_size=pipeline_parallel_size,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=short == "bf16",
        fp16=short == "fp16",
        use_cpu_initialization=use_cpu_initialization,
        perform_initialization=perform_initialization,
        # Unfused paths: identical numerics on every device, no apex / TE kernels needed.
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        apply_query_key_layer_scaling=False,
        attention_softmax_in_fp32=True,
        rotary_interleaved=False,
        sequence_parallel=False,
        # noop layers leave holes in the stacked layer axis of a checkpoint: each layer is
        # saved under its own global index instead
        hetereogenous_dist_checkpoint=bool(arch.noop_layer_indices),
        **moe_transformer_kwargs(arch, expert_parallel_size),
    )
    if overrides:
        unknown = set(overrides) - {f.name for f in dataclasses.fields(TransformerConfig)}
        if unknown:
            raise ValueError(f"unknown TransformerConfig fields in overrides: {sorted(unknown)}")
        kwargs.update(overrides)
    if kwargs["apply_rope_fusion"]:
        from mindrl.models.fused_rope import install_fused_rope

        install_fused_rope()  # megatron's fused-rope slots: TE's kernel, else mindrl's own
    if arch.multi_latent_attention:
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        kwargs.update(mla_transformer_kwargs(arch))
        return MLATransformerConfig(**_filter_fields(MLATransformerConfig, kwargs))
    return TransformerConfig(**_filter_fields(TransformerConfig, kwargs))


def mla_transformer_kwargs(arch: ModelArchConfig) -> dict[str, Any]:
    """MLATransformerConfig's fields of DeepSeek's multi-latent attention and its RoPE (YaRN
    when rope_scaling_type is yarn; the softmax scale then carries YaRN's mscale_all_dim)."""
    yarn = arch.rope_scaling_type == "yarn"
    return dict(
        q_lora_rank=arch.q_lora_rank,
        kv_lora_rank=arch.kv_lora_rank,
        qk_head_dim=arch.qk_head_dim,
        qk_pos_emb_head_dim=arch.qk_pos_emb_head_dim,
        v_head_dim=arch.v_head_dim,
        rope_type="yarn" if yarn else "rope",
        rotary_base=arch.rotary_base,
        rotary_scaling_factor=arch.rope_scaling_factor if yarn else 1.0,
        original_max_position_embeddings=(
            arch.rope_scaling_original_max_position_embeddings or arch.max_position_embeddings
        ),
        beta_fast=arch.beta_fast,
        beta_slow=arch.beta_slow,
        mscale=arch.rope_scaling_mscale,
        mscale_all_dim=arch.rope_scaling_mscale_all_dim if yarn else 0.0,
    )


def layer_spec(
    config: TransformerConfig,
    use_te: bool | None = None,
    vp_stage: int | None = None,
    lora: LoRAConfig | None = None,
    noop_layers: Sequence[int] = (),
) -> Any:
    """The TE layer spec where transformer_engine is installed (or use_te=True), else local.

    `lora` swaps the target linears for their LoRA variants (`models/lora.py`); the local
    spec's core attention also takes packed sequences (`models/packed_attention.py`; TE's
    does natively).
    Under sequence parallelism the local spec's torch norms are swapped for
    `SequenceParallelTorchNorm` (megatron's own refuses SP), in every layer of this rank's
    chunk and in the block's final norm. MindSpeed's `noop_layers` (global indices) become
    identity layers without weights in this chunk's list of layer specs; a MoE model's dense
    layers (`moe_layer_freq` as a list: DeepSeek-V3's first ones) get the dense layer spec.
    """
    if use_te is None:
        use_te = te_available()
    layer, final_norm = _one_layer_spec(config, use_te, lora, config.num_moe_experts)
    dense = None
    freq = config.moe_layer_freq
    if config.num_moe_experts and isinstance(freq, list) and not all(freq):
        dense, _ = _one_layer_spec(config, use_te, lora, None)
    return with_noop_layers(layer, final_norm, config, vp_stage, noop_layers, dense)


def _one_layer_spec(
    config: TransformerConfig, use_te: bool, lora: LoRAConfig | None, num_experts: int | None
) -> tuple[Any, Any]:
    """One layer's spec (MoE with `num_experts`, else dense) and the block's final norm
    (None: megatron's default for a plain spec)."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    mla = bool(getattr(config, "multi_latent_attention", False))
    moe = {"num_experts": num_experts, "moe_grouped_gemm": False}
    if use_te:
        spec = specs.get_gpt_layer_with_transformer_engine_spec(
            qk_layernorm=config.qk_layernorm, multi_latent_attention=mla, **moe
        )
        if lora is not None:
            raise ValueError(
                "LoRA with Transformer Engine's fused norm + linear layers is not built "
                "(mindrl's adapters wrap megatron's local linear layers)"
            )
        return spec, None
    fn = specs.get_gpt_layer_local_spec
    if "normalization" in inspect.signature(fn).parameters:
        moe["normalization"] = config.normalization
    spec = fn(qk_layernorm=config.qk_layernorm, multi_latent_attention=mla, **moe)
    from mindrl.models.packed_attention import with_segmented_attention

    spec = with_segmented_attention(spec)  # packed micro-batches (use_remove_padding)
    if lora is not None:
        from mindrl.models.lora import lora_layer_spec

        spec = lora_layer_spec(spec, lora)
    if not config.sequence_parallel:
        return spec, None
    from mindrl.accelerator.megatron_shims import SequenceParallelTorchNorm

    layer = dataclasses.replace(
        spec,
        submodules=dataclasses.replace(
            spec.submodules,
            input_layernorm=SequenceParallelTorchNorm,
            pre_mlp_layernorm=SequenceParallelTorchNorm,
        ),
    )
    return layer, SequenceParallelTorchNorm


def with_noop_layers(
    layer: Any,
    final_norm: Any,
    config: TransformerConfig,
    vp_stage: int | None,
    noop_layers: Sequence[int],
    dense_layer: Any = None,
) -> Any:
    """`layer` for every layer of this chunk, an identity layer at each noop index and
    `dense_layer` at each dense index of `config.moe_layer_freq`; as megatron's block spec when
    a layer or the final norm differs from the plain spec."""
    if final_norm is None and not noop_layers and dense_layer is None:
        return layer
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from mindrl.models.noop_layer import NoopTransformerLayer

    count = get_num_layers_to_build(config, vp_stage=vp_stage)
    offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
    noop = set(noop_layers)
    identity = ModuleSpec(module=NoopTransformerLayer)
    freq = config.moe_layer_freq
    pattern = freq if isinstance(freq, list) else None

    def spec_of(index: int) -> Any:
        if index in noop:
            return identity
        if dense_layer is not None and pattern is not None and not pattern[index]:
            return dense_layer
        return layer

    specs = [spec_of(offset + i) for i in range(count)]
    if final_norm is None:
        from megatron.core.transformer.transformer_block import LayerNormImpl

        final_norm = LayerNormImpl  # the norm megatron's block gives a plain layer spec
    return TransformerBlockSubmodules(layer_specs=specs, layer_norm=final_norm)


def build_gpt_model(
    arch: ModelArchConfig,
    *,
    params_dtype: str | torch.dtype = "fp32",
    use_te: bool | None = None,
    pre_process: bool | None = None,
    post_process: bool | None = None,
    vp_stage: int | None = None,
    perform_initialization: bool = True,
    meta_device: bool = False,
    config_overrides: Mapping[str, Any] | None = None,
    lora: LoRAConfig | None = None,
    context_parallel_algo: str = "megatron_cp_algo",
    ulysses_degree_in_cp: int | None = None,
    cp_ring_kv: str = "pass",
) -> GPTModel:
    """One GPTModel chunk for this rank's TP/PP position (parallel_state must be initialised).

    `meta_device=True` builds the model without storage (the offline converter only needs its
    `sharded_state_dict()` layout). The model is on the accelerator's device, in params_dtype.
    Under context parallelism (parallel_state's CP group > 1) the model splits each input
    sequence over the CP ranks by `context_parallel_algo` (and `ulysses_degree_in_cp` for
    `hybrid_cp_algo`; `models/context_parallel.py`); `cp_ring_kv` "gather" all-gathers the
    ring's keys / values instead of passing them round (the benchmark's comparison).
    """
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    acc = get_accelerator()
    acc.apply_megatron_shims()
    if arch.multi_latent_attention and not te_available():
        from mindrl.accelerator.megatron_shims import mla_without_transformer_engine

        mla_without_transformer_engine()
    tp = ps.get_tensor_model_parallel_world_size()
    pp = ps.get_pipeline_model_parallel_world_size()
    ep = ps.get_expert_model_parallel_world_size()
    layout = (config_overrides or {}).get("pipeline_model_parallel_layout")
    validate_parallel_layout(arch, tp, pp, ep, stage_layer_counts(layout))
    if acc.dist_backend == "gloo":
        config_overrides = {**gloo_pipeline_overrides(), **(config_overrides or {})}
    config = transformer_config_from_arch(
        arch,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        expert_parallel_size=ep,
        params_dtype=params_dtype,
        use_cpu_initialization=True if meta_device else None,
        perform_initialization=perform_initialization and not meta_device,
        overrides=config_overrides,
    )
    if vp_stage is None:
        first = ps.get_pipeline_model_parallel_rank() == 0
        last = ps.get_pipeline_model_parallel_rank() == pp - 1
    else:  # virtual pipeline (megatron-core >= 0.13 signature)
        first = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
        last = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
    pre_process = first if pre_process is None else pre_process
    post_process = last if post_process is None else post_process
    kwargs: dict[str, Any] = dict(
        config=config,
        transformer_layer_spec=layer_spec(config, use_te, vp_stage, lora, arch.noop_layer_indices),
        vocab_size=arch.padded_vocab_size(tp),
        max_sequence_length=arch.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=arch.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=arch.rotary_base,
    )
    if arch.rope_scaling_type == "llama3":
        kwargs.update(rope_scaling=True, rope_scaling_factor=arch.rope_scaling_factor)
    if vp_stage is not None:
        kwargs["vp_stage"] = vp_stage
    device_ctx = torch.device("meta") if meta_device else contextlib.nullcontext()
    with device_ctx, tensor_cuda_is_identity(acc.is_cpu and pp > 1 and not meta_device):
        model = GPTModel(**kwargs)
    if arch.rope_scaling_type == "llama3":
        _apply_llama3_rope_scaling(model, arch)
    if acc.is_cpu and not meta_device:
        use_row_grad_embedding(model)
    cp = ps.get_context_parallel_world_size()
    if cp > 1 and not meta_device:
        _check_context_parallel(config, use_te)
        from mindrl.models.context_parallel import install_context_parallel

        install_context_parallel(model, context_parallel_algo, ulysses_degree_in_cp, cp_ring_kv)
    dtype = torch_dtype(params_dtype)
    if dtype != torch.float32:
        # The local spec's torch norms ignore params_dtype; megatron's Float16Module casts the
        # whole module the same way.
        model = model.to(dtype)
    if not meta_device and not acc.is_cpu:
        # as megatron's get_model does: norms and buffers are created on the host
        model = model.to(acc.device(getattr(torch, acc.name).current_device()))
    return model


def _check_context_parallel(config: TransformerConfig, use_te: bool | None) -> None:
    """What mindrl's context parallelism covers: megatron's local spec, dense layers."""
    problems = []
    if use_te or (use_te is None and te_available()):
        problems.append("Transformer Engine's attention (megatron-core's own CP there)")
    if config.num_moe_experts:
        problems.append("MoE layers")
    if problems:
        raise ValueError(
            "context_parallel_size > 1 on megatron's local attention is not built with "
            + ", ".join(problems)
        )


def _apply_llama3_rope_scaling(model: GPTModel, arch: ModelArchConfig) -> None:
    """Redo megatron-core's llama3 frequency scaling with all four of the model's parameters.

    GPTModel passes only the factor on and scales with Llama 3.1's low / high frequency factors
    (1, 4) and context (8192); a model may use others (the tiny test model does). The unscaled
    frequencies are rebuilt from rotary_base exactly as megatron-core builds them.
    """
    import torch

    rotary = getattr(model, "rotary_pos_emb", None)
    if rotary is None:
        return
    old = rotary.inv_freq
    dim = arch.head_dim
    base = arch.rotary_base ** (
        torch.arange(0, dim, 2, dtype=torch.float32, device=old.device) / dim
    )
    rotary.inv_freq = rotary._apply_scaling(
        1.0 / base,
        factor=arch.rope_scaling_factor,
        low_freq_factor=arch.low_freq_factor,
        high_freq_factor=arch.high_freq_factor,
        original_max_position_embeddings=arch.original_max_position_embeddings,
    )


def unwrap_model(model: Any) -> GPTModel:
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model
