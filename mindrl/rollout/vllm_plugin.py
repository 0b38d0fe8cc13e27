"""vLLM general plugin (entry point `vllm.general_plugins`): registers mindrl's gloo
weight-transfer backend in every vLLM process, so a user's `vllm serve` with
`--weight-transfer-config '{"backend": "mindrl_gloo"}'` can take mindrl's weight pushes, and
installs the CPU MoE reload fix (`vllm_moe_shim`) in every vLLM process (a multi-process
engine's workers too).

Loading the plugin imports nothing heavy: the engine module is named, not imported, and vLLM
loads it when a server asks for that backend.
"""

from __future__ import annotations

BACKEND = "mindrl_gloo"
ENGINE_MODULE = "mindrl.rollout.vllm_gloo_engine"
ENGINE_CLASS = "GlooWeightTransferEngine"


def register() -> None:
    """Idempotent: vLLM may load general plugins several times in one process."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from mindrl.rollout.vllm_moe_shim import apply_vllm_moe_shim

    apply_vllm_moe_shim()
    if BACKEND in WeightTransferEngineFactory._registry:
        return
    WeightTransferEngineFactory.register_engine(BACKEND, ENGINE_MODULE, ENGINE_CLASS)
