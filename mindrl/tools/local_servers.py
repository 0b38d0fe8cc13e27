"""The embedded tool servers: started when a tool's URL is on this machine and nothing answers.

The driver calls ``ensure_local_servers(entries)`` at start-up and ``.stop()`` at the end; the
dry run calls ``check_tool_services(entries)`` to name, before anything starts, a service that
is down and that mindrl cannot stand in for (not on localhost, or a search tool without
``retrieval_corpus``). Both read the tool YAML's entries: no tool is instantiated to learn
its URL (`ServiceTool.service_url` reads it from the entry's config).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mindrl.tools.code_interpreter import CodeInterpreterTool
from mindrl.tools.http_service import EmbeddedService, host_port, is_loopback, port_answers
from mindrl.tools.registry import ToolEntry, tool_class
from mindrl.tools.retrieval_server import RetrievalServer
from mindrl.tools.sandbox_server import SandboxLimits, SandboxServer
from mindrl.tools.search import SearchTool

logger = logging.getLogger(__name__)


@dataclass
class LocalServers:
    """The embedded servers this run started; ``stop()`` ends them all."""

    servers: list[EmbeddedService] = field(default_factory=list)

    def stop(self) -> None:
        while self.servers:
            self.servers.pop().stop()

    def __enter__(self) -> LocalServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ToolServiceError(RuntimeError):
    """A tool's service is down and mindrl cannot start one in its place."""


@dataclass(frozen=True)
class _Service:
    """A built-in tool's service: its URL and, for search, the corpus an embedded server reads."""

    tool: str
    kind: str  # "sandbox" or "retrieval"
    url: str
    corpus: str = ""

    def needs_stand_in(self, taken: Mapping[int, str]) -> bool:
        """False when the service answers, or is an embedded server of its kind already."""
        port = host_port(self.url)[1]
        if is_loopback(self.url) and port in taken:
            return taken[port] != self.kind  # another kind there: a conflict problem() names
        return not port_answers(self.url)

    def problem(self, taken: Mapping[int, str]) -> str | None:
        """Why mindrl cannot stand in for this service when it does not answer (None: it can)."""
        if not is_loopback(self.url):
            return f"tool {self.tool}: {self.url} does not answer"
        port = host_port(self.url)[1]
        if taken.get(port, self.kind) != self.kind:
            return (
                f"tool {self.tool}: {self.url} does not answer, and port {port} is already "
                f"mindrl's embedded {taken[port]} server; give each service its own port"
            )
        if self.kind == "retrieval" and not self.corpus:
            return (
                f"tool {self.tool}: {self.url} does not answer, and without config.retrieval_corpus "
                "(a JSONL file of {id, contents}) mindrl cannot start a retrieval server there"
            )
        if self.kind == "retrieval" and not Path(self.corpus).is_file():
            return f"tool {self.tool}: {self.url} does not answer and retrieval_corpus {self.corpus} does not exist"
        return None


def _services(entries: Sequence[ToolEntry], base_dir: Path | str) -> list[_Service]:
    """The services of the built-in tools among ``entries`` that name a URL."""
    services = []
    for entry in entries:
        cls = tool_class(entry.class_name, Path(base_dir))
        if issubclass(cls, CodeInterpreterTool):
            kind, corpus = "sandbox", ""
        elif issubclass(cls, SearchTool):
            kind, corpus = "retrieval", SearchTool.corpus_of(entry.config)
        else:
            continue
        url = cls.service_url(entry.config)
        if url:
            services.append(_Service(entry.schema.name, kind, url, corpus))
    return services


def ensure_local_servers(
    entries: Sequence[ToolEntry], base_dir: Path | str = ".", memory_mb: int | None = None
) -> LocalServers:
    """Start an embedded server for each loopback URL where nothing answers; raise for the rest
    (``base_dir``: where a ``file.py:Class`` tool's file is found, the tool YAML's folder)."""
    started = LocalServers()
    taken: dict[int, str] = {}
    try:
        for service in _services(entries, base_dir):
            if not service.needs_stand_in(taken):
                continue
            port = host_port(service.url)[1]
            problem = service.problem(taken)
            if problem is not None:
                raise ToolServiceError(problem)
            if service.kind == "sandbox":
                limits = SandboxLimits(
                    default_memory_mb=memory_mb or SandboxLimits.default_memory_mb
                )
                started.servers.append(SandboxServer(limits, port=port).start())
            else:
                started.servers.append(RetrievalServer(service.corpus, port=port).start())
            taken[port] = service.kind
            logger.info(
                "tool %s: nothing answered at %s, embedded %s server started there",
                service.tool,
                service.url,
                service.kind,
            )
    except BaseException:
        started.stop()
        raise
    return started


def check_tool_services(entries: Sequence[ToolEntry], base_dir: Path | str = ".") -> list[str]:
    """One line per tool whose service is down and cannot be stood in for (the dry run warns)."""
    problems = []
    planned: dict[int, str] = {}
    for service in _services(entries, base_dir):
        if not service.needs_stand_in(planned):
            continue
        problem = service.problem(planned)
        if problem is not None:
            problems.append(problem)
        else:
            planned[host_port(service.url)[1]] = service.kind
    return problems
