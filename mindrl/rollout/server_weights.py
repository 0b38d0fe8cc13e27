"""The trainer's end of a weight push to one vLLM server (`vllm_gloo_engine` is the other).

The trainer opens a TCPStore on `host`:`port` (port 0: a free one), asks the server to join a
gloo group through `/init_weight_transfer_engine` (with a fresh token only server and trainer
know: `weight_admission` refuses any other peer), and then, per update:
`/start_weight_update`, one `/update_weights` call per bucket while the bucket's bytes are broadcast, and
`/finish_weight_update` with the new version, read back from `/weight_info`. The bytes go
straight from the trainer's buffer to the server's workers (one copy into a flat buffer on
each side); nothing passes through files or JSON.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from functools import partial
from typing import Any

import torch

from mindrl.rollout.daemon_calls import call_in_daemon
from mindrl.rollout.gloo_link import broadcast_bytes, open_group, open_store
from mindrl.rollout.server_client import RolloutServerError, VLLMServerClient
from mindrl.rollout.vllm_plugin import BACKEND
from mindrl.rollout.weight_admission import WeightPeerRefused, admit, check_group, new_token
from mindrl.rollout.weight_wire import pack_bucket


class ServerWeightLink:
    """One server's weight channel; `push` is one update (any number of buckets). The store
    listens on `host`:`port` (0: a free port); only the server's workers, proving the link's
    token (`weight_admission`), may join it."""

    def __init__(self, client: VLLMServerClient, host: str, timeout_s: float, port: int = 0):
        self.client = client
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self._store: Any = None
        self._group: Any = None
        self._world = 0

    def connect(self) -> None:
        """Join the server's workers in a gloo group (the trainer is rank 0)."""
        self.open()
        self.join()

    def open(self) -> None:
        """The rendezvous store, listening before the server is asked to join it."""
        self._world = 1 + self.client.world_size()
        self._store = open_store(
            self.host, self.port, self._world, master=True, timeout_s=self.timeout_s
        )

    @property
    def where(self) -> str:
        return f"{self.host}:{int(self._store.port)}"

    def join(self) -> None:
        """Ask the server to join over HTTP (with a fresh token) and admit only its workers."""
        token = new_token()  # travels only in the authenticated request below
        world = self._world
        init_info = {
            "master_address": self.host,
            "master_port": int(self._store.port),
            "world_size": world,
            "rank_offset": 1,
            "timeout_s": self.timeout_s,
            "token": token,
        }

        def admitted_group() -> Any:
            admit(self._store, token, world, self.timeout_s, self.where)
            group = open_group(self._store, 0, world, self.host, self.timeout_s)
            check_group(group, token, 0, world)
            return group

        self._group = self._alongside(
            lambda: self.client.request("/init_weight_transfer_engine", {"init_info": init_info}),
            admitted_group,
            what=(
                f"joining the weight-transfer group (was the server started with "
                f"VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config "
                f'\'{{"backend": "{BACKEND}"}}\'?)'
            ),
        )

    def push(self, buckets: Iterable[list[tuple[str, torch.Tensor]]], version: str) -> int:
        """Every bucket into the server's model, then the new `version`; bytes sent."""
        if self._group is None:
            raise RolloutServerError(self.client.url, "weights pushed before connect()")
        self.client.request("/start_weight_update", {})
        sent = 0
        for bucket in buckets:
            layout, flat = pack_bucket(bucket)
            self._alongside(
                partial(self.client.request, "/update_weights", {"update_info": layout.as_dict()}),
                partial(broadcast_bytes, self._group, flat),
                what=(
                    f"sending a weight bucket ({layout.names[0]} ...; the server's log has the "
                    "cause: a server started on a model of other shapes fails here)"
                ),
            )
            sent += sum(layout.sizes())  # the tensors' bytes, not the alignment padding
        self.client.request("/finish_weight_update", {"weight_version": version})
        served = self.client.weight_version()
        if served != version:
            raise RolloutServerError(
                self.client.url, f"serves weights version {served!r} after pushing {version!r}"
            )
        return sent

    def _alongside(self, call: Callable[[], Any], collective: Callable[[], Any], what: str) -> Any:
        """Run the server's HTTP call and the trainer's side of the collective together (each
        blocks until the other has joined); the collective's result. A failed HTTP call ends
        the wait at once rather than at the group's timeout."""
        start = time.monotonic()
        request: Future = call_in_daemon(call, name="mindrl-weights-http")
        local: Future = call_in_daemon(collective, name="mindrl-weights-gloo")
        done, _ = wait([request, local], timeout=self.timeout_s, return_when=FIRST_EXCEPTION)
        # a refused peer is the trainer's own finding, and the cause of the server's error
        for future in (local, request) if _refused(local, done) else (request, local):
            err = future.exception() if future in done else None
            if err is not None:
                self._group = None  # a half-finished collective leaves the group unusable
                raise RolloutServerError(self.client.url, f"{what}: {_detail(err)}") from err
        if len(done) < 2:
            self._group = None
            raise RolloutServerError(
                self.client.url,
                f"{what}: no answer within {self.timeout_s:g} s "
                f"(waited {time.monotonic() - start:.0f} s)",
            )
        return local.result()

    def close(self) -> None:
        self._group = None
        self._store = None


def _detail(err: BaseException) -> str:
    if isinstance(err, RolloutServerError):
        return err.detail
    return str(err) if isinstance(err, WeightPeerRefused) else repr(err)


def _refused(local: Future, done: set[Future]) -> bool:
    return local in done and isinstance(local.exception(), WeightPeerRefused)
