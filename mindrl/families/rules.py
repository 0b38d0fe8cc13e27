"""The vocabulary of a family's HF <-> megatron-core mapping table (no torch).

Each `ParamRule` names one megatron-core parameter, the HF tensor(s) it is made of, the symbolic
HF shapes, and its split rule over tensor parallelism. Both directions read the same entries
(`mindrl.checkpoint.transforms` implements each split rule forwards and backwards), so the
HF -> mcore and mcore -> HF renames cannot drift apart. Names use megatron-core's local layer
spec; `{layer}` is the global layer index and `{expert}` the global expert index.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol


class Split(str, Enum):
    """How a megatron-core parameter is laid out over TP ranks (and built from HF tensors)."""

    REPLICATED = "replicated"  # norms: every TP rank holds the whole tensor
    COLUMN = "column"  # dim 0 (output features) split evenly over TP
    ROW = "row"  # dim 1 (input features) split evenly over TP
    VOCAB = "vocab"  # dim 0 padded to the padded vocab, then split evenly over TP
    QKV = "qkv"  # q, k, v fused per query group [q heads of group, k, v]; groups split over TP
    GATE_UP = "gate_up"  # gate and up each split over TP; rank r holds [gate_r; up_r]


class ArchFeatures(Protocol):
    """What a rule's `when` reads of an architecture (`ModelArchConfig` has it): the family
    package sits below `mindrl.config`, so it names the shape, not the class."""

    @property
    def add_qkv_bias(self) -> bool: ...

    @property
    def tie_word_embeddings(self) -> bool: ...

    @property
    def q_lora_rank(self) -> int | None: ...

    @property
    def shared_expert_ffn_hidden_size(self) -> int | None: ...

    @property
    def shared_expert_gate(self) -> bool: ...

    @property
    def moe_router_enable_expert_bias(self) -> bool: ...

    def is_moe_layer(self, layer: int) -> bool: ...


@dataclass(frozen=True)
class ParamRule:
    """One megatron-core parameter and the HF tensor(s) it corresponds to.

    `hf_shapes` gives each HF tensor's shape in symbols: hidden, ffn, vocab, q (= heads x
    head_dim), kv (= kv heads x head_dim), head (= head_dim), experts, moe_ffn, shared_ffn,
    one, and MLA's q_lora, kv_lora, kv_down (kv_lora + RoPE dim), q_up (heads x q/k head
    dim), kv_up (heads x (no-RoPE dim + v dim)), v_out (heads x v dim). `when` restricts the
    rule to architectures with qkv_bias / tied / untied embeddings / a q latent (q_lora) or
    none (q_direct) / a shared expert / its gate / an expert bias; `layers` to the dense or the
    MoE layers of a model with both (DeepSeek-V3). `load_only` rules fill a megatron parameter
    that is a copy of another (the tied output layer on the last pipeline stage); exports skip
    them.
    """

    mcore: str
    hf: tuple[str, ...]
    hf_shapes: tuple[tuple[str, ...], ...]
    split: Split
    when: str | None = None
    load_only: bool = False
    layers: str | None = None  # "dense" / "moe": only those layers

    @property
    def per_layer(self) -> bool:
        return "{layer}" in self.mcore

    @property
    def per_expert(self) -> bool:
        return "{expert}" in self.mcore

    def applies_to(self, arch: ArchFeatures) -> bool:
        return {
            None: True,
            "qkv_bias": arch.add_qkv_bias,
            "tied": arch.tie_word_embeddings,
            "untied": not arch.tie_word_embeddings,
            "q_lora": arch.q_lora_rank is not None,
            "q_direct": arch.q_lora_rank is None,
            "shared_expert": arch.shared_expert_ffn_hidden_size is not None,
            "shared_expert_gate": arch.shared_expert_gate,
            "expert_bias": arch.moe_router_enable_expert_bias,
        }[self.when]

    def applies_to_layer(self, arch: ArchFeatures, layer: int) -> bool:
        """Whether global layer `layer` has this rule's parameter (dense vs MoE MLP)."""
        if self.layers is None:
            return True
        return arch.is_moe_layer(layer) == (self.layers == "moe")
