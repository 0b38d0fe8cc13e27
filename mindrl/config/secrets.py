"""Config values that are secrets (a server's API key): never printed, logged or saved.

The resolved config is printed by `--dry-run`, saved as `resolved_config.yaml` and handed to
the experiment trackers; each of those goes through `redacted` first, and a typed config
field holding a secret has no repr.
"""

from __future__ import annotations

from typing import Any

SECRET_KEYS = frozenset({"api_key"})
REDACTED = "<redacted>"
API_KEY_ENV = "VLLM_API_KEY"  # vLLM's own variable for a server's key, read by both sides


def redacted(tree: Any) -> Any:
    """A copy of a raw config tree with every set secret replaced by `REDACTED`."""
    if isinstance(tree, dict):
        return {
            key: (REDACTED if key in SECRET_KEYS and value is not None else redacted(value))
            for key, value in tree.items()
        }
    if isinstance(tree, list):
        return [redacted(item) for item in tree]
    return tree


def hide_value(messages: list[str], value: Any) -> list[str]:
    """Problem messages about a secret field with its value taken out."""
    return [m.replace(repr(value), REDACTED).replace(str(value), REDACTED) for m in messages]
