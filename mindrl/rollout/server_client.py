"""One vLLM OpenAI-compatible server, as the trainer talks to it: generation through
`/v1/completions` (token ids in, token ids and raw log-probs out) and the weight-update
endpoints of vLLM's RL API. Standard library HTTP only.

Every failure (refused connection, timeout, HTTP error, a reply that is not what vLLM sends)
raises `RolloutServerError` naming the server and what was asked, so a dead server is never
a bare socket traceback.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from mindrl.config.secrets import API_KEY_ENV
from mindrl.rollout.base import RolloutResult, RolloutSampling

HTTP_UNAUTHORIZED = 401
# probed without the key: vLLM's `--api-key` guards the first, only a key on every path (the
# `vllm_auth` middleware) the second, a dev-mode endpoint of the weight transfer
KEY_PROBES = ("/v1/models", "/get_world_size")


class RolloutServerError(RuntimeError):
    """A rollout server did not answer, or answered with an error."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"rollout server {url}: {message}")
        self.url = url
        self.detail = message


def normalize_url(address: str) -> str:
    """``host:port`` or ``http://host:port[/]`` as ``http://host:port``."""
    address = address.strip().rstrip("/")
    if not address:
        raise ValueError("an empty rollout server address")
    if "://" not in address:
        address = f"http://{address}"
    if not address.startswith(("http://", "https://")):
        raise ValueError(f"rollout server {address!r}: only http(s) addresses are served")
    return address


def on_loopback(url: str) -> bool:
    """Whether every address the server's host name resolves to is a loopback one."""
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def unkeyed_server_problem(url: str, open_paths: list[str]) -> str | None:
    """Why weights may not go to a server that answers `open_paths` without a key: none on
    loopback (only this machine reaches it) or when every probed path wants the key."""
    if not open_paths or on_loopback(url):
        return None
    return (
        f"answers {', '.join(open_paths)} without an API key; mindrl pushes weights only to a "
        "server off loopback that refuses requests without one: start it with VLLM_API_KEY "
        "set and --middleware mindrl.rollout.vllm_auth.RequireKey (vLLM's --api-key alone "
        "leaves the weight-update endpoints open; docs/rollout.md)"
    )


