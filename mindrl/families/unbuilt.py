"""Families mindrl knows by name but does not build: each is refused with what it lacks (at
config time and by the converter), never half-built."""

from __future__ import annotations

from mindrl.families.spec import Features, UnbuiltFamily

MOE_REASON = "mixture of experts"
MLA_MOE_REASON = "multi-latent attention, mixture of experts"

UNBUILT: tuple[UnbuiltFamily, ...] = (
    # a MindSpeed yaml with MoE keys but neither q/k norm nor q/k/v biases
    UnbuiltFamily("moe", MOE_REASON, Features(moe=True)),
    UnbuiltFamily(
        "mixtral",
        MOE_REASON,
        Features(moe=True),
        spellings=("mixtral",),
        hf_architectures=("MixtralForCausalLM",),
    ),
    UnbuiltFamily(
        "deepseek_v2",
        MLA_MOE_REASON,
        Features(moe=True, mla=True),
        spellings=("deepseek_v2", "deepseek2"),
        hf_architectures=("DeepseekV2ForCausalLM",),
    ),
    UnbuiltFamily(
        "multimodal",
        "vision encoder",
        Features(vision=True),
        spellings=("qwen2_vl", "qwen2vl", "qwen25_vl", "qwen2_5_vl", "qwen25vl"),
        yaml_marker="mm_model",
    ),
)
