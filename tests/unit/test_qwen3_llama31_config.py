"""Qwen3 dense and Llama 3.1 / 3.2 rope scaling at config time: the shipped model files carry
the published architectures, MindSpeed-RL's keys are honoured (qk_layernorm, the llama3 rope
keys), what is not built (YaRN, a Qwen3 without q/k norm) is refused with its reason, and the
HF config.json of both families maps to `ModelArchConfig` and back."""

from __future__ import annotations

import math

import pytest

from mindrl.checkpoint.errors import ConversionError
from mindrl.checkpoint.mapping import Split, bound_rules, expected_hf_tensors
from mindrl.config import ConfigError, load_run_config
from mindrl.config.fields import _Problems, build_dataclass
from mindrl.config.model_arch import ModelArchConfig
from mindrl.config.model_family import infer_family
from mindrl.models.hf_arch import arch_from_hf_config, hf_config_from_arch

BASE = "r1_zero_qwen25_7b"


def _arch(name: str, *extra: str) -> ModelArchConfig:
    """The actor's model when `configs/model/NAME.yaml` is the run's model."""
    overrides = [f"{sec}.model={name}" for sec in ("megatron_training", "actor_config")]
    overrides += [f"{sec}.model={name}" for sec in ("ref_config", "reward_config")]
    for role in ("actor_config", "ref_config"):
        overrides += [
            f"{role}.tensor_model_parallel_size=1",
            f"{role}.pipeline_model_parallel_size=1",
        ]
    overrides += ["generate_config.infer_tensor_parallel_size=1", *extra]
    run, _ = load_run_config(BASE, [f"model={name}", *overrides], check_paths=False)
    return run.actor.model


def _billions(arch: ModelArchConfig) -> float:
    """Parameters of the HF checkpoint (tied embeddings counted once), in billions."""
    return sum(math.prod(shape) for shape in expected_hf_tensors(arch).values()) / 1e9


@pytest.mark.parametrize(
    ("name", "layers", "hidden", "kv", "tied", "billions"),
    [
        ("qwen3_0.6b", 28, 1024, 8, True, 0.60),  # model cards: 0.6B, 8.2B, 32.8B
        ("qwen3_8b", 36, 4096, 8, False, 8.19),
        ("qwen3_32b", 64, 5120, 8, False, 32.76),
    ],
)
def test_qwen3_model_files_are_the_published_architectures(
    name, layers, hidden, kv, tied, billions
):
    arch = _arch(name)
    assert (arch.family, arch.qk_layernorm, arch.add_qkv_bias) == ("qwen3", True, False)
    assert (arch.num_layers, arch.hidden_size, arch.num_kv_heads) == (layers, hidden, kv)
    assert arch.head_dim == 128 and arch.tie_word_embeddings is tied
    assert arch.vocab_size == 151936 and arch.rotary_base == 1e6
    assert _billions(arch) == pytest.approx(billions, abs=0.01)


