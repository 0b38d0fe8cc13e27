"""Worker groups on a real local Ray cluster: placement, env, gloo, dispatch, failures.

One embedded cluster (4 logical CPUs) for the whole module, started through
`start_or_connect` and shut down at the end. Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

ray = pytest.importorskip("ray")

from mindrl.accelerator import get_accelerator  # noqa: E402
from mindrl.cluster.errors import (  # noqa: E402
    PlacementGroupTimeout,
    WorkerCallError,
    WorkerFailure,
    WorkerTimeout,
)
from mindrl.cluster.placement import DeviceGroup, PlacementPlan, RoleLayout  # noqa: E402
from mindrl.cluster.placement_groups import (  # noqa: E402
    bundle_indices,
    cpus_per_worker,
    create_placement_groups,
    remove_placement_groups,
)
from mindrl.cluster.ray_cluster import repo_root, start_or_connect  # noqa: E402
from mindrl.cluster.worker import Worker  # noqa: E402
from mindrl.cluster.worker_group import WorkerGroup  # noqa: E402
from mindrl.config.run import RuntimeConfig  # noqa: E402
from tests.bounds import call_within  # noqa: E402

# The worker classes below live in this test module, which Ray workers cannot import: ship
# them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

TIMEOUT = 60.0
LOCAL = {"master_addr": "127.0.0.1"}  # single node: loopback rendezvous, no probe task
ENV_NAMES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "MINDRL_ROLE",
    "MINDRL_ACCELERATOR",
    "TOKENIZERS_PARALLELISM",
    "PYTHONPATH",
    "EXTRA",
)


class ProbeWorker(Worker):
    def env(self) -> dict:
        return {n: os.environ.get(n) for n in ENV_NAMES}

    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    def init_dist(self) -> tuple[int, int]:
        from datetime import timedelta

        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
        return dist.get_rank(), dist.get_world_size()

    def all_reduce(self, values: list[float]) -> list[float]:
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64) * (self.rank + 1)
        dist.all_reduce(t)
        return t.tolist()

    def init_parallel(self, tp: int) -> None:
        """TP innermost, as megatron lays ranks out: ranks r, r+1 share a DP index."""
        self.set_dp_rank(self.rank // tp)

    def take(self, chunk: list[int], offset: int = 0) -> tuple[int, list[int]]:
        return self.rank, [x + offset for x in chunk]

    def sum_on_tp0(self, chunk: list[int]) -> int | None:
        return sum(chunk) if self.rank % 2 == 0 else None

    def fail(self) -> None:
        raise ValueError("bad input on purpose")


class BrokenWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        raise RuntimeError("constructor broken on purpose")


def _plan(*groups: DeviceGroup) -> PlacementPlan:
    return PlacementPlan(resource="CPU", groups=tuple(groups))


def _colocated_group() -> DeviceGroup:
    roles = (RoleLayout("actor", 2, 1, 1, 2), RoleLayout("ref", 2, 1, 1, 2))
    return DeviceGroup("actor+ref", roles, 2, {"CPU": 1.0}, "STRICT_PACK")


def _wait_until(pred, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return pred()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture(scope="module")
def colocated(cluster):
    """actor and ref roles sharing one placement group's 2 bundles, 0.5 CPU per worker."""
    group = _colocated_group()
    pgs = create_placement_groups(_plan(group), timeout_s=TIMEOUT)
    pg = pgs[group.name]
    cpus = cpus_per_worker(group)
    kw = dict(num_cpus_per_worker=cpus, master_addr=cluster.master_addr, timeout_s=TIMEOUT)
    actor = WorkerGroup(
        ProbeWorker, "actor", pg, bundle_indices(group, "actor"), env={"EXTRA": "a"}, **kw
    )
    ref = WorkerGroup(ProbeWorker, "ref", pg, bundle_indices(group, "ref"), **kw)
    yield group, pg, actor, ref
    actor.shutdown()
    ref.shutdown()
    remove_placement_groups(pgs)


def test_embedded_cluster_is_local_and_private(cluster):
    assert cluster.embedded and cluster.owns_connection
    assert cluster.is_single_node()
    assert cluster.master_addr == "127.0.0.1"
    nodes = cluster.cluster_resources().nodes
    assert len(nodes) == 1 and nodes[0]["CPU"] == 4.0
    # no dashboard unless asked for; never bound to every interface
    assert cluster.init_kwargs["include_dashboard"] is False
    assert cluster.init_kwargs.get("dashboard_host", "127.0.0.1") == "127.0.0.1"
    assert cluster.init_kwargs["namespace"] == "mindrl"


IDLE_WATCH_S = 3.0  # Ray starts its idle task workers right after the driver connects


