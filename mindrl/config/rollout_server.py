"""`generate_config.server`'s rules: rollout on vLLM servers the user runs.

The servers replace the run's own engines, so the keys that size or build an engine are the
`vllm serve` command line's business there (said once, with the flag to use); a separate
rollout group or the HF backend cannot be combined with servers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mindrl.config.fates import warn_once

if TYPE_CHECKING:
    from mindrl.config.run import RunConfig

# generate_config keys that build or size an engine of the run -> the server's own flag
ENGINE_KEYS = {
    "infer_tensor_parallel_size": "--tensor-parallel-size",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_model_len": "--max-model-len",
    "dtype": "--dtype",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "enforce_eager": "--enforce-eager",
    "enable_prefix_caching": "--enable-prefix-caching",
    "cpu_kvcache_space_gb": "--kv-cache-memory-bytes",
    "trust_remote_code": "--trust-remote-code",
    "torchair_graph": "vllm-ascend's --additional-config",
}


def server_problems(run: RunConfig) -> list[str]:
    from mindrl.rollout.server_client import normalize_url

    server = run.generate.server
    if server is None:
        return []
    out = []
    if server.host and server.urls:
        out.append("generate_config.server: set host (with port) or urls, not both")
    if not server.addresses():
        out.append("generate_config.server: no server given (set host and port, or urls)")
    for address in server.addresses():
        try:
            normalize_url(address)
        except ValueError as err:
            out.append(f"generate_config.server.urls: {err}")
    last_port = server.weight_sync_port + len(server.addresses()) - 1
    if server.weight_sync_port and last_port > 65535:
        out.append(
            f"generate_config.server.weight_sync_port: {server.weight_sync_port} + one port per "
            f"further server goes past 65535 (to {last_port})"
        )
    if run.rl.resources.rollout_resource is not None:
        out.append(
            "generate_config.server with rl_config.rollout_resource: rollout runs on the "
            "servers, the run starts no rollout engines of its own (unset one of them)"
        )
    if run.generate.rollout_backend == "hf":
        out.append(
            "generate_config.server generates on vLLM servers; rollout_backend: hf cannot be "
            "combined with it"
        )
    flags = ", ".join(f"{key} ({flag})" for key, flag in ENGINE_KEYS.items())
    warn_once(
        "generate_config.server.engine_keys",
        "generate_config.server: the engine keys have no effect here, the servers were built "
        f"by their own command line: {flags}",
    )
    return out
