"""The embedded tool servers: started when a tool's URL is on this machine and nothing answers.

The agent loop calls ``ensure_local_servers(tools)`` at start-up and ``.stop()`` at the end;
the dry run calls ``check_tool_services(entries)`` to name, before anything starts, a service
that is down and that mindrl cannot stand in for (not on localhost, or a search tool without
``retrieval_corpus``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mindrl.tools.base import Tool
from mindrl.tools.code_interpreter import CodeInterpreterTool
from mindrl.tools.http_service import host_port, is_loopback, port_answers
from mindrl.tools.registry import ToolEntry, tool_class
from mindrl.tools.retrieval_server import RetrievalServer
from mindrl.tools.sandbox_server import SandboxLimits, SandboxServer
from mindrl.tools.search import SearchTool

logger = logging.getLogger(__name__)


class _Server(Protocol):
    def stop(self) -> None: ...


@dataclass
class LocalServers:
    """The embedded servers this run started; ``stop()`` ends them all."""

    servers: list[_Server] = field(default_factory=list)

    def stop(self) -> None:
        while self.servers:
            self.servers.pop().stop()

    def __enter__(self) -> LocalServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ToolServiceError(RuntimeError):
    """A tool's service is down and mindrl cannot start one in its place."""


def _service(tool: Tool) -> tuple[str, str | None] | None:
    """(URL, corpus) of a built-in service tool, None for a tool without a service."""
    if isinstance(tool, CodeInterpreterTool):
        return tool.url, None
    if isinstance(tool, SearchTool):
        return tool.url, tool.corpus or ""
    return None


def ensure_local_servers(tools: Mapping[str, Tool], memory_mb: int | None = None) -> LocalServers:
    """Start an embedded server for each loopback URL where nothing answers; raise for the rest."""
    started = LocalServers()
    taken: set[tuple[str, int]] = set()
    try:
        for name, tool in tools.items():
            service = _service(tool)
            if service is None:
                continue
            url, corpus = service
            address = host_port(url)
            if address in taken or port_answers(url):
                continue
            if not is_loopback(url):
                raise ToolServiceError(f"tool {name}: {url} does not answer")
            if corpus is None:
                limits = SandboxLimits(
                    default_memory_mb=memory_mb or SandboxLimits.default_memory_mb
                )
                started.servers.append(SandboxServer(limits, port=address[1]).start())
            elif corpus:
                started.servers.append(RetrievalServer(corpus, port=address[1]).start())
            else:
                raise ToolServiceError(
                    f"tool {name}: {url} does not answer, and without config.retrieval_corpus "
                    "(a JSONL file of {id, contents}) mindrl cannot start a retrieval server there"
                )
            taken.add(address)
            logger.info("tool %s: nothing answered at %s, embedded server started there", name, url)
    except BaseException:
        started.stop()
        raise
    return started


def check_tool_services(entries: Sequence[ToolEntry], base_dir: Any = ".") -> list[str]:
    """One line per tool whose service is down and cannot be stood in for (the dry run warns)."""
    problems = []
    for entry in entries:
        cls = tool_class(entry.class_name, base_dir)
        if issubclass(cls, CodeInterpreterTool):
            url, corpus = str(entry.config.get("sandbox_fusion_url") or ""), None
        elif issubclass(cls, SearchTool):
            url = str(entry.config.get("retrieval_service_url") or "")
            corpus = str(entry.config.get("retrieval_corpus") or "")
        else:
            continue
        if not url or port_answers(url):
            continue
        if not is_loopback(url):
            problems.append(f"tool {entry.schema.name}: {url} does not answer")
        elif corpus == "":
            problems.append(
                f"tool {entry.schema.name}: {url} does not answer and no config.retrieval_corpus "
                "names a corpus for mindrl's embedded retrieval server"
            )
    return problems