class VLLMServerClient:
    """Requests to one server; `timeout_s` bounds each request (a step's generation too).
    `api_key` goes as `Authorization: Bearer` on every request; it is never printed."""

    def __init__(self, url: str, timeout_s: float, api_key: str | None = None) -> None:
        self.url = normalize_url(url)
        self.timeout_s = timeout_s
        self._api_key = api_key
        self.model: str | None = None

    def __repr__(self) -> str:
        return f"VLLMServerClient({self.url})"

    # -- transport ---------------------------------------------------------------------
    def request(
        self,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        with_key: bool = True,
    ) -> Any:
        """GET (no body) or POST a JSON body; the decoded JSON reply. `with_key=False`: as a
        stranger asks (the probe of `requires_key`)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if with_key and self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        req = urllib.request.Request(
            self.url + path, data=data, method="GET" if body is None else "POST", headers=headers
        )
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            with urllib.request.urlopen(req, timeout=timeout) as reply:
                raw = reply.read()
        except urllib.error.HTTPError as err:
            if err.code == HTTP_UNAUTHORIZED:
                raise RolloutServerError(self.url, self._refused_key(path)) from err
            detail = err.read().decode(errors="replace")[:500]
            raise RolloutServerError(
                self.url, f"{path} answered HTTP {err.code}: {detail}"
            ) from err
        except TimeoutError as err:
            raise RolloutServerError(
                self.url, f"{path} gave no answer within {timeout:g} s"
            ) from err
        except (urllib.error.URLError, ConnectionError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise RolloutServerError(self.url, f"{path} failed: {reason}") from err
        try:
            return json.loads(raw) if raw else None
        except json.JSONDecodeError as err:
            raise RolloutServerError(
                self.url, f"{path} answered with non-JSON {raw[:200]!r}"
            ) from err

    def _refused_key(self, path: str) -> str:
        if self._api_key is None:
            return (
                f"{path} answered HTTP 401: the server requires an API key and the run has "
                f"none (set generate_config.server.api_key, or {API_KEY_ENV} in the trainer's "
                "environment)"
            )
        return (
            f"{path} answered HTTP 401: the server refused the run's API key (wrong key: "
            f"generate_config.server.api_key / {API_KEY_ENV} differs from the server's)"
        )

    def requires_key(self) -> dict[str, bool]:
        """Per probed path (a model listing, and a weight-transfer endpoint, which vLLM's own
        `--api-key` leaves open): whether a request without the key is refused (HTTP 401)."""
        out = {}
        for path in KEY_PROBES:
            try:
                self.request(path, with_key=False)
                out[path] = False
            except RolloutServerError as err:
                if "HTTP 401" not in err.detail:
                    raise
                out[path] = True
        return out

    # -- what the server serves -------------------------------------------------------
    def served_model(self) -> str:
        """The one model the server serves (its id is what completions name)."""
        models = self.request("/v1/models")
        ids = [m.get("id") for m in (models or {}).get("data", [])]
        if len(ids) != 1:
            raise RolloutServerError(self.url, f"serves {len(ids)} models {ids}, expected one")
        self.model = ids[0]
        return self.model

    def tokenize(self, text: str) -> list[int]:
        """The server's token ids for `text` (no special tokens added)."""
        if self.model is None:
            self.served_model()
        reply = self.request(
            "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}
        )
        return [int(t) for t in reply["tokens"]]

    def engine_config(self) -> dict[str, Any]:
        """The server's vLLM config as JSON (`/server_info`, a dev-mode endpoint)."""
        try:
            info = self.request("/server_info?config_format=json")
        except RolloutServerError as err:
            if "HTTP 404" in err.detail:
                raise RolloutServerError(
                    self.url,
                    "has no /server_info: start it with VLLM_SERVER_DEV_MODE=1 (vLLM's RL "
                    "endpoints, which take the weight updates, exist only then)",
                ) from err
            raise
        config = (info or {}).get("vllm_config")
        if not isinstance(config, dict):
            raise RolloutServerError(self.url, "/server_info returned no vllm_config")
        return config

    def world_size(self) -> int:
        """Worker processes of the server (TP x PP x DP): the ranks that take weights."""
        return int(self.request("/get_world_size")["world_size"])

    def weight_version(self) -> str | None:
        return self.request("/weight_info").get("weight_version")

    # -- generation --------------------------------------------------------------------
    def complete(self, prompts: list[list[int]], sampling: RolloutSampling) -> list[RolloutResult]:
        """`sampling.n` responses per prompt, ordered by (prompt_index, sample_index)."""
        if not prompts:
            return []
        if self.model is None:
            self.served_model()
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompts,
            "n": sampling.n,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "min_p": sampling.min_p,
            "stop_token_ids": list(sampling.stop_token_ids),
            "ignore_eos": sampling.ignore_eos,
            # the policy's own distribution: no penalties from the model's generation_config
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "logprobs": 0,  # the sampled token's own log-prob
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        reply = self.request("/v1/completions", body)
        return completion_results(self.url, reply, len(prompts), sampling.n)


def completion_results(url: str, reply: Any, n_prompts: int, n: int) -> list[RolloutResult]:
    """vLLM's completion choices (index = prompt * n + sample) as `RolloutResult`s."""
    choices = (reply or {}).get("choices")
    if not isinstance(choices, list) or len(choices) != n_prompts * n:
        got = len(choices) if isinstance(choices, list) else choices
        raise RolloutServerError(
            url, f"/v1/completions returned {got} choices, expected {n_prompts * n}"
        )
    out = []
    for choice in sorted(choices, key=lambda c: c["index"]):
        tokens = choice.get("token_ids")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        if tokens is None or logprobs is None:
            raise RolloutServerError(
                url, "/v1/completions returned no token ids or log-probs (a vLLM server is needed)"
            )
        reason = choice.get("finish_reason")
        prompt_index, sample_index = divmod(int(choice["index"]), n)
        out.append(
            RolloutResult(
                prompt_index=prompt_index,
                sample_index=sample_index,
                token_ids=tuple(int(t) for t in tokens),
                logprobs=tuple(float(x) for x in logprobs),
                finish_reason="length" if reason == "length" else "stop",
            )
        )
    return out