@pytest.mark.parametrize(
    ("name", "factor", "tied", "billions"),
    [("llama31_8b", 8.0, False, 8.03), ("llama32_1b", 32.0, True, 1.24)],
)
def test_llama3x_model_files_carry_their_rope_scaling(name, factor, tied, billions):
    arch = _arch(name)
    assert arch.family == "llama" and not arch.qk_layernorm
    assert arch.rope_scaling_hf() == {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert arch.tie_word_embeddings is tied
    assert _billions(arch) == pytest.approx(billions, abs=0.01)


# MindSpeed-RL's configs/model/qwen3_8b.yaml keys (no model_type_hf, no kv_channels).
MINDSPEED_QWEN3_8B = {
    "use_mcore_models": True,
    "num_layers": 36,
    "hidden_size": 4096,
    "ffn_hidden_size": 12288,
    "num_attention_heads": 32,
    "rotary_base": 1000000,
    "max_position_embeddings": 40960,
    "make_vocab_size_divisible_by": 1,
    "padded_vocab_size": 151936,
    "untie_embeddings_and_output_weights": True,
    "disable_bias_linear": True,
    "group_query_attention": True,
    "num_query_groups": 8,
    "position_embedding_type": "rope",
    "normalization": "RMSNorm",
    "swiglu": True,
    "attention_bias": False,
    "qk_layernorm": True,
}


def _build(section: dict) -> ModelArchConfig:
    decision = infer_family(section)
    assert decision.supported, decision.describe()
    problems = _Problems()
    arch = build_dataclass(ModelArchConfig, decision.arch_section(section), "model.m", problems)
    assert not problems.items
    return arch


def test_mindspeed_qwen3_yaml_is_qwen3_by_qk_layernorm():
    decision = infer_family(MINDSPEED_QWEN3_8B)
    assert decision.describe() == "model family qwen3 (from model yaml qk_layernorm: true)"
    arch = _build(MINDSPEED_QWEN3_8B)
    assert (arch.model_type_hf, arch.qk_layernorm, arch.add_qkv_bias) == ("qwen3", True, False)
    assert arch.head_dim == 128  # hidden / heads, as MindSpeed-RL leaves kv_channels unset


def test_qwen3_config_json_overrides_a_yaml_without_qk_layernorm(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3"}')
    section = {**MINDSPEED_QWEN3_8B, "qk_layernorm": False}
    decision = infer_family(section, [tmp_path])
    assert decision.family == "qwen3" and decision.arch_section(section)["qk_layernorm"] is True
    assert "qk_layernorm: false overridden" in decision.describe()


@pytest.mark.parametrize(
    "change",
    [
        {"model_type_hf": "qwen3", "qk_layernorm": False},
        {"model_type_hf": "qwen3", "add_qkv_bias": True},
    ],
)
def test_a_qwen3_yaml_that_contradicts_qwen3_is_refused(change):
    section = {k: v for k, v in MINDSPEED_QWEN3_8B.items() if k != "qk_layernorm"}
    decision = infer_family({**section, **change})
    assert not decision.supported
    assert "Qwen3 has q/k layernorm and no q/k/v biases" in decision.describe()


LLAMA3_KEYS = [
    "++actor_config.rope_scaling_type=llama3",
    "++actor_config.rope_scaling_factor=8.0",
    "++actor_config.low_freq_factor=1.0",
    "++actor_config.high_freq_factor=4.0",
    "++actor_config.original_max_position_embeddings=8192",
]


def test_mindspeed_llama3_rope_keys_are_honoured():
    run, _ = load_run_config(BASE, LLAMA3_KEYS, check_paths=False)
    assert run.actor.model.rope_scaling_hf()["factor"] == 8.0
    assert run.ref.model.rope_scaling_type is None  # set on the actor only


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (LLAMA3_KEYS[:2], "low_freq_factor: required with rope_scaling_type llama3"),
        (LLAMA3_KEYS[1:2], "rope_scaling_factor: set without rope_scaling_type"),
        (LLAMA3_KEYS[:3] + ["++actor_config.high_freq_factor=1.0"] + LLAMA3_KEYS[4:],
         "high_freq_factor: 1.0 must exceed low_freq_factor"),
        (["++actor_config.rope_scaling_type=yarn"], "yarn is built with multi_latent_attention"),
        (["++actor_config.rope_scaling_type=linear"], "RoPE scaling other than llama3 and yarn"),
        (["++actor_config.beta_fast=16"], "beta_fast: set without rope_scaling_type: yarn"),
    ],
)  # fmt: skip
def test_incomplete_or_unbuilt_rope_scaling_is_refused(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_run_config(BASE, overrides, check_paths=False)


QWEN3_HF = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "use_sliding_window": False,
}
LLAMA31_HF = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}


def test_qwen3_hf_config_maps_to_qk_layernorm_and_back():
    arch = arch_from_hf_config(QWEN3_HF)
    assert (arch.family, arch.qk_layernorm, arch.add_qkv_bias, arch.head_dim) == (
        "qwen3",
        True,
        False,
        128,
    )
    assert arch_from_hf_config(QWEN3_HF, model_type_hf="qwen3") == arch
    back = hf_config_from_arch(arch)
    assert back["architectures"] == ["Qwen3ForCausalLM"] and back["model_type"] == "qwen3"
    assert arch_from_hf_config(back) == arch


def test_llama31_hf_config_round_trips_its_rope_scaling():
    arch = arch_from_hf_config(LLAMA31_HF, model_type_hf="llama3")
    assert arch.rope_scaling_hf() == {**LLAMA31_HF["rope_scaling"]}
    back = hf_config_from_arch(arch)  # transformers 5 writes rope_parameters
    assert back["rope_parameters"] == {**LLAMA31_HF["rope_scaling"], "rope_theta": 500000.0}
    assert arch_from_hf_config(back, model_type_hf="llama3") == arch


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({**QWEN3_HF, "attention_bias": True}, "attention_bias=true"),
        ({**QWEN3_HF, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'yarn'"),
        ({**LLAMA31_HF, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
        ({**QWEN3_HF, "model_type": "mixtral"}, "mixtral"),
        ({**QWEN3_HF, "model_type": "deepseek_v2"}, "multi-latent attention"),
    ],
)
def test_what_is_not_built_is_refused_by_name(config, needle):
    with pytest.raises(ConversionError, match=needle):
        arch_from_hf_config(config)


def test_qwen3_table_adds_replicated_per_head_norms():
    arch = arch_from_hf_config({**QWEN3_HF, "num_hidden_layers": 1})
    norms = {
        b.mcore: (b.hf, b.hf_shapes, b.split) for b in bound_rules(arch) if "layernorm" in b.mcore
    }
    assert norms["decoder.layers.0.self_attention.q_layernorm.weight"] == (
        ("model.layers.0.self_attn.q_norm.weight",),
        ((128,),),
        Split.REPLICATED,
    )
    assert norms["decoder.layers.0.self_attention.k_layernorm.weight"] == (
        ("model.layers.0.self_attn.k_norm.weight",),
        ((128,),),
        Split.REPLICATED,
    )
    llama = arch_from_hf_config({**LLAMA31_HF, "num_hidden_layers": 1})
    assert not any("k_layernorm" in b.mcore for b in bound_rules(llama))
    with pytest.raises(ConversionError, match="q/k layernorm is Qwen3's"):
        bound_rules(ModelArchConfig(**{**arch.__dict__, "model_type_hf": "llama"}))
