"""Parameter counts of a decoder-only transformer as megatron-core lays it out per rank.

Counted from the architecture alone, tensor by tensor as megatron-core's GPTModel builds
them (tests/unit/test_memory_plan.py checks the tiny model against a real one, and the
shipped model files against the published sizes): column-parallel QKV and fc1 (and their
biases) split over TP, row-parallel proj and fc2 split over TP with their biases whole,
norms whole on every rank, the vocabulary padded to a multiple of
make_vocab_size_divisible_by x TP and split over TP. The first pipeline stage holds the
word embeddings; the last the final norm and the output layer, which with tied embeddings
is a second copy of the word embeddings when PP > 1 (megatron keeps the two in sync).
"""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.megatron_features import LoRAConfig
from mindrl.config.model_arch import ModelArchConfig


def layer_params(arch: ModelArchConfig, tp: int = 1, ep: int = 1, layer: int | None = None) -> int:
    """One transformer layer's parameters on one TP rank (of one EP rank: a MoE layer holds
    its router whole, E / EP experts and its shared expert, each split over TP like a dense
    MLP). `layer` (a global index) picks a dense layer of a MoE model (DeepSeek's first
    ones); None counts a MoE layer."""
    h = arch.hidden_size
    bias = not arch.disable_bias_linear
    attention, norms = _attention_params(arch, tp)
    moe = arch.is_moe and (layer is None or arch.is_moe_layer(layer))
    if not moe:
        return attention + norms + _mlp_params(arch.ffn_hidden_size, h, tp, arch.swiglu, bias)
    expert = _mlp_params(arch.expert_ffn_hidden_size, h, tp, arch.swiglu, bias)
    shared = arch.shared_expert_ffn_hidden_size
    shared_params = _mlp_params(shared, h, tp, arch.swiglu, bias) if shared else 0
    gate = h if shared and arch.shared_expert_gate else 0
    router = (arch.num_experts or 0) * h
    return (
        attention + norms + router + (arch.num_experts or 0) // ep * expert + shared_params + gate
    )


def _mlp_params(ffn: int, h: int, tp: int, swiglu: bool, bias: bool) -> int:
    ffn_out = 2 * ffn if swiglu else ffn
    fc1 = h * ffn_out // tp + (ffn_out // tp if bias else 0)
    fc2 = ffn * h // tp + (h if bias else 0)
    return fc1 + fc2


def _attention_params(arch: ModelArchConfig, tp: int) -> tuple[int, int]:
    """(projections, norms) of one layer's attention on one TP rank, the two layer norms
    included in the norms. MLA: the latent down projections are split over TP too (megatron's
    local spec gathers their outputs), its q / kv latent norms whole."""
    h, d = arch.hidden_size, arch.head_dim
    bias = not arch.disable_bias_linear
    if arch.multi_latent_attention:
        heads, rope = arch.num_attention_heads, arch.qk_pos_emb_head_dim or 0
        q_up = heads * arch.q_head_dim
        q_lora, kv_lora = arch.q_lora_rank, arch.kv_lora_rank or 0
        q = h * q_lora // tp + q_lora * q_up // tp if q_lora else h * q_up // tp
        kv = (
            h * (kv_lora + rope) // tp
            + kv_lora * heads * ((arch.qk_head_dim or 0) + (arch.v_head_dim or 0)) // tp
        )
        proj = heads * (arch.v_head_dim or 0) * h // tp + (h if bias else 0)
        return q + kv + proj, 2 * h + (q_lora or 0) + kv_lora
    q, kv = arch.num_attention_heads * d, arch.num_kv_heads * d
    qkv = h * (q + 2 * kv) // tp + ((q + 2 * kv) // tp if arch.add_qkv_bias or bias else 0)
    proj = q * h // tp + (h if bias else 0)
    return qkv + proj, 2 * h + (2 * d if arch.qk_layernorm else 0)  # Qwen3: q / k head norms


def lora_layer_params(arch: ModelArchConfig, lora: LoRAConfig, tp: int = 1) -> int:
    """One layer's LoRA adapter elements on one TP rank (`models/lora.py`'s split): column
    layers hold A whole and B split, row layers A split and B whole."""
    h, d, r = arch.hidden_size, arch.head_dim, lora.lora_r
    q, kv = arch.num_attention_heads * d, arch.num_kv_heads * d
    ffn = arch.ffn_hidden_size
    ffn_out = 2 * ffn if arch.swiglu else ffn
    sizes = {
        "linear_qkv": r * h + (q + 2 * kv) // tp * r,
        "linear_proj": r * q // tp + h * r,
        "linear_fc1": r * h + ffn_out // tp * r,
        "linear_fc2": r * ffn // tp + h * r,
    }
    return sum(sizes[t] for t in lora.targets if t in sizes)


def embedding_params(arch: ModelArchConfig, tp: int = 1) -> int:
    """The word embeddings (or an untied output layer) on one TP rank."""
    return arch.padded_vocab_size(tp) // tp * arch.hidden_size


@dataclass(frozen=True)
class StageParams:
    """Parameters one rank of pipeline stage `stage` holds."""

    layers: int  # transformer layers on the rank (all its virtual chunks)
    layers_total: int  # their parameters (dense and MoE layers differ)
    embedding: int  # word embeddings (first stage)
    output: int  # output layer or its tied copy (last stage)
    final_norm: int

    @property
    def total(self) -> int:
        return self.layers_total + self.embedding + self.output + self.final_norm


def stage_params(
    arch: ModelArchConfig,
    tp: int,
    pp: int,
    stage: int,
    ep: int = 1,
    layers: int | None = None,
    first_layer: int | None = None,
) -> StageParams:
    """One rank's parameters at pipeline stage `stage` of `pp` (`layers` with weights there
    from global layer `first_layer`, default the even split; with a virtual pipeline the first
    chunk of stage 0 holds the embeddings and the last chunk of the last stage the output
    layer, so the per-rank totals are the same)."""
    first, last = stage == 0, stage == pp - 1
    emb = embedding_params(arch, tp)
    output = emb if last and (not arch.tie_word_embeddings or pp > 1) else 0
    count = arch.num_layers // pp if layers is None else layers
    start = stage * (arch.num_layers // pp) if first_layer is None else first_layer
    indices = [min(i, arch.num_layers - 1) for i in range(start, start + count)]
    return StageParams(
        layers=count,
        layers_total=sum(layer_params(arch, tp, ep, i) for i in indices),
        embedding=emb if first else 0,
        output=output,
        final_norm=arch.hidden_size if last else 0,
    )


def model_params(arch: ModelArchConfig) -> int:
    """The whole model's parameters (one copy of tied embeddings, the vocabulary unpadded):
    what a model card states, and what the rollout engine loads."""
    emb = arch.vocab_size * arch.hidden_size
    output = 0 if arch.tie_word_embeddings else emb
    weighted = [i for i in range(arch.num_layers) if i not in set(arch.noop_layer_indices)]
    return emb + output + sum(layer_params(arch, 1, 1, i) for i in weighted) + arch.hidden_size
