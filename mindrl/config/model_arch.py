"""Model architecture: what `configs/model/*.yaml` describes (MindSpeed-RL key names)."""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.fates import no_effect, refused
from mindrl.config.fields import spec

HF_FAMILIES = {
    "llama": "llama",
    "llama2": "llama",
    "llama3": "llama",
    "qwen2": "qwen2",
    "qwen25": "qwen2",
}


@dataclass(frozen=True)
class ModelArchConfig:
    """A decoder-only transformer (Llama / Qwen2 family) as megatron-core builds it."""

    num_layers: int = spec(help="transformer layers", ge=1)
    hidden_size: int = spec(ge=1)
    ffn_hidden_size: int = spec(ge=1)
    num_attention_heads: int = spec(ge=1)
    vocab_size: int = spec(
        ge=1,
        help="rows of the HF embedding (MindSpeed calls it padded_vocab_size); mindrl pads it "
        "further to a multiple of make_vocab_size_divisible_by x TP inside megatron",
        aliases=("padded_vocab_size",),
    )
    max_position_embeddings: int = spec(ge=1)
    name: str = spec(
        "",
        help="set from the model file's top-level key",
        fate=no_effect("a label: mindrl names the model by its model file's top-level key"),
    )
    model_type_hf: str = spec(
        "llama",
        choices=tuple(HF_FAMILIES),
        help="HF architecture variant; MindSpeed-RL yamls have none: config-time inference "
        "(mindrl.config.model_family.infer_family) sets it from config.json or the keys",
    )
    group_query_attention: bool = False
    num_query_groups: int | None = spec(None, ge=1, help="kv heads when group_query_attention")
    kv_channels: int | None = spec(None, ge=1, help="head dim; default hidden / heads")
    make_vocab_size_divisible_by: int = spec(1, ge=1)
    rotary_base: float = spec(10000.0, gt=0)
    norm_epsilon: float = spec(1e-6, gt=0)
    add_qkv_bias: bool = False
    disable_bias_linear: bool = True
    untie_embeddings_and_output_weights: bool = True
    position_embedding_type: str = spec(
        "rope",
        fate=refused("only rotary position embeddings (rope) are built", allowed=("rope",)),
    )
    normalization: str = spec(
        "RMSNorm", fate=refused("only RMSNorm is built (LayerNorm: not yet)", allowed=("RMSNorm",))
    )
    swiglu: bool = True
    use_mcore_models: bool = spec(
        True,
        fate=refused(
            "megatron's legacy (non-mcore) models: not built; mindrl builds megatron-core models",
            allowed=(True,),
        ),
    )
    attention_dropout: float = spec(0.0, ge=0, lt=1)
    hidden_dropout: float = spec(0.0, ge=0, lt=1)
    init_method_std: float = spec(0.02, gt=0)

    @property
    def family(self) -> str:
        """Checkpoint mapping family: 'llama' or 'qwen2'."""
        return HF_FAMILIES[self.model_type_hf]

    @property
    def num_kv_heads(self) -> int:
        if self.group_query_attention and self.num_query_groups:
            return self.num_query_groups
        return self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def tie_word_embeddings(self) -> bool:
        return not self.untie_embeddings_and_output_weights

    def padded_vocab_size(self, tensor_parallel_size: int) -> int:
        """Embedding rows inside megatron: vocab padded to a multiple of divisor x TP."""
        multiple = self.make_vocab_size_divisible_by * tensor_parallel_size
        return -(-self.vocab_size // multiple) * multiple