def _idle_task_workers() -> list[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.cmdline()[:1] == ["ray::IDLE"]:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_embedded_cluster_starts_no_idle_task_workers(cluster):
    """One idle Python worker per CPU, started ahead for tasks mindrl never sends, would sit
    in memory the whole run (~60 MB each); actors start their own when created."""
    deadline = time.monotonic() + IDLE_WATCH_S
    while time.monotonic() < deadline:
        assert not _idle_task_workers()
        time.sleep(0.2)


def test_nested_start_reuses_and_leaves_ray_running(cluster):
    with start_or_connect(RuntimeConfig(), get_accelerator("cpu")) as inner:
        assert not inner.owns_connection and not inner.embedded
    assert ray.is_initialized()
    assert ray.cluster_resources()["CPU"] == 4.0


def test_colocated_roles_share_bundles_and_get_env(cluster, colocated):
    group, pg, actor, ref = colocated
    assert cpus_per_worker(group) == 0.5
    # the placement group reserved 2 bundles x 1 CPU out of 4, colocated roles add nothing
    assert ray.available_resources().get("CPU", 0.0) == pytest.approx(4.0 - 2 * 1.0)
    for wg, role in ((actor, "actor"), (ref, "ref")):
        envs = wg.execute_all("env")
        for rank, env in enumerate(envs):
            assert env["RANK"] == str(rank)
            assert env["WORLD_SIZE"] == "2"
            assert env["LOCAL_RANK"] == str(rank)  # one node: position among the group's ranks
            assert env["LOCAL_WORLD_SIZE"] == "2"
            assert env["MASTER_ADDR"] == "127.0.0.1"
            assert env["MASTER_PORT"] == str(wg.master_port)
            assert env["MINDRL_ROLE"] == role
            # job-level runtime_env from start_or_connect, merged with the per-actor env
            assert env["MINDRL_ACCELERATOR"] == "cpu"
            assert env["TOKENIZERS_PARALLELISM"] == "false"
            assert env["PYTHONPATH"].split(os.pathsep)[0] == str(repo_root())
        assert [e["EXTRA"] for e in envs] == (["a", "a"] if role == "actor" else [None, None])
    assert actor.master_port != ref.master_port
    assert actor.execute_all("ping") == [0, 1]
    assert ref.execute_rank(1, "ping") == 1


def test_colocated_bundle_is_full(cluster, colocated):
    """A third 0.5-CPU worker on a bundle already holding two cannot start: timeout, not hang."""
    group, pg, _, _ = colocated
    with pytest.raises(WorkerTimeout) as err:
        call_within(  # a hang guard at the module's TIMEOUT, far above the call's own 3 s
            lambda: WorkerGroup(
                ProbeWorker, "extra", pg, [0], num_cpus_per_worker=0.5, **LOCAL, timeout_s=3
            ),
            TIMEOUT,
        )
    assert err.value.timeout == 3
    assert err.value.role == "extra" and err.value.rank == 0
    assert "bundle big enough" in str(err.value)


def test_gloo_all_reduce_over_actor_group(colocated):
    _, _, actor, _ = colocated
    assert actor.execute_all("init_dist") == [(0, 2), (1, 2)]
    values = [1.0, 2.0, 3.0]
    # rank r contributes values * (r + 1); the sum over r = 0, 1 is values * (1 + 2)
    expected = [v * (1 + 2) for v in values]
    assert actor.execute_all("all_reduce", values) == [expected, expected]


def test_method_error_names_rank_and_keeps_actor(colocated):
    _, _, _, ref = colocated
    with pytest.raises(WorkerCallError) as err:
        ref.execute_rank(1, "fail")
    assert err.value.rank == 1 and err.value.method == "fail"
    assert "bad input on purpose" in str(err.value)
    ref.check_alive()  # still alive


def test_dispatch_by_dp_rank(cluster):
    group = DeviceGroup("tp2", (RoleLayout("actor", 2, 2, 1, 1),), 2, {"CPU": 1.0}, "PACK")
    pgs = create_placement_groups(_plan(group), timeout_s=TIMEOUT)
    # 4 ranks on 2 bundles; master_addr None: ask rank 0's node for its IP and a free port
    wg = WorkerGroup(
        ProbeWorker, "actor", pgs["tp2"], [0, 0, 1, 1], num_cpus_per_worker=0.5, timeout_s=TIMEOUT
    )
    try:
        assert wg.master_addr == ray.util.get_node_ip_address()
        assert {e["MASTER_ADDR"] for e in wg.execute_all("env")} == {wg.master_addr}
        assert [e["LOCAL_RANK"] for e in wg.execute_all("env")] == ["0", "1", "2", "3"]
        wg.execute_all("init_parallel", 2)
        assert wg.dp_ranks() == [0, 0, 1, 1]  # asked from the workers after their init
        assert wg.dp_size == 2
        items = list(range(8))
        chunks = wg.split_by_dp(items)
        assert chunks == [[0, 1, 2, 3], [4, 5, 6, 7]]
        out = wg.dispatch_by_dp("take", chunks, offset=100)
        assert out == [
            (0, [100, 101, 102, 103]),
            (1, [100, 101, 102, 103]),
            (2, [104, 105, 106, 107]),
            (3, [104, 105, 106, 107]),
        ]
        sums = wg.collect_by_dp(wg.dispatch_by_dp("sum_on_tp0", chunks))
        assert sums == [0 + 1 + 2 + 3, 4 + 5 + 6 + 7]
        # a different payload per rank
        assert wg.dispatch("take", [[r] for r in range(4)]) == [(r, [r]) for r in range(4)]
        with pytest.raises(ValueError, match="evenly"):
            wg.split_by_dp(list(range(7)))
    finally:
        wg.shutdown()
        remove_placement_groups(pgs)


def test_timeout_then_sigkill_surfaces_and_shutdown_cleans_up(cluster):
    group = DeviceGroup("victim", (RoleLayout("victim", 2, 1, 1, 2),), 2, {"CPU": 1.0}, "PACK")
    pgs = create_placement_groups(_plan(group), timeout_s=TIMEOUT)
    wg = WorkerGroup(
        ProbeWorker, "victim", pgs["victim"], [0, 1], master_addr="127.0.0.1", timeout_s=TIMEOUT
    )
    try:
        pids = wg.execute_all("pid")
        assert len(set(pids)) == 2 and os.getpid() not in pids
        refs = wg.execute_all_async("sleep", 30.0)
        with pytest.raises(WorkerTimeout) as tmo:  # not the 30 s sleep's results
            wg.gather(refs, timeout_s=1.0)
        assert tmo.value.timeout == 1.0
        assert tmo.value.method == "sleep" and tmo.value.pending_ranks == (0, 1)

        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(WorkerFailure) as err:  # not WorkerTimeout after TIMEOUT: noticed
            wg.gather(refs)  # the same refs again: rank 1's now fails
        assert err.value.role == "victim" and err.value.rank == 1
        assert "victim worker rank 1 died during sleep()" in str(err.value)
        with pytest.raises(WorkerFailure) as again:
            wg.check_alive()
        assert again.value.rank == 1
    finally:
        wg.shutdown()
        wg.shutdown()  # twice is fine
        remove_placement_groups(pgs)
    assert _wait_until(lambda: all(_gone(p) for p in pids), 20), "actor processes left behind"
    with pytest.raises(Exception, match="shut down"):
        wg.execute_all("ping")


def test_constructor_failure_is_a_worker_failure(cluster):
    group = DeviceGroup("broken", (RoleLayout("broken", 1, 1, 1, 1),), 1, {"CPU": 1.0}, "PACK")
    pgs = create_placement_groups(_plan(group), timeout_s=TIMEOUT)
    try:
        with pytest.raises(WorkerFailure) as err:
            WorkerGroup(
                BrokenWorker, "broken", pgs["broken"], [0], master_addr="127.0.0.1", timeout_s=30
            )
        assert err.value.rank == 0 and err.value.method == "__init__"
        assert "constructor broken on purpose" in str(err.value)
    finally:
        remove_placement_groups(pgs)


def test_unsatisfiable_placement_group_times_out_and_releases(cluster):
    before = ray.available_resources().get("CPU", 0.0)
    ok = DeviceGroup("fits", (RoleLayout("actor", 1, 1, 1, 1),), 1, {"CPU": 1.0}, "PACK")
    bad = DeviceGroup("reward", (RoleLayout("reward", 2, 1, 1, 2),), 2, {"CPU": 8.0}, "STRICT_PACK")
    with pytest.raises(PlacementGroupTimeout) as err:
        call_within(  # a hang guard at the module's TIMEOUT, far above the call's own 2 s
            lambda: create_placement_groups(_plan(ok, bad), timeout_s=2.0), TIMEOUT
        )
    msg = str(err.value)
    assert "'reward'" in msg and "2 bundle(s) of {CPU: 8}" in msg and "STRICT_PACK" in msg
    assert "cluster available {CPU: " in msg and "1 node(s)" in msg
    # the group that did fit was released again
    assert _wait_until(lambda: ray.available_resources().get("CPU", 0.0) == before, 10)


def test_connect_from_another_driver_leaves_cluster_up(cluster):
    script = textwrap.dedent(
        f"""
        from mindrl.accelerator import get_accelerator
        from mindrl.cluster.ray_cluster import start_or_connect
        from mindrl.config.run import RuntimeConfig

        rt = RuntimeConfig(ray_address={cluster.gcs_address!r})
        with start_or_connect(rt, get_accelerator("cpu")) as c:
            print("NODES", len(c.cluster_resources().nodes), c.embedded, c.owns_connection)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(repo_root()))
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "NODES 1 False True" in proc.stdout
    # the other driver disconnected; our cluster still runs work
    assert ray.get(ray.remote(lambda: 41 + 1).options(num_cpus=0).remote(), timeout=60) == 42
