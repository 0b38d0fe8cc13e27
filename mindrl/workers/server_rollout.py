"""Rollout on vLLM servers the user runs (`generate_config.server`), driven from the driver.

The servers take the place of a rollout worker group: the same calls (`generate`,
`generate_async` / `collect` for the rollout pipeline, `load_weights` with the actor's
packed buckets), so the loop does not know which it talks to. A step's prompts are spread over
the servers that answer; weights go to each server over its own gloo link
(`rollout.server_weights`) with a version each server must report back. A server that fails
stops the run (`on_failure: stop`) or is dropped, its prompts going to the others
(`continue`); the error always names the server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from mindrl.rollout.base import RolloutRow, rollout_rows
from mindrl.rollout.daemon_calls import call_in_daemon
from mindrl.rollout.server_client import RolloutServerError, VLLMServerClient
from mindrl.rollout.server_weights import ServerWeightLink
from mindrl.workers.facades import RolloutGenerator

if TYPE_CHECKING:
    from mindrl.config.generate import RolloutServerConfig
    from mindrl.data.tool_kwargs import ToolsKwargs
    from mindrl.rollout.base import RolloutSampling
    from mindrl.workers.facades import ActorGroup

logger = logging.getLogger("mindrl.rollout")
REQUESTS_IN_FLIGHT = 64  # per server: vLLM batches the requests it holds at once
TOKENIZER_PROBE = "Solve 12 + 30 = ? Answer: 42. The quick brown fox, naïve café."


def prompt_sampling(sampling: RolloutSampling, index: int) -> RolloutSampling:
    """The sampling of a call's `index`-th prompt: its own seed when the call has one."""
    if sampling.seed is None:
        return sampling
    return replace(sampling, seed=(sampling.seed * 1_000_003 + index) % (1 << 63))


