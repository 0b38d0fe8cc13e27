"""A key on every endpoint of a vLLM server: `vllm serve ... --middleware
mindrl.rollout.vllm_auth.RequireKey` with the key in `VLLM_API_KEY`.

vLLM's own `--api-key` guards only paths under `/v1`, `/v2`, `/inference` and `/cohere`. The
endpoints mindrl's weight push needs exist only in development mode (`VLLM_SERVER_DEV_MODE=1`),
which also serves `/collective_rpc`, `/sleep`, `/reset_prefix_cache`, `/server_info`,
`/pause` and the weight-transfer calls, all without a key: whoever reaches the port could
load weights of their own or call into the workers. This ASGI middleware asks for the key on
every request but `/health` (load balancers probe it). It reads the key from `VLLM_API_KEY`,
where vLLM reads it too (so `--api-key` need not be given), and refuses to start without one.
It imports nothing heavy (the standard library and mindrl.config): vLLM's API process loads it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from mindrl.config.secrets import API_KEY_ENV

OPEN_PATHS = frozenset({"/health"})

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class RequireKey:
    """Answers 401 to any HTTP or websocket request without `Authorization: Bearer <key>`."""

    def __init__(self, app: ASGIApp) -> None:
        key = os.environ.get(API_KEY_ENV)
        if not key:
            raise RuntimeError(
                f"mindrl.rollout.vllm_auth.RequireKey: set {API_KEY_ENV} in the server's "
                "environment (the key every request must carry)"
            )
        self.app = app
        self._key_digest = _digest(key.encode())

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    return hmac.compare_digest(_digest(token.strip()), self._key_digest)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan: startup and shutdown
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = b'{"error": "Unauthorized"}'
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
