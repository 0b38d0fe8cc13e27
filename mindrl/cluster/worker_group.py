"""N Ray actors of one role on a placement group's bundles, called as one.

    group = WorkerGroup(ActorWorker, "actor", pgs["actor+ref"], [0, 1], num_cpus_per_worker=0.5,
                        master_addr=cluster.master_addr, timeout_s=runtime.worker_timeout_s)
    group.execute_all("init_model")                  # same call on every rank, rank order
    chunks = group.split_by_dp(prompts)              # one chunk per data-parallel rank
    outs = group.collect_by_dp(group.dispatch_by_dp("generate", chunks))
    group.shutdown()

Every wait is `ray.wait` in a loop bounded by the call's timeout: a dead actor surfaces as
`WorkerFailure(role, rank, reason)` as soon as Ray notices (about a second after a SIGKILL), a
method that raises as `WorkerCallError`, a call that runs too long as `WorkerTimeout`. Nothing
blocks forever.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mindrl.cluster.calls import (
    POLL_S,
    Method,
    error_reason,
    free_port,
    probe_node,
    share,
    split_evenly,
)
from mindrl.cluster.errors import (
    NodeLost,
    WorkerCallError,
    WorkerFailure,
    WorkerGroupError,
    WorkerTimeout,
)
from mindrl.cluster.node_loss import dead_nodes, held_by, placed_nodes, register, unregister

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.util.placement_group import PlacementGroup


class WorkerGroup:
    """`world_size` actors of `worker_cls`, rank i on bundle `bundle_indices[i]` of `pg`."""

    def __init__(
        self,
        worker_cls: type,
        role: str,
        pg: PlacementGroup,
        bundle_indices: Sequence[int],
        world_size: int | None = None,
        *,
        num_cpus_per_worker: float = 1.0,
        num_devices_per_worker: float = 0.0,
        device_resource: str = "CPU",
        env: dict[str, str] | None = None,
        init_args: Sequence[Any] = (),
        init_kwargs: dict[str, Any] | None = None,
        master_addr: str | None = None,
        master_port: int | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        """Start the actors and wait until every constructor has returned.

        `num_cpus_per_worker` / `num_devices_per_worker` may be fractions so that roles
        colocated on one device group share its bundles. `device_resource` is the plan's
        resource ("CPU", "GPU", "NPU"); Ray then sets the accelerator's visible-devices
        variable in each actor. `master_addr` None asks rank 0's node for its IP (multi-node);
        a given address (127.0.0.1 on one node) is used as is, with a port free on this node.
        """
        import ray

        world_size = len(bundle_indices) if world_size is None else world_size
        if len(bundle_indices) != world_size:
            raise ValueError(
                f"{role}: {len(bundle_indices)} bundle indices for world size {world_size}"
            )
        self.role = role
        self.world_size = world_size
        self.timeout_s = float(timeout_s)
        self.pg = pg
        self.bundle_indices = [int(i) for i in bundle_indices]
        self._calls: dict[ObjectRef, tuple[int, str]] = {}
        self._dp_ranks: list[int] | None = None
        self._actors: list[Any] = []
        self._killed = False
        self.node_ids: list[str] = []  # the Ray node of each rank (a lost node is named)

        remote_cls: Any = worker_cls if hasattr(worker_cls, "remote") else ray.remote(worker_cls)
        self.master_addr, self.master_port = self._resolve_master(master_addr, master_port)
        local_ranks, local_sizes = self._local_ranks()
        register(self)
        options: dict[str, Any] = {"num_cpus": num_cpus_per_worker, "max_restarts": 0}
        if num_devices_per_worker and device_resource == "GPU":
            options["num_gpus"] = num_devices_per_worker
        elif num_devices_per_worker and device_resource != "CPU":
            options["resources"] = {device_resource: num_devices_per_worker}

        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        try:
            for rank, bundle in enumerate(self.bundle_indices):
                rank_env = {k: str(v) for k, v in (env or {}).items()}
                rank_env.update(
                    MINDRL_ROLE=role,
                    RANK=str(rank),
                    WORLD_SIZE=str(world_size),
                    LOCAL_RANK=str(local_ranks[rank]),
                    LOCAL_WORLD_SIZE=str(local_sizes[rank]),
                    MASTER_ADDR=self.master_addr,
                    MASTER_PORT=str(self.master_port),
                )
                strategy = PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=bundle
                )
                actor = remote_cls.options(
                    scheduling_strategy=strategy,
                    runtime_env={"env_vars": rank_env},
                    **options,
                ).remote(*init_args, **(init_kwargs or {}))
                self._actors.append(actor)
            refs = self._submit_all("__ray_ready__", (), {}, share=False)
            asked = {k: v for k, v in options.items() if k != "max_restarts"}
            self.gather(refs, hint=f"is each bundle big enough for {asked} per worker?")
        except BaseException:
            self.kill()
            raise

    # -- set-up helpers -----------------------------------------------------------------------
    def _resolve_master(self, addr: str | None, port: int | None) -> tuple[str, int]:
        if addr is not None:
            return addr, int(port or free_port())
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        probe = ray.remote(num_cpus=0)(probe_node).options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=self.bundle_indices[0]
            )
        )
        ref = probe.remote()
        ready, _ = ray.wait([ref], timeout=self.timeout_s)
        if not ready:
            raise WorkerTimeout(self.role, 0, "probe_master", self.timeout_s)
        ip, free = ray.get(ref)
        return ip, int(port or free)

    def _local_ranks(self) -> tuple[list[int], list[int]]:
        """Position of each rank among this group's ranks on the same node, and their count."""
        from ray.util.placement_group import placement_group_table

        nodes = placement_group_table(self.pg).get("bundles_to_node_id", {})
        node_of = [str(nodes.get(b, nodes.get(str(b), "?"))) for b in self.bundle_indices]
        self.node_ids = node_of
        local = [node_of[:r].count(node_of[r]) for r in range(self.world_size)]
        sizes = [node_of.count(node_of[r]) for r in range(self.world_size)]
        return local, sizes

    # -- calls --------------------------------------------------------------------------------
    @property
    def actors(self) -> list[Any]:
        """The actor handles, in rank order (empty after `kill`)."""
        return list(self._actors)

    def __len__(self) -> int:
        return self.world_size

    def _handle(self, rank: int) -> Any:
        if self._killed:
            raise WorkerGroupError(f"{self.role} worker group was shut down")
        if not 0 <= rank < self.world_size:
            raise IndexError(f"{self.role}: rank {rank} out of range 0..{self.world_size - 1}")
        return self._actors[rank]

    def _submit(self, rank: int, method: Method, args: Sequence, kwargs: dict) -> ObjectRef:
        method = method if isinstance(method, str) else method.__name__
        ref = getattr(self._handle(rank), method).remote(*args, **kwargs)
        self._calls[ref] = (rank, method)
        return ref

    def _submit_all(self, method: Method, args: Sequence, kwargs: dict, share: bool) -> list:
        if share:
            args, kwargs = self._share_all(args, kwargs)
        return [self._submit(r, method, args, kwargs) for r in range(self.world_size)]

    def _share_all(self, args: Sequence, kwargs: dict) -> tuple[list, dict]:
        """Store arguments every rank receives once in the object store, not once per rank."""
        if self.world_size == 1:
            return list(args), dict(kwargs)
        return [share(a) for a in args], {k: share(v) for k, v in kwargs.items()}

    def execute_all_async(self, method: Method, *args: Any, **kwargs: Any) -> list[ObjectRef]:
        """Call `method(*args, **kwargs)` on every rank; refs in rank order (see `gather`)."""
        return self._submit_all(method, args, kwargs, share=True)

    def execute_all(self, method: Method, *args: Any, **kwargs: Any) -> list[Any]:
        """Call `method` on every rank with the same arguments; results in rank order."""
        return self.gather(self.execute_all_async(method, *args, **kwargs))

    def execute_rank_async(self, rank: int, method: Method, *args: Any, **kwargs: Any) -> ObjectRef:
        return self._submit(rank, method, args, kwargs)

    def execute_rank(self, rank: int, method: Method, *args: Any, **kwargs: Any) -> Any:
        """Call `method` on one rank only."""
        return self.gather([self.execute_rank_async(rank, method, *args, **kwargs)])[0]

    def dispatch_async(
        self, method: Method, per_rank_args: Sequence[Any], *args: Any, **kwargs: Any
    ) -> list[ObjectRef]:
        """Rank r runs `method(per_rank_args[r], *args, **kwargs)`."""
        if len(per_rank_args) != self.world_size:
            raise ValueError(
                f"{self.role}: {len(per_rank_args)} payloads for {self.world_size} ranks"
            )
        shared, shared_kw = self._share_all(args, kwargs)
        return [
            self._submit(r, method, (per_rank_args[r], *shared), shared_kw)
            for r in range(self.world_size)
        ]

    def dispatch(self, method: Method, per_rank_args: Sequence[Any], *args: Any, **kwargs: Any):
        """A different first argument per rank (e.g. a batch chunk); results in rank order."""
        return self.gather(self.dispatch_async(method, per_rank_args, *args, **kwargs))

    # -- data parallelism ---------------------------------------------------------------------
    def set_dp_ranks(self, dp_rank_of: Sequence[int]) -> None:
        """Give the data-parallel index of every rank (ranks of one DP group share an index)."""
        mapping = [int(d) for d in dp_rank_of]
        if len(mapping) != self.world_size:
            raise ValueError(f"{self.role}: {len(mapping)} DP ranks for {self.world_size} ranks")
        if set(mapping) != set(range(max(mapping) + 1)):
            raise ValueError(f"{self.role}: DP ranks {mapping} are not 0..k with none missing")
        self._dp_ranks = mapping

    def dp_ranks(self, refresh: bool = False) -> list[int]:
        """DP index of every rank; asked once from the workers (`Worker.dp_rank()`) if not set.

        Ask after the workers' parallel init, or call `set_dp_ranks` yourself.
        """
        if self._dp_ranks is None or refresh:
            self.set_dp_ranks(self.execute_all("dp_rank"))
        assert self._dp_ranks is not None
        return list(self._dp_ranks)

    @property
    def dp_size(self) -> int:
        return max(self.dp_ranks()) + 1

    def split_by_dp(self, items: Sequence) -> list[Sequence]:
        """One contiguous equal chunk of `items` per DP rank, in DP order."""
        return split_evenly(items, self.dp_size)

    def dispatch_by_dp_async(
        self, method: Method, per_dp_args: Sequence[Any], *args: Any, **kwargs: Any
    ) -> list[ObjectRef]:
        dp = self.dp_ranks()
        if len(per_dp_args) != max(dp) + 1:
            raise ValueError(f"{self.role}: {len(per_dp_args)} payloads for DP size {max(dp) + 1}")
        # ranks of one DP group get the same object: store each chunk once
        shared = self.world_size > len(per_dp_args)
        refs = [share(a) if shared else a for a in per_dp_args]
        return self.dispatch_async(method, [refs[d] for d in dp], *args, **kwargs)

    def dispatch_by_dp(self, method: Method, per_dp_args: Sequence[Any], *args: Any, **kwargs: Any):
        """Rank r runs `method(per_dp_args[dp_rank_of(r)], ...)`; results in rank order."""
        return self.gather(self.dispatch_by_dp_async(method, per_dp_args, *args, **kwargs))

    def collect_by_dp(self, results: Sequence[Any]) -> list[Any]:
        """One result per DP rank: the first non-None among the ranks of that DP group.

        Workers that do not hold an output (a TP rank > 0, a non-last pipeline stage) return
        None; the one that does wins.
        """
        dp = self.dp_ranks()
        out: list[Any] = [None] * (max(dp) + 1)
        for rank, value in enumerate(results):
            if out[dp[rank]] is None:
                out[dp[rank]] = value
        return out

    # -- waiting ------------------------------------------------------------------------------
    def gather(
        self, refs: Sequence[ObjectRef], timeout_s: float | None = None, hint: str = ""
    ) -> list[Any]:
        """Wait for `refs` (from this group's *_async calls) and return their values in order.

        Raises `WorkerFailure` when an actor died, `WorkerCallError` when a method raised and
        `WorkerTimeout` after `timeout_s` (default: the group's `timeout_s`).
        """
        import ray

        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        meta = [self._calls.pop(ref, (i, "call")) for i, ref in enumerate(refs)]
        position = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        deadline = time.monotonic() + timeout
        next_node_check = time.monotonic() + POLL_S
        while pending:
            if time.monotonic() >= next_node_check:
                self._raise_if_a_node_died(meta[position[pending[0]]])
                next_node_check = time.monotonic() + POLL_S
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for ref in pending:  # still running: the caller may gather them again
                    self._calls[ref] = meta[position[ref]]
                ranks = tuple(sorted(meta[position[r]][0] for r in pending))
                method = meta[position[pending[0]]][1]
                raise WorkerTimeout(self.role, ranks[0], method, timeout, ranks, hint)
            ready, pending = ray.wait(pending, num_returns=1, timeout=min(remaining, POLL_S))
            for ref in ready:
                i = position[ref]
                results[i] = self._get(ref, *meta[i])
        return results

    def _get(self, ref: ObjectRef, rank: int, method: str) -> Any:
        import ray
        from ray import exceptions as rex

        try:
            return ray.get(ref)
        except rex.RayActorError as exc:
            what = "__init__" if method == "__ray_ready__" else method
            self._raise_if_a_node_died((rank, what), exc)
            raise WorkerFailure(self.role, rank, error_reason(exc), what) from exc
        except rex.RayTaskError as exc:  # raised by the method; its peer on a lost node?
            self._raise_if_a_node_died((rank, method), exc)
            raise WorkerCallError(self.role, rank, method, str(exc)) from exc
        except rex.RayError as exc:  # worker crashed, object lost, node died
            self._raise_if_a_node_died((rank, method), exc)
            raise WorkerFailure(self.role, rank, error_reason(exc), method) from exc

    def _raise_if_a_node_died(
        self, call: tuple[int, str], cause: BaseException | None = None
    ) -> None:
        """`NodeLost` naming the node and every role rank it held, when Ray reports a node of
        this run's groups dead, or, after a failed call (`cause`), whose raylet refuses
        connections (this group's own nodes first). An actor that dies on a live node stays a
        `WorkerFailure`, a method that raises on one a `WorkerCallError`."""
        own = {n for n in self.node_ids if n}
        probe = cause is not None  # a call failed: ask the raylets too, not only Ray's verdict
        dead = dead_nodes(own, probe) or dead_nodes(placed_nodes() - own, probe)
        if not dead:
            return
        node = dead[0]
        rank, method = call
        reason = node.reason + (f" (the call failed: {type(cause).__name__})" if cause else "")
        lost = NodeLost(
            self.role, rank, node.ip, node.node_id, held_by(node.node_id), reason, method
        )
        if cause is not None:
            raise lost from cause
        raise lost

    def check_alive(self, timeout_s: float = 2.0) -> None:
        """Raise `WorkerFailure` if any actor is dead. A busy actor counts as alive.

        A no-op call is queued on every actor: a dead one answers with an error at once, a live
        one either answers or is still busy with earlier work when `timeout_s` runs out.
        """
        import ray

        refs = self._submit_all("__ray_ready__", (), {}, share=False)
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for ref in pending:
            self._calls.pop(ref, None)
        for ref in ready:
            rank, method = self._calls.pop(ref)
            self._get(ref, rank, "check_alive")

    # -- teardown -----------------------------------------------------------------------------
    def kill(self) -> None:
        """Kill the actors this group started (by handle). Safe to call more than once."""
        import ray

        actors, self._actors = self._actors, []
        self._killed = True
        unregister(self)
        self._calls.clear()
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already dead, or Ray is gone: nothing left to kill
                pass

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Kill the actors and wait (bounded) until Ray reports each of them dead."""
        import ray

        actors = self._actors
        self.kill()
        if not actors or not ray.is_initialized():
            return
        refs = []
        for actor in actors:
            try:
                refs.append(actor.__ray_ready__.remote())
            except Exception:
                pass
        if refs:  # a killed actor's call fails quickly; that is the confirmation
            ray.wait(refs, num_returns=len(refs), timeout=timeout_s)

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
