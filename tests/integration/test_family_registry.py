"""A model family defined here, outside mindrl, joins through `register_family` and works end to
end with no change to mindrl/: Mistral (transformers' `MistralForCausalLM`, a Llama-like layout
no mindrl family covers). Its tiny random HF model (built by mindrl's assets with transformers)
goes HF -> megatron-core (TP=2, PP=2) -> HF bit for bit; the megatron model built from its
`ModelArchConfig` loads the TP=2 checkpoint and the HF folder (online) and gives HF's logits;
config-time inference and `model_type_hf` know it; unregistered, it is refused again."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from mindrl.families import (
    FamilyConfigError,
    FamilySpec,
    ParamRule,
    Split,
    register_family,
    unregister_family,
)

RANKS = Path(__file__).with_name("_family_registry_ranks.py")
HF = "model.layers.{layer}."
MC = "decoder.layers.{layer}."

# Mistral's HF tensors -> megatron-core's GPT layer spec, written out as a user would.
MISTRAL_RULES: tuple[ParamRule, ...] = (
    ParamRule(
        "embedding.word_embeddings.weight",
        ("model.embed_tokens.weight",),
        (("vocab", "hidden"),),
        Split.VOCAB,
    ),
    ParamRule(
        MC + "input_layernorm.weight", (HF + "input_layernorm.weight",), (("hidden",),),
        Split.REPLICATED,
    ),
    ParamRule(
        MC + "self_attention.linear_qkv.weight",
        tuple(HF + f"self_attn.{p}_proj.weight" for p in "qkv"),
        (("q", "hidden"), ("kv", "hidden"), ("kv", "hidden")),
        Split.QKV,
    ),
    ParamRule(
        MC + "self_attention.linear_proj.weight", (HF + "self_attn.o_proj.weight",),
        (("hidden", "q"),), Split.ROW,
    ),
    ParamRule(
        MC + "pre_mlp_layernorm.weight", (HF + "post_attention_layernorm.weight",),
        (("hidden",),), Split.REPLICATED,
    ),
    ParamRule(
        MC + "mlp.linear_fc1.weight", (HF + "mlp.gate_proj.weight", HF + "mlp.up_proj.weight"),
        (("ffn", "hidden"), ("ffn", "hidden")), Split.GATE_UP,
    ),
    ParamRule(
        MC + "mlp.linear_fc2.weight", (HF + "mlp.down_proj.weight",), (("hidden", "ffn"),),
        Split.ROW,
    ),
    ParamRule(
        "decoder.final_layernorm.weight", ("model.norm.weight",), (("hidden",),),
        Split.REPLICATED,
    ),
    ParamRule(
        "output_layer.weight", ("lm_head.weight",), (("vocab", "hidden"),), Split.VOCAB,
        when="untied",
    ),
    ParamRule(
        "output_layer.weight", ("model.embed_tokens.weight",), (("vocab", "hidden"),),
        Split.VOCAB, when="tied", load_only=True,
    ),
)  # fmt: skip


def _full_attention_only(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """megatron's GPT layer spec attends to the whole context: a sliding window shorter than
    it would change the model, so it is refused."""
    window = cfg.get("sliding_window")
    if window is not None and window < int(cfg.get("max_position_embeddings") or 0):
        raise FamilyConfigError(f"HF config sliding_window={window} is not supported")
    return {}


MISTRAL = FamilySpec(
    name="mistral",
    display_name="Mistral",
    hf_architecture="MistralForCausalLM",
    hf_config_class="MistralConfig",
    rules=MISTRAL_RULES,
    arch_fields_from_hf=_full_attention_only,
    hf_fields_from_arch=lambda arch: {"sliding_window": None},
    tiny_hf_fields={"sliding_window": None},
)


@pytest.fixture(scope="module")
def mistral() -> Iterator[FamilySpec]:
    register_family(MISTRAL)
    yield MISTRAL
    unregister_family(MISTRAL.name)


@pytest.fixture(scope="module")
def mistral_dirs(mistral, tmp_path_factory) -> dict[str, Path]:
    """The tiny Mistral HF folder (untied embeddings), converted once to TP=2 x PP=2."""
    from mindrl.assets.models import build_tiny_model
    from mindrl.checkpoint.offline import convert_hf_to_mcore

    root = tmp_path_factory.mktemp("mistral")
    src = build_tiny_model(root / "hf_src", family=mistral.name, tie_word_embeddings=False)
    convert_hf_to_mcore(
        src, root / "mg", target_tensor_parallel_size=2, target_pipeline_parallel_size=2
    )
    return {"src": src, "mg": root / "mg", "root": root}


def test_the_tiny_model_is_a_transformers_mistral(mistral_dirs):
    config = json.loads((mistral_dirs["src"] / "config.json").read_text())
    assert config["model_type"] == "mistral"
    assert config["architectures"] == ["MistralForCausalLM"]


def test_hf_mcore_hf_at_tp2_is_bit_exact(mistral_dirs, tmp_path):
    from mindrl.checkpoint.mcore_io import read_checkpoint_info
    from mindrl.checkpoint.offline import convert_mcore_to_hf
    from tests.integration.test_convert_roundtrip import assert_bit_exact

    info = read_checkpoint_info(mistral_dirs["mg"])
    assert (info.tensor_parallel_size, info.pipeline_parallel_size) == (2, 2)
    assert (info.arch.family, info.arch.model_type_hf) == ("mistral", "mistral")
    convert_mcore_to_hf(mistral_dirs["mg"], tmp_path / "hf")
    assert_bit_exact(mistral_dirs["src"], tmp_path / "hf")
    out = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert out == json.loads((mistral_dirs["src"] / "config.json").read_text())


def test_the_export_config_is_the_familys_hf_class(mistral_dirs):
    from mindrl.models.hf_arch import arch_from_hf_config, hf_config_from_arch

    arch = arch_from_hf_config(mistral_dirs["src"])
    config = hf_config_from_arch(arch)
    assert (config["model_type"], config["architectures"]) == ("mistral", ["MistralForCausalLM"])
    assert config["sliding_window"] is None
    assert arch_from_hf_config(config) == arch


def test_megatron_model_from_it_matches_hf(mistral_dirs):
    """The megatron model built from the family's arch: loaded from the TP=2 x PP=2 checkpoint
    and online from the HF folder, its logits are HF's."""
    from mindrl.checkpoint.mcore_io import load_mcore_checkpoint
    from mindrl.checkpoint.online import load_hf_into_mcore
    from mindrl.models.forward_pass import forward_only
    from mindrl.models.gpt import build_gpt_model
    from mindrl.models.hf_arch import arch_from_hf_config
    from mindrl.models.parallel import destroy_parallel, init_parallel
    from tests.integration.test_mcore_parity import LOGITS_TOL, hf_reference, token_ids

    src = mistral_dirs["src"]
    arch = arch_from_hf_config(src)
    ids = token_ids(arch.vocab_size)
    ref, _ = hf_reference(src, ids)
    init_parallel(1, 1, accelerator="cpu", seed=0)
    try:
        for source in ("checkpoint", "online"):
            model = build_gpt_model(arch).eval()
            if source == "checkpoint":
                load_mcore_checkpoint([model], mistral_dirs["mg"], arch=arch)
            else:
                load_hf_into_mcore([model], src)
            logits = forward_only([model], ids, vocab_size=arch.vocab_size, output="logits")
            assert (logits - ref).abs().max().item() <= LOGITS_TOL, source
    finally:
        destroy_parallel()


