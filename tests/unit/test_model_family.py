"""Model family inference at config time: config.json first, then the model yaml's keys.

The yaml sections below carry the keys and values of MindSpeed-RL's configs/model/*.yaml (no
`model_type_hf`), written out here so the tests need no MindSpeed-RL files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mindrl.config.fields import _Problems, build_dataclass
from mindrl.config.model_arch import ModelArchConfig
from mindrl.config.model_family import FamilyDecision, infer_family

DENSE = {
    "use_mcore_models": True,
    "num_layers": 28,
    "hidden_size": 3584,
    "ffn_hidden_size": 18944,
    "num_attention_heads": 28,
    "rotary_base": 1000000,
    "max_position_embeddings": 32768,
    "make_vocab_size_divisible_by": 1,
    "padded_vocab_size": 152064,
    "untie_embeddings_and_output_weights": True,
    "disable_bias_linear": True,
    "group_query_attention": True,
    "num_query_groups": 4,
    "position_embedding_type": "rope",
    "norm_epsilon": 1e-6,
    "normalization": "RMSNorm",
    "swiglu": True,
}
QWEN25_7B = {**DENSE, "add_qkv_bias": True}
QWEN3_8B = {**DENSE, "attention_bias": False, "qk_layernorm": True, "kv_channels": 128}
QWEN3_30B_A3B = {
    **QWEN3_8B,
    "num_experts": 128,
    "moe_router_topk": 8,
    "moe_router_load_balancing_type": "aux_loss",
    "moe_ffn_hidden_size": 768,
    "moe_grouped_gemm": True,
}
QWEN3_235B = {
    **QWEN3_30B_A3B,
    "spec": ["mindspeed_llm.tasks.models.spec.qwen3_spec", "layer_spec"],
}
DEEPSEEK_V3 = {
    **DENSE,
    "spec": ["mindspeed_llm.tasks.models.spec.deepseek_spec", "layer_spec"],
    "num_experts": 256,
    "multi_latent_attention": True,
    "q_lora_rank": 1536,
    "qk_layernorm": True,
    "moe_router_topk": 8,
}
QWEN2_CONFIG = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}


def _hf_dir(root: Path, name: str, config: dict[str, Any]) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _one_line(decision: FamilyDecision) -> str:
    line = decision.describe()
    assert "\n" not in line and line.strip() == line
    return line


def test_qwen25_yaml_is_qwen2_by_add_qkv_bias():
    d = infer_family(QWEN25_7B)
    assert (d.family, d.model_type_hf, d.add_qkv_bias, d.refusal) == ("qwen2", "qwen2", True, None)
    assert _one_line(d) == "model family qwen2 (from model yaml add_qkv_bias: true)"


def test_qwen3_moe_yaml_is_qwen3_moe_by_its_expert_keys_and_qk_layernorm(tmp_path):
    for decision in (
        infer_family(QWEN3_30B_A3B),
        infer_family(QWEN3_30B_A3B, [_hf_dir(tmp_path, "m", {"model_type": "qwen3_moe"})]),
    ):
        assert (decision.family, decision.model_type_hf, decision.supported) == (
            "qwen3_moe",
            "qwen3_moe",
            True,
        )
        section = decision.arch_section(QWEN3_30B_A3B)
        assert section["qk_layernorm"] and section["num_experts"] == 128
    # dense Qwen3 weights under a MoE model file: the folder and the keys disagree
    dense = _hf_dir(tmp_path, "d", {"model_type": "qwen3"})
    assert "is qwen3_moe" in _one_line(infer_family(QWEN3_30B_A3B, [dense]))


def test_plain_yaml_defaults_to_llama():
    d = infer_family(DENSE)
    assert (d.family, d.add_qkv_bias, d.supported) == ("llama", False, True)
    assert "default" in d.source


@pytest.mark.parametrize(
    ("section", "family", "needle"),
    [
        ({**QWEN3_30B_A3B, "qk_layernorm": False}, "moe", "model family moe (mixture of experts)"),
        ({**DENSE, "mm_model": "qwen2vl.json"}, "multimodal", "multimodal (vision encoder)"),
        (
            {**DENSE, "spec": ["x.qwen3_spec", "layer_spec"]},
            "custom",
            "spec: x.qwen3_spec layer_spec",
        ),
        ({**DENSE, "spec": "my.module:layer_spec"}, "custom", "custom layer spec"),
        ({**DENSE, "attention_bias": True}, "attention_bias", "attention_bias: true"),
        ({**DENSE, "model_type_hf": "gpt9"}, "gpt9", "'gpt9' is not a model family"),
    ],
)
def test_families_mindrl_cannot_build_are_refused_by_name(section, family, needle):
    d = infer_family(section)
    assert d.family == family and not d.supported
    assert needle in _one_line(d)
    with pytest.raises(ValueError, match="not"):
        d.arch_section(section)


def test_llama_with_qkv_bias_is_resolved_to_qwen2():
    d = infer_family({**QWEN25_7B, "model_type_hf": "llama"})
    assert (d.family, d.model_type_hf, d.add_qkv_bias) == ("qwen2", "qwen2", True)
    assert _one_line(d) == (
        "model family qwen2 (from model yaml model_type_hf: llama, add_qkv_bias: true); "
        "model_type_hf: llama with add_qkv_bias: true is qwen2 (Llama with q/k/v biases)"
    )


def test_qwen2_without_qkv_bias_is_refused():
    d = infer_family({**DENSE, "model_type_hf": "qwen2", "add_qkv_bias": False})
    assert "Qwen2 has q/k/v biases" in _one_line(d) and not d.supported


def test_qwen2_variant_is_kept_and_gets_its_bias():
    d = infer_family({**DENSE, "model_type_hf": "qwen25"})
    assert (d.family, d.model_type_hf, d.add_qkv_bias, d.notices) == ("qwen2", "qwen25", True, ())


def test_config_json_decides_and_overrides_the_yaml(tmp_path):
    hf = _hf_dir(tmp_path, "qwen", QWEN2_CONFIG)
    d = infer_family({**DENSE, "model_type_hf": "llama2", "add_qkv_bias": False}, [hf])
    assert (d.family, d.model_type_hf, d.add_qkv_bias) == ("qwen2", "qwen2", True)
    assert d.source == f"{hf / 'config.json'} (model_type qwen2, Qwen2ForCausalLM)"
    line = _one_line(d)
    assert "model_type_hf: llama2 overridden" in line
    assert "add_qkv_bias: false overridden" in line and "(with q/k/v biases)" in line


def test_config_json_llama_overrides_qwen25_yaml(tmp_path):
    hf = _hf_dir(tmp_path, "llama", {"model_type": "llama"})
    d = infer_family(QWEN25_7B, [None, "Qwen/Qwen2.5-7B", tmp_path / "missing", hf])
    assert (d.family, d.model_type_hf, d.add_qkv_bias) == ("llama", "llama", False)
    assert d.notices and "add_qkv_bias: true overridden" in d.notices[0]


def test_config_json_without_model_type_uses_architectures(tmp_path):
    hf = _hf_dir(tmp_path, "q", {"architectures": ["Qwen2ForCausalLM"]})
    assert infer_family(DENSE, [hf]).family == "qwen2"


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"model_type": "mixtral"}, "model family mixtral (mixture of experts"),
        ({"model_type": "deepseek_v2"}, "model family deepseek_v2 (multi-latent attention"),
        (
            {"model_type": "qwen2_5_vl", "vision_config": {}},
            "model family qwen2_5_vl (multimodal: vision encoder)",
        ),
        ({"model_type": "gpt_neox"}, "model family gpt_neox (no mapping table)"),
        ({"hidden_size": 8}, "config.json names no model_type"),
    ],
)
def test_config_json_of_an_unbuilt_family_is_refused(tmp_path, config, needle):
    hf = _hf_dir(tmp_path, "m", config)
    d = infer_family(QWEN25_7B, [hf])
    line = _one_line(d)
    assert needle in line and str(hf / "config.json") in line


def test_yaml_feature_contradicting_config_json_is_refused(tmp_path):
    hf = _hf_dir(tmp_path, "qwen", QWEN2_CONFIG)
    line = _one_line(infer_family(QWEN3_8B, [hf]))
    assert line.startswith("model yaml qk_layernorm: true is qwen3")
    assert "is qwen2: fix it" in line


def test_folders_that_disagree_are_refused(tmp_path):
    load = _hf_dir(tmp_path, "llama", {"model_type": "llama"})
    tok = _hf_dir(tmp_path, "qwen", QWEN2_CONFIG)
    line = _one_line(infer_family(DENSE, [load, tok]))
    assert "is llama but" in line and "is qwen2" in line


def test_unreadable_config_json_is_one_line(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json\n")
    line = _one_line(infer_family(DENSE, [bad]))
    assert line.startswith(f"model family: {bad / 'config.json'} is not readable JSON")


def _mindrl_checkpoint(root: Path, meta: dict[str, Any], hf_config: dict | None = None) -> Path:
    release = root / "release"
    release.mkdir(parents=True)
    (root / "latest_checkpointed_iteration.txt").write_text("release\n")
    (release / "mindrl_checkpoint.json").write_text(json.dumps(meta))
    if hf_config is not None:
        (release / "hf_assets").mkdir()
        (release / "hf_assets" / "config.json").write_text(json.dumps(hf_config))
    return root


def test_mindrl_megatron_checkpoint_record(tmp_path):
    by_arch = _mindrl_checkpoint(tmp_path / "a", {"arch": {"model_type_hf": "qwen25"}})
    d = infer_family(DENSE, [by_arch])
    assert (d.family, d.add_qkv_bias) == ("qwen2", True) and "model_type_hf qwen25" in d.source
    by_assets = _mindrl_checkpoint(tmp_path / "b", {"arch": {}}, {"model_type": "llama"})
    assert infer_family(QWEN25_7B, [by_assets]).family == "llama"
    iter_dir = _mindrl_checkpoint(tmp_path / "c", {"hf_config": QWEN2_CONFIG}) / "release"
    assert infer_family(DENSE, [iter_dir]).family == "qwen2"


def test_layout_names_match_the_checkpoint_package():
    from mindrl.checkpoint import mcore_io
    from mindrl.config import model_family

    assert model_family.TRACKER_FILE == mcore_io.TRACKER_FILE
    assert model_family.META_FILE == mcore_io.META_FILE
    assert model_family.HF_ASSETS_DIR == mcore_io.HF_ASSETS_DIR


def test_off_family_keys_are_consumed_and_the_arch_builds():
    section = {
        **DENSE,
        "qk_layernorm": False,
        "attention_bias": False,
        "num_experts": None,
        "moe_grouped_gemm": False,
        "multi_latent_attention": False,
        "add_qkv_bias": True,
    }
    d = infer_family(section)
    assert d.family == "qwen2"
    assert set(d.consumed_keys) == {
        "qk_layernorm",
        "attention_bias",
        "num_experts",
        "moe_grouped_gemm",
        "multi_latent_attention",
    }
    problems = _Problems()
    arch = build_dataclass(ModelArchConfig, d.arch_section(section), "model.m", problems)
    assert not problems.items
    assert (arch.family, arch.add_qkv_bias, arch.vocab_size) == ("qwen2", True, 152064)


def test_real_tiny_checkpoints(tiny_model_dir, tiny_llama_dir):
    qwen = infer_family(DENSE, [tiny_model_dir])
    assert (qwen.family, qwen.add_qkv_bias, qwen.notices) == ("qwen2", True, ())
    llama = infer_family({**DENSE, "model_type_hf": "llama3"}, [tiny_llama_dir])
    assert (llama.family, llama.model_type_hf, llama.add_qkv_bias) == ("llama", "llama3", False)


def test_inference_imports_no_torch():
    code = (
        "import sys, mindrl.config.model_family, mindrl.models.hf_arch; "
        "print(sorted(m for m in ('torch', 'transformers', 'megatron') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-1000:]
    assert out.stdout.strip() == "[]"


QWEN3_SPEC = ["mindspeed_llm.tasks.models.spec.qwen3_spec", "layer_spec"]


@pytest.mark.parametrize(
    ("section", "family", "display"),
    [
        ({**DENSE, "spec": QWEN3_SPEC}, "qwen3", "Qwen3"),
        ({**DENSE, "spec": QWEN3_SPEC, "qk_layernorm": True}, "qwen3", "Qwen3"),
        (QWEN3_235B, "qwen3_moe", "Qwen3-MoE"),
    ],
)
def test_a_mindspeed_llm_layer_spec_maps_to_the_family_builder(section, family, display):
    d = infer_family(section)
    assert d.supported and d.family == family
    assert "spec" in d.consumed_keys and "spec" not in d.arch_section(section)
    assert f"spec {' '.join(QWEN3_SPEC)}: built by mindrl's {display} builder" in d.describe()


def test_a_layer_spec_of_another_family_or_an_unknown_one_is_refused_by_name(tmp_path):
    qwen2 = _hf_dir(tmp_path, "qwen2", QWEN2_CONFIG)
    d = infer_family({**QWEN25_7B, "spec": QWEN3_SPEC}, [qwen2])
    assert not d.supported and "qwen3_spec layer_spec is qwen3" in _one_line(d)
    assert "is qwen2: fix it" in _one_line(d)
    unknown = ["mindspeed_llm.tasks.models.spec.minicpm_spec", "layer_spec"]
    d = infer_family({**DENSE, "spec": unknown})
    assert not d.supported and "spec: mindspeed_llm.tasks.models.spec.minicpm_spec" in _one_line(d)
    assert "qwen3_spec" in _one_line(d)  # names the ones mindrl knows
    d = infer_family(DEEPSEEK_V3)  # deepseek_spec + multi_latent_attention: DeepSeek-V3, built
    assert d.supported and d.family == "deepseek_v3" and "spec" in d.consumed_keys


@pytest.mark.parametrize(
    ("section", "family"),
    [(DEEPSEEK_V3, "deepseek_v3"), ({**QWEN25_7B, "num_experts": 60}, "qwen2_moe")],
)
def test_deepseek_and_qwen2_moe_yamls_are_built(section, family):
    """MLA (or deepseek_spec) marks DeepSeek-V3; MoE keys with q/k/v biases mark Qwen2-MoE."""
    d = infer_family(section)
    assert d.supported and d.family == family and d.model_type_hf == family
    assert d.arch_section(section)["model_type_hf"] == family
