"""The HTTP both sides of a tool service need: a bounded JSON POST, a liveness probe, a loopback server.

Standard library only (``urllib``, ``http.server``): the tools run wherever the agent loop runs,
and the embedded servers must start on a laptop with nothing else installed.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 8 * 1024 * 1024
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")


class ServiceError(Exception):
    """A call that got no usable answer; ``kind`` is the ``ToolResult.error`` it becomes."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def post_json(url: str, payload: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """POST ``payload`` and return the JSON object answered, within ``timeout`` seconds."""
    request = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read(MAX_RESPONSE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        detail = exc.read(500).decode(errors="replace")
        raise ServiceError("server_error", f"{url} answered HTTP {exc.code}: {detail}") from exc
    except TimeoutError as exc:
        raise ServiceError("timeout", f"{url} did not answer within {timeout:g} s") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise ServiceError("timeout", f"{url} did not answer within {timeout:g} s") from exc
        raise ServiceError("server_down", f"{url} cannot be reached ({exc.reason})") from exc
    except (ConnectionError, OSError) as exc:
        raise ServiceError("server_down", f"{url}: connection failed ({exc})") from exc
    except (http.client.HTTPException, ValueError) as exc:  # a broken answer, a bad URL
        raise ServiceError("server_error", f"{url}: {type(exc).__name__}: {exc}") from exc
    if len(body) > MAX_RESPONSE_BYTES:
        raise ServiceError("server_error", f"{url} answered more than {MAX_RESPONSE_BYTES} bytes")
    try:
        answer = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ServiceError("server_error", f"{url} answered no JSON: {body[:200]!r}") from exc
    if not isinstance(answer, dict):
        raise ServiceError("server_error", f"{url} answered {type(answer).__name__}, not an object")
    return answer


def check_service_url(url: str, what: str) -> str:
    """``url`` when it is an http(s) URL with a host, else a ValueError naming ``what``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"{what} must be an http(s) URL such as http://localhost:8080/..., got {url!r}"
        )
    return url


def is_loopback(url: str) -> bool:
    return (urlsplit(url).hostname or "") in LOOPBACK_HOSTS


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    default = 443 if parts.scheme == "https" else 80
    return parts.hostname or "127.0.0.1", parts.port or default


def port_answers(url: str, timeout: float = 1.0) -> bool:
    """Whether something accepts connections at the URL's host and port."""
    host, port = host_port(url)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


JsonHandler = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]


@dataclass
class LoopbackServer:
    """A threaded JSON server on 127.0.0.1: one handler per POST path, ``GET /health``."""

    routes: Mapping[str, JsonHandler]
    health: Mapping[str, Any]
    port: int = 0
    max_request_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        routes, health, limit = self.routes, self.health, self.max_request_bytes

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
                logger.debug("%s: " + format, self.address_string(), *args)

            def _answer(self, status: int, document: Mapping[str, Any]) -> None:
                body = json.dumps(document).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                    logger.debug("%s left before its answer", self.address_string())

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.rstrip("/") in ("", "/health", "/v1/ping"):
                    self._answer(200, health)
                else:
                    self._answer(404, {"detail": f"no GET {self.path}"})

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                handler = routes.get(self.path.rstrip("/"))
                if handler is None:
                    self._answer(404, {"detail": f"no POST {self.path}; known: {sorted(routes)}"})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if length > limit:
                    self._answer(413, {"detail": f"request over {limit} bytes"})
                    return
                try:
                    request = json.loads(self.rfile.read(length) or b"{}")
                    if not isinstance(request, dict):
                        raise ValueError("the request body must be a JSON object")
                except ValueError as exc:
                    self._answer(422, {"detail": str(exc)})
                    return
                try:
                    status, answer = handler(request)
                except Exception as exc:  # noqa: BLE001 - one bad request must not stop the server
                    logger.exception("tool service handler failed")
                    status, answer = 500, {"detail": f"{type(exc).__name__}: {exc}"}
                self._answer(status, answer)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"tool-service-{self.port}", daemon=True
        )

    def start(self) -> LoopbackServer:
        self._thread.start()
        return self

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()


class EmbeddedService:
    """What mindrl's embedded servers share: one POST path served on 127.0.0.1 by a
    `LoopbackServer`, its URL while it runs, a stop that can be called twice.

    A subclass (a dataclass with a ``port`` field; 0 picks a free port) names ``path`` and
    ``what``, handles the path's requests in ``handle`` and calls ``serve(health)`` from its
    ``start()``.
    """

    path: ClassVar[str]
    what: ClassVar[str]  # "sandbox", "retrieval": for messages
    port: int
    _server: LoopbackServer | None = None

    def handle(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        raise NotImplementedError

    def serve(self, health: Mapping[str, Any]) -> None:
        self._server = LoopbackServer(
            routes={self.path: self.handle}, health=health, port=self.port
        ).start()
        self.port = self._server.port

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError(f"the {self.what} server is not started")
        return self._server.url(self.path)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def serve_until_interrupted(self) -> None:
        """For a server's own command line: print the URL, serve until Ctrl-C, stop."""
        print(f"mindrl {self.what} serving {self.url}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            self.stop()
