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


def layer_params(arch: ModelArchConfig, tp: int = 1, ep: int = 1) -> int:
    """One transformer layer's parameters on one TP rank (of one EP rank: a MoE layer holds
    its router whole and E / EP experts, each split over TP like a dense MLP)."""
    h, d = arch.hidden_size, arch.head_dim
    q, kv = arch.num_attention_heads * d, arch.num_kv_heads * d
    ffn = arch.expert_ffn_hidden_size
    ffn_out = 2 * ffn if arch.swiglu else ffn
    bias = not arch.disable_bias_linear
    qkv = h * (q + 2 * kv) // tp + ((q + 2 * kv) // tp if arch.add_qkv_bias or bias else 0)
    proj = q * h // tp + (h if bias else 0)
    fc1 = h * ffn_out // tp + (ffn_out // tp if bias else 0)
    fc2 = ffn * h // tp + (h if bias else 0)
    norms = 2 * h + (2 * d if arch.qk_layernorm else 0)  # Qwen3: one norm per q / k head dim
    if arch.num_experts is None:
        return qkv + proj + fc1 + fc2 + norms
    router = arch.num_experts * h
    return qkv + proj + norms + router + arch.num_experts // ep * (fc1 + fc2)


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
    layer_params: int
    embedding: int  # word embeddings (first stage)
    output: int  # output layer or its tied copy (last stage)
    final_norm: int

    @property
    def total(self) -> int:
        return self.layers * self.layer_params + self.embedding + self.output + self.final_norm


def stage_params(
    arch: ModelArchConfig, tp: int, pp: int, stage: int, ep: int = 1, layers: int | None = None
) -> StageParams:
    """One rank's parameters at pipeline stage `stage` of `pp` (`layers` with weights there,
    default the even split; with a virtual pipeline the first chunk of stage 0 holds the
    embeddings and the last chunk of the last stage the output layer, so the per-rank totals
    are the same)."""
    first, last = stage == 0, stage == pp - 1
    emb = embedding_params(arch, tp)
    output = emb if last and (not arch.tie_word_embeddings or pp > 1) else 0
    return StageParams(
        layers=arch.num_layers // pp if layers is None else layers,
        layer_params=layer_params(arch, tp, ep),
        embedding=emb if first else 0,
        output=output,
        final_norm=arch.hidden_size if last else 0,
    )


def model_params(arch: ModelArchConfig) -> int:
    """The whole model's parameters (one copy of tied embeddings, the vocabulary unpadded):
    what a model card states, and what the rollout engine loads."""
    emb = arch.vocab_size * arch.hidden_size
    output = 0 if arch.tie_word_embeddings else emb
    return emb + output + arch.hf_num_layers * layer_params(arch, 1) + arch.hidden_size