def split_prompts(n_prompts: int, n_servers: int) -> list[range]:
    """Contiguous, near-equal prompt ranges, one per server (the first ones take the extra)."""
    base, extra = divmod(n_prompts, n_servers)
    out, start = [], 0
    for i in range(n_servers):
        size = base + (1 if i < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


class ServerRolloutGroup(RolloutGenerator):
    """The rollout role on external vLLM servers."""

    def __init__(self, cfg: RolloutServerConfig, needed_len: int, tokenizer: Any) -> None:
        self.cfg = cfg
        self.needed_len = needed_len  # max prompt + max response tokens
        self.tokenizer = tokenizer  # the actor's: prompts travel as its token ids
        key = cfg.key()
        self.live = [VLLMServerClient(a, cfg.timeout, key) for a in cfg.addresses()]
        # the i-th server's weight-sync store listens on weight_sync_port + i (0: free ports)
        self._sync_ports = {
            c.url: cfg.weight_sync_port + i if cfg.weight_sync_port else 0
            for i, c in enumerate(self.live)
        }
        self.links: dict[str, ServerWeightLink] = {}
        self.version = 0  # weight pushes so far; each server must report the last one
        # requests in flight per server (vLLM batches the ones it holds)
        self._slots = {c.url: threading.Semaphore(REQUESTS_IN_FLIGHT) for c in self.live}
        # the pipeline's batches in flight (rollout_staleness >= 2) are generated one at a
        # time, as a rollout worker group runs its calls: the list of live servers changes
        # only under one batch
        self._one_batch = threading.Semaphore(1)

    # -- start -------------------------------------------------------------------------
    def start(self, actor: ActorGroup) -> None:
        """`connect`: the actor's model is not exported, the servers load their own copy
        (which the first weight push replaces)."""
        del actor
        self.connect()

    def connect(self) -> None:
        """Check each server and open its weight link; a server that fails is lost."""
        for client in list(self.live):
            try:
                self._connect(client)
            except RolloutServerError as err:
                self._lost(client, err)
        logger.info(
            "rollout on %d vLLM server(s): %s", len(self.live), ", ".join(c.url for c in self.live)
        )

    def _connect(self, client: VLLMServerClient) -> None:
        from mindrl.rollout.server_checks import server_config_notes, server_config_problems

        served = client.served_model()  # with the key: a missing or wrong one is named here
        self._check_key_required(client)
        config = client.engine_config()
        problems = server_config_problems(config)
        if problems:
            raise RolloutServerError(client.url, "; ".join(problems))
        for note in server_config_notes(config):
            logger.warning("rollout server %s %s", client.url, note)
        max_len = (config.get("model_config") or {}).get("max_model_len")
        if max_len is not None and max_len < self.needed_len:
            raise RolloutServerError(
                client.url,
                f"serves max_model_len {max_len}, below max_prompt_length + "
                f"sampling_config.max_tokens ({self.needed_len}); restart it with "
                f"--max-model-len {self.needed_len} or more",
            )
        ours = self.tokenizer.encode(TOKENIZER_PROBE, add_special_tokens=False)
        if client.tokenize(TOKENIZER_PROBE) != ours:
            raise RolloutServerError(
                client.url,
                f"serves {served!r}, whose tokenizer differs from the actor's "
                "(actor_config.tokenizer_name_or_path): prompts travel as token ids, so the "
                "server must be started from the actor's model",
            )
        link = ServerWeightLink(
            client, self.cfg.weight_sync_host, self.cfg.timeout, self._sync_ports[client.url]
        )
        link.connect()
        self.links[client.url] = link

    def _check_key_required(self, client: VLLMServerClient) -> None:
        """Weights go to a server off loopback only if it refuses requests without the key,
        the weight-transfer endpoints included (vLLM's `--api-key` leaves those open)."""
        from mindrl.rollout.server_client import unkeyed_server_problem

        open_paths = [path for path, guarded in client.requires_key().items() if not guarded]
        problem = unkeyed_server_problem(client.url, open_paths)
        if problem:
            raise RolloutServerError(client.url, problem)
        if open_paths:
            logger.info("rollout server %s answers %s without a key", client.url, open_paths)

    def _lost(self, client: VLLMServerClient, err: RolloutServerError) -> None:
        """Drop a failed server (`on_failure: continue`) or stop the run with its error."""
        if self.cfg.on_failure == "stop":
            raise err
        if client in self.live:
            self.live.remove(client)
        link = self.links.pop(client.url, None)
        if link is not None:
            link.close()
        if not self.live:
            raise RolloutServerError(client.url, f"{err}; no rollout server is left") from err
        logger.warning(
            "%s; continuing on %d server(s) (generate_config.server.on_failure: continue)",
            err,
            len(self.live),
        )

    # -- weights -----------------------------------------------------------------------
    def load_weights(self, bucket_refs: list[Any]) -> int:
        """The actor's packed buckets (object-store refs) into every live server; bytes
        moved per server."""
        from mindrl.workers.weight_transfer import fetch_weight_buckets

        return self.push_weights(lambda: fetch_weight_buckets(bucket_refs))

    def push_weights(self, buckets: Callable[[], Iterable[list[tuple[str, Any]]]]) -> int:
        """One update: `buckets()` (a fresh pass per server) into every live server, which
        must then report the new version; bytes moved per server."""
        self.version += 1
        version = str(self.version)
        moved = 0
        for client in list(self.live):
            try:
                moved = self.links[client.url].push(buckets(), version)
            except RolloutServerError as err:
                self._lost(client, err)
        return moved

    def _check_versions(self) -> None:
        """Every live server serves the weights pushed last (a restarted server does not)."""
        if self.version == 0:
            return
        for client in list(self.live):
            try:
                served = client.weight_version()
                if served != str(self.version):
                    raise RolloutServerError(
                        client.url,
                        f"serves weights version {served!r}, the run pushed {self.version} "
                        "(was it restarted?)",
                    )
            except RolloutServerError as err:
                self._lost(client, err)

    # -- generation (the RolloutGenerator calls) ----------------------------------------
    def rollout_ranks(self) -> list[int]:
        """One slice: the servers share it out themselves (their number may shrink)."""
        return [0]

    def generate(
        self,
        prompts_per_rank: list[list[list[int]]],
        sampling: RolloutSampling,
        tools_kwargs_per_rank: list[list[ToolsKwargs]] | None = None,
    ) -> list[list[RolloutRow] | None]:
        """``tools_kwargs_per_rank`` has no tool to reach: multi-turn rollout on a user's
        server is refused at config time (`mindrl.config.multi_turn`)."""
        (prompts,) = prompts_per_rank
        self._check_versions()
        return [rollout_rows(self._spread(prompts, sampling))]

    def _spread(self, prompts: list[list[int]], sampling: RolloutSampling) -> list[Any]:
        """Results for every prompt, one request each (vLLM gives every prompt of a request
        the request's seed: identical prompts would sample alike), each with its own seed
        from the call's, whichever server takes it; a failed server's prompts are re-sent."""
        from mindrl.rollout.base import RolloutResult

        results: list[RolloutResult] = []
        todo = list(range(len(prompts)))
        while todo:
            servers = list(self.live)
            futures = [
                (
                    client,
                    i,
                    call_in_daemon(
                        client.complete,
                        [prompts[i]],
                        prompt_sampling(sampling, i),
                        name="mindrl-generate",
                        limit=self._slots[client.url],
                    ),
                )
                for part, client in zip(split_prompts(len(todo), len(servers)), servers)
                for i in (todo[k] for k in part)
            ]
            todo = []
            for client, i, future in futures:
                try:
                    got = future.result()
                except RolloutServerError as err:
                    if client in self.live:
                        self._lost(client, err)
                    todo.append(i)
                    continue
                results.extend(
                    RolloutResult(i, r.sample_index, r.token_ids, r.logprobs, r.finish_reason)
                    for r in got
                )
        return sorted(results, key=lambda r: (r.prompt_index, r.sample_index))

    def generate_async(
        self,
        prompts_per_rank: list[list[list[int]]],
        sampling: RolloutSampling,
        tools_kwargs_per_rank: list[list[ToolsKwargs]] | None = None,
    ) -> Future:
        """Start generating in the background (the rollout pipeline), after the batches
        already started; `collect` waits."""
        return call_in_daemon(
            self.generate,
            prompts_per_rank,
            sampling,
            tools_kwargs_per_rank,
            name="mindrl-rollout",
            limit=self._one_batch,
        )

    def collect(self, pending: Future) -> list[list[RolloutRow] | None]:
        return pending.result()

    def rollout_mode(self) -> None:
        """The servers keep their memory (vLLM sleeps only on accelerators)."""

    def train_mode(self) -> None:
        """As `rollout_mode`."""

    def close(self) -> None:
        for link in self.links.values():
            link.close()
        self.links.clear()