def test_tp2_ranks_load_online_and_from_the_checkpoint_and_export_bit_exact(mistral_dirs):
    """Two gloo ranks at TP=2, each registering the family (`_family_registry_ranks.py`): the
    online load (the weight sync's direction from HF) and the TP=2 x PP=2 checkpoint give HF's
    logits, and the online export (the weight sync's direction to the engine) is bit-exact."""
    from tests.fresh_process import run_json_ranks
    from tests.integration.test_convert_roundtrip import assert_bit_exact
    from tests.integration.test_mcore_parity import (
        LOGITS_TOL,
        RANK_ENV,
        TIMEOUT_S,
        hf_reference,
        token_ids,
    )

    root, src, mg = mistral_dirs["root"], mistral_dirs["src"], mistral_dirs["mg"]
    ids = token_ids(448)
    torch.save(ids, root / "ids.pt")
    forward = {"op": "forward", "ids": str(root / "ids.pt"), "output": "logits", "mbs": 1}
    steps = [
        {"op": "build", "arch_hf": str(src)},
        {"op": "load_hf", "dir": str(src)},
        {**forward, "out": str(root / "online.pt")},
        {"op": "export_hf", "dir": str(root / "export"), "assets": str(src)},
        {"op": "load_mcore", "dir": str(mg)},
        {**forward, "out": str(root / "checkpoint.pt")},
    ]
    ranks = run_json_ranks(
        RANKS,
        {"tp": 2, "pp": 1, "steps": steps},
        world_size=2,
        timeout_s=TIMEOUT_S,
        workdir=root / "ranks",
        env=RANK_ENV,
    )
    assert [r["ops"] for r in ranks] == [[s["op"] for s in steps]] * 2
    ref, _ = hf_reference(src, ids)
    for source in ("online", "checkpoint"):
        diff = (torch.load(root / f"{source}.pt") - ref).abs().max().item()
        assert diff <= LOGITS_TOL, (source, diff)
    assert_bit_exact(src, root / "export")


def test_config_time_inference_and_model_type_hf_know_it(mistral_dirs):
    from mindrl.config.model_arch import ModelArchConfig
    from mindrl.config.model_family import infer_family

    section = {"num_layers": 2, "hidden_size": 128, "model_type_hf": "llama"}
    decision = infer_family(section, [mistral_dirs["src"]])
    assert (decision.family, decision.model_type_hf, decision.supported) == (
        "mistral",
        "mistral",
        True,
    )
    assert "model_type_hf: llama overridden" in decision.describe()
    arch = ModelArchConfig(
        num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=2,
        vocab_size=64, max_position_embeddings=64, model_type_hf="mistral",
    )  # fmt: skip
    assert arch.family == "mistral" and not arch.qk_layernorm


def test_a_sliding_window_is_refused_by_the_familys_own_check(mistral_dirs):
    from mindrl.checkpoint.errors import ConversionError
    from mindrl.models.hf_arch import arch_from_hf_config, read_hf_config

    config = {**read_hf_config(mistral_dirs["src"]), "sliding_window": 64}
    with pytest.raises(ConversionError, match="sliding_window=64 is not supported"):
        arch_from_hf_config(config)


def test_names_are_defined_once(mistral):
    with pytest.raises(ValueError, match="already name"):
        register_family(MISTRAL)


def test_unregistered_it_is_unknown_again(mistral_dirs):
    from mindrl.checkpoint.errors import ConversionError
    from mindrl.models.hf_arch import arch_from_hf_config

    unregister_family(MISTRAL.name)
    try:
        with pytest.raises(ConversionError, match="unknown architecture: HF model_type='mistral'"):
            arch_from_hf_config(mistral_dirs["src"])
    finally:
        register_family(MISTRAL)
