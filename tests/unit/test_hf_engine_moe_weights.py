"""The HF rollout engine takes Qwen3-MoE weights as checkpoints (and mindrl's weight stream)
name them, one tensor per expert projection, into transformers' fused expert tensors: after
zeroing every weight, streaming the checkpoint's tensors back restores the model bit for bit,
and a name that fits nothing is refused before anything is copied."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from mindrl.assets import models
from mindrl.rollout import is_moe_checkpoint
from mindrl.rollout.hf_engine import HFRolloutEngine


def test_per_expert_tensors_fill_the_fused_experts():
    src = models.tiny_qwen3_moe_dir()
    assert is_moe_checkpoint(src) and not is_moe_checkpoint(models.tiny_qwen3_dir())
    engine = HFRolloutEngine(src, device="cpu")
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in before)  # fused in transformers
    with torch.no_grad():
        for p in engine.model.parameters():
            p.zero_()
    tensors = load_file(str(src / "model.safetensors"))
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in tensors
    engine.update_weights(tensors.items())
    after = engine.model.state_dict()
    for name, value in before.items():
        assert torch.equal(after[name], value), name
    with pytest.raises(KeyError, match="experts.8.gate_proj"):
        engine.update_weights(
            [("model.layers.0.mlp.experts.8.gate_proj.weight", torch.ones(64, 128))]
        )
    with pytest.raises(ValueError, match="expects"):
        engine.update_weights(
            [("model.layers.0.mlp.experts.1.down_proj.weight", torch.ones(64, 128))]
        )


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen2_moe"])
def test_deepseek_and_qwen2_moe_weights_stream_into_the_hf_engine(family, tmp_path):
    """The HF engine is these families' rollout on CPU (the vLLM MoE sync is not built): the
    checkpoint's tensors (shared experts, Qwen2-MoE's gate, DeepSeek's MLA latents, dense first
    layer and expert-bias buffer) restore a zeroed model bit for bit."""
    from tests.integration.tiny_moe_families import build_tiny_hf

    src = build_tiny_hf(tmp_path / family, family)
    assert is_moe_checkpoint(src)
    engine = HFRolloutEngine(src, device="cpu")
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    with torch.no_grad():
        for tensor in engine.model.state_dict().values():
            tensor.zero_()
    tensors = load_file(str(src / "model.safetensors"))
    engine.update_weights(tensors.items())
    after = engine.model.state_dict()
    for name, value in before.items():
        assert torch.equal(after[name], value), name
