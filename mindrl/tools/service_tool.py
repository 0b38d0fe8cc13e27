"""What the code interpreter and the search tool share: calls to an HTTP service, bounded.

``num_workers`` caps the tool's calls in flight (its own thread pool); with
``enable_global_rate_limit: true`` (MindSpeed-RL's default) ``rate_limit`` caps the calls in
flight of every such tool of the process together, as MindSpeed-RL's one named rate-limiter
actor does (the first tool's value wins; a different later one is warned). Both are
concurrency caps, not calls per second, as in MindSpeed-RL. ``type`` must be ``native``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar

from mindrl.tools.base import Tool, ToolSchema
from mindrl.tools.http_service import check_service_url

logger = logging.getLogger(__name__)
T = TypeVar("T")

SHARED_KEYS = ("num_workers", "rate_limit", "enable_global_rate_limit", "type")
# what a tool hands the loop at most; the loop cuts further to max_tool_response_length
MAX_TEXT_CHARS = 64 * 1024
TRUNCATED = "\n...(truncated)...\n"


def bounded_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``text``, or its first and last halves of ``limit`` around a mark when longer."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + TRUNCATED + text[-half:]


_global_limit: threading.BoundedSemaphore | None = None
_global_limit_size = 0
_global_lock = threading.Lock()


def _global_rate_limit(size: int) -> threading.BoundedSemaphore:
    global _global_limit, _global_limit_size
    with _global_lock:
        if _global_limit is None:
            _global_limit, _global_limit_size = threading.BoundedSemaphore(size), size
        elif size != _global_limit_size:
            logger.warning(
                "tool rate_limit %d: the process-wide limit is already %d (set by the first "
                "tool with enable_global_rate_limit), kept",
                size,
                _global_limit_size,
            )
        return _global_limit


def warn_unknown_keys(tool: str, config: Mapping[str, Any], known: tuple[str, ...]) -> None:
    for key in sorted(set(config) - set(known)):
        logger.warning(
            "tool %s: config key %r has no effect here (known: %s)", tool, key, ", ".join(known)
        )


class ServiceTool(Tool):
    """A tool whose calls are blocking HTTP requests, run on a bounded pool off the event loop.

    ``url_key`` names the config key that holds the service's URL: read by the tool, and from
    the tool YAML alone (`service_url`) by whoever checks or stands in for the service before
    any tool exists (`mindrl.tools.local_servers`).
    """

    url_key: ClassVar[str]

    @classmethod
    def service_url(cls, config: Mapping[str, Any]) -> str:
        """The service URL a tool of this class would call with ``config`` ("" when unset)."""
        return str(config.get(cls.url_key) or "")

    def __init__(self, config: Mapping[str, Any], schema: ToolSchema, default_workers: int) -> None:
        super().__init__(config, schema)
        self.url = self.service_url(self.config)
        if not self.url:
            raise ValueError(f"tool {schema.name}: config.{self.url_key} is not set")
        check_service_url(self.url, f"tool {schema.name}: config.{self.url_key}")
        tool_type = str(self.config.get("type", "native"))
        if tool_type != "native":
            raise ValueError(
                f"tool {schema.name}: type {tool_type!r} is not supported (mindrl runs native "
                "tools only; an MCP tool needs an MCP client mindrl does not have)"
            )
        self.num_workers = int(self.config.get("num_workers", default_workers))
        if self.num_workers < 1:
            raise ValueError(
                f"tool {schema.name}: num_workers must be >= 1, got {self.num_workers}"
            )
        rate_limit = int(self.config.get("rate_limit", default_workers))
        self._limit: threading.BoundedSemaphore | None = None
        if bool(self.config.get("enable_global_rate_limit", True)):
            self._limit = _global_rate_limit(max(rate_limit, 1))
        elif "rate_limit" in self.config:
            logger.warning(
                "tool %s: rate_limit has no effect here with enable_global_rate_limit: false "
                "(num_workers bounds the calls)",
                schema.name,
            )
        self._pool: ThreadPoolExecutor | None = None

    async def call_blocking(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the tool's pool, under the process-wide limit when there is one."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.num_workers, thread_name_prefix=f"tool-{self.name}"
            )
        limit = self._limit

        def limited() -> T:
            if limit is None:
                return fn()
            with limit:
                return fn()

        return await asyncio.get_running_loop().run_in_executor(self._pool, limited)

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
