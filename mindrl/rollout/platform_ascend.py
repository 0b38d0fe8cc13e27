"""vllm-ascend's adapter: the weight update per vllm-ascend release, FRACTAL_NZ off, and the
memory accounting of releases before 0.15 (tags of vllm-project/vllm-ascend).

No vllm or torch import at module level: `environment` runs before vLLM exists.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mindrl.rollout.platform_base import EnginePlatform

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

# vllm-ascend releases where behaviour changes (tags of vllm-project/vllm-ascend)
ASCEND_RELOAD_RPC = "0.24.0rc1"  # NPUWorker.reload_weights
ASCEND_LAYERWISE = "0.22.1rc1"  # NPUWorker.start_weight_update over vLLM's layerwise reload
ASCEND_FREE_CHECK = "0.15.0rc1"  # NPUWorker._init_device checks free >= share x total


class AscendPlatform(EnginePlatform):
    """vllm-ascend; `version` selects the weight-update path (installed version if None)."""

    name = "npu"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"

    def __init__(self, version: str | None = None) -> None:
        from importlib import metadata

        from packaging.version import InvalidVersion, Version

        try:  # the distribution's version: vllm_ascend is not imported here
            self.version: str | None = version or metadata.version("vllm-ascend")
            parsed: Version | None = Version(self.version)
        except (metadata.PackageNotFoundError, InvalidVersion):
            self.version, parsed = version, None
        if parsed is None:
            logger.warning("vllm-ascend version %r unknown: taken as newest", self.version)
            parsed = Version(ASCEND_RELOAD_RPC)
        if parsed >= Version(ASCEND_RELOAD_RPC):
            self.weight_update = "reload_weights"
        elif parsed >= Version(ASCEND_LAYERWISE):
            self.weight_update = "layerwise"
        else:
            self.weight_update = "load_weights"
        self.counts_resident = parsed < Version(ASCEND_FREE_CHECK)

    def environment(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        out = super().environment(env)
        current = (os.environ if env is None else env).get("VLLM_ASCEND_ENABLE_NZ")
        if current not in (None, "0"):
            logger.warning("VLLM_ASCEND_ENABLE_NZ=%s overridden to 0: wake_up refuses NZ", current)
        # vllm_ascend.envs reads it; from v0.20.2rc1 it is AscendConfig.weight_nz_mode's
        # fallback (mindrl passes no additional_config for it); main (182b75ea84) too
        out["VLLM_ASCEND_ENABLE_NZ"] = "0"
        return out

    def update_weights(
        self,
        llm: Any,
        named: Iterable[tuple[str, torch.Tensor]],
        layers: Sequence[str] = (),
    ) -> None:
        if self.weight_update == "reload_weights":
            super().update_weights(llm, named)
        elif self.weight_update == "layerwise":
            llm.collective_rpc(_layerwise_reload, kwargs={"weights": list(named)})
        else:
            llm.collective_rpc(_model_load_weights, kwargs={"weights": list(named)})


def _layerwise_reload(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """In the worker: vLLM's layerwise reload, as vllm-ascend 0.22/0.23's NPUWorker runs it
    around a trainer transfer (initialize -> model.load_weights -> finalize, on its device);
    it is also what vLLM 0.32's ``reload_weights`` does inside."""
    from mindrl.rollout.scoped_reload import load_layerwise

    load_layerwise(worker, weights, [worker.model_runner.model])


def _model_load_weights(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """In the worker: the model's own ``load_weights`` into its live parameters (vllm-ascend
    0.11, as verl's colocated rollout does); right only while weights keep checkpoint layout
    (NZ off, unquantized)."""
    import torch

    with torch.no_grad():
        worker.get_model().load_weights(weights)
