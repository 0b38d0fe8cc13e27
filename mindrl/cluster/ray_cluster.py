"""Start an embedded Ray cluster or connect to a running one, and stop only what we started.

`start_or_connect(runtime, accelerator)` returns a `RayCluster` that is also a context manager:

    with start_or_connect(run.runtime, acc) as cluster:
        pgs = create_placement_groups(plan, timeout_s=...)
        ...

- `runtime.ray_address` None: join the cluster a plain `ray.init()` would join (see
  `resolve_ray_target`: `RAY_ADDRESS`, else the `ray_current_cluster` file `ray start` writes),
  as MindSpeed-RL users expect after `ray start --head`; when there is none, an embedded
  single-node cluster (`ray.init(address="local", num_cpus=...)`), stopped on exit. Every Ray
  process of it listens on 127.0.0.1 only (see `LOOPBACK_ONLY_ENV`); the
  dashboard is off unless asked for, and then binds `runtime.ray_dashboard_host` (127.0.0.1).
  A watchdog process (`python -m mindrl.cluster.launch watchdog`) ends the cluster's processes
  by PID if the driver is killed before it can stop them.
- `runtime.ray_address` "auto" or host:port: connect to a cluster started with `ray start`; on exit
  the driver only disconnects (`ray.shutdown()` in a connected driver leaves the cluster up).
  "local" (Ray's own spelling): always the embedded cluster, whatever is running.
- Ray already initialised in this process by someone else: reuse it and touch nothing on exit.

Workers get the driver's mindrl-relevant environment (see `worker_env_vars`) through the job's
`runtime_env`, so a remote cluster's workers import this mindrl and see the same settings.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindrl.accelerator import Accelerator
from mindrl.cluster.placement import ClusterResources
from mindrl.cluster.ray_target import (
    RayTarget,
    check_reachable,
    connect_error,
    resolve_ray_target,
)
from mindrl.config.run import RuntimeConfig

NAMESPACE = "mindrl"
LOOPBACK = "127.0.0.1"

logger = logging.getLogger(__name__)

# On Linux Ray turns a node IP of 127.0.0.1 into the machine's routable address
# (`ray._private.services.resolve_ip_for_localhost`), and its gRPC servers (GCS, raylet, object
# manager, core workers), the dashboard and runtime-env agents and the metrics exporters bind
# loopback only when the node IP *is* loopback, all interfaces otherwise. Ray's switch for a
# loopback-only local node is this variable (what it does by default on macOS / Windows); Ray
# reads it when `ray` is imported, so it must be set before that. It also makes `ray start`
# refuse to join other nodes, so it is used for the embedded single-node cluster only.
LOOPBACK_ONLY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
NO_IDLE_WORKERS = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
# A call's arguments and result up to this size travel inside the call instead of through the
# object store (Ray's default: 100 KiB). A small run's step batch is just over Ray's default,
# and a store round trip costs more than copying it inline.
INLINE_CALL_BYTES = {"max_direct_call_object_size": 1 << 20}

# Driver variables that workers need to behave like the driver (offline hubs, asset cache,
# vLLM knobs). Names that look like secrets are never shipped: runtime_env is stored in the GCS.
_PROPAGATE_PREFIXES = ("MINDRL_", "VLLM_", "HF_", "TRANSFORMERS_", "HYDRA_", "HCCL_")
_PROPAGATE_NAMES = (
    "TOKENIZERS_PARALLELISM",
    "OMP_PROC_BIND",
    "GLOO_SOCKET_IFNAME",
    "CUDA_DEVICE_MAX_CONNECTIONS",
)
_SECRET_MARKERS = frozenset({"TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIALS", "PASS"})


def repo_root() -> Path:
    """The folder that holds the `mindrl` package (put on the workers' PYTHONPATH)."""
    return Path(__file__).resolve().parents[2]


def worker_env_vars(accelerator: Accelerator, environ: dict[str, str] | None = None) -> dict:
    """Environment every Ray worker of the job gets (the job-level runtime_env env_vars)."""
    environ = dict(os.environ if environ is None else environ)
    out: dict[str, str] = {}
    for name, value in environ.items():
        wanted = name.startswith(_PROPAGATE_PREFIXES) or name in _PROPAGATE_NAMES
        if wanted and not _SECRET_MARKERS.intersection(name.upper().split("_")):
            out[name] = value
    out.setdefault("TOKENIZERS_PARALLELISM", "false")
    out["MINDRL_ACCELERATOR"] = accelerator.name
    paths = [str(repo_root())] + [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return out


def use_token_auth_for_address(address: str | None) -> None:
    """Ray 2.60 turns token auth on for `address="auto"` only: a `ray start` cluster reached
    at an explicit HOST:PORT then rejects the driver. Use the local token when there is one.

    Ray reads RAY_AUTH_MODE into its config when imported: call this before `import ray`, or
    Ray's config is re-read here (what Ray itself does when it enables token auth)."""
    if not address or address in ("auto", "local") or "RAY_AUTH_MODE" in os.environ:
        return
    if (Path.home() / ".ray" / "auth_token").is_file() or os.environ.get("RAY_AUTH_TOKEN"):
        os.environ["RAY_AUTH_MODE"] = "token"
        if "ray" in sys.modules:
            try:
                from ray._raylet import Config  # type: ignore[attr-defined]  # compiled, untyped

                Config.initialize("")
            except (ImportError, AttributeError):  # another Ray: the variable alone must do
                pass


def ray_init_kwargs(
    runtime: RuntimeConfig, accelerator: Accelerator, environ: dict[str, str] | None = None
) -> dict[str, Any]:
    """The keyword arguments for `ray.init` (pure; no Ray import, so it is unit-testable)."""
    kwargs: dict[str, Any] = {
        "namespace": NAMESPACE,
        "log_to_driver": True,
        "runtime_env": {"env_vars": worker_env_vars(accelerator, environ)},
    }
    if runtime.ray_address and runtime.ray_address != "local":
        kwargs["address"] = runtime.ray_address
        return kwargs
    if runtime.ray_address == "local":  # never Ray's own discovery (RAY_ADDRESS, current file)
        kwargs["address"] = "local"
    kwargs["num_cpus"] = int(runtime.ray_num_cpus or os.cpu_count() or 1)
    # mindrl's workers are actors, each started when it is created: idle task workers that
    # Ray starts ahead (one per CPU, each a Python process's memory) would wait the whole run
    # for nothing
    kwargs["_system_config"] = {**NO_IDLE_WORKERS, **INLINE_CALL_BYTES}
    kwargs["_node_ip_address"] = LOOPBACK  # kept only with LOOPBACK_ONLY_ENV (see above)
    kwargs["include_dashboard"] = bool(runtime.ray_dashboard)
    if runtime.ray_dashboard:
        kwargs["dashboard_host"] = runtime.ray_dashboard_host
    if accelerator.name == "cuda":
        kwargs["num_gpus"] = accelerator.device_count()
    elif not accelerator.is_cpu:
        kwargs["resources"] = {accelerator.ray_resource: float(accelerator.device_count())}
    return kwargs


def alive_nodes() -> list[dict[str, Any]]:
    """`ray.nodes()` entries of the nodes that are alive."""
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4-mapped loopback (::ffff:127.0.0.1); "localhost" too."""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def start_watchdog(driver_pid: int | None = None) -> subprocess.Popen:
    """A separate process that ends this driver's process tree by PID if the driver dies
    without stopping its cluster (`stop_watchdog` tells it the shutdown was clean).

    Own session, so a Ctrl-C meant for the driver does not end it first; its stdin is the
    pipe it watches.
    """
    env = dict(os.environ)
    paths = [str(repo_root())] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    cmd = [sys.executable, "-m", "mindrl.cluster.launch", "watchdog"]
    cmd += ["--pid", str(driver_pid or os.getpid())]
    return subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, start_new_session=True
    )


def stop_watchdog(proc: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    """Tell the watchdog the cluster was stopped cleanly, and wait for it to leave."""
    if proc is None or proc.poll() is not None:
        return
    from mindrl.cluster.processes import WATCHDOG_STOP

    try:
        assert proc.stdin is not None
        proc.stdin.write(WATCHDOG_STOP)
        proc.stdin.close()
    except (OSError, ValueError):
        pass
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def is_single_node() -> bool:
    """True when the connected cluster has one alive node (then 127.0.0.1 is a valid master)."""
    return len(alive_nodes()) == 1


@dataclass
class RayCluster:
    """A handle on the Ray cluster this driver uses. Exit / `shutdown()` undo only our own init."""

    runtime: RuntimeConfig
    accelerator: Accelerator
    embedded: bool  # we started a fresh single-node cluster in this process
    owns_connection: bool  # we called ray.init, so we call ray.shutdown
    target: RayTarget | None = None  # None: Ray was already initialised by someone else
    init_kwargs: dict[str, Any] = field(default_factory=dict, repr=False)
    watchdog: subprocess.Popen | None = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)

    @property
    def gcs_address(self) -> str:
        import ray

        return ray.get_runtime_context().gcs_address

    def cluster_resources(self) -> ClusterResources:
        """Total resources of every alive node, one dict per node."""
        nodes = tuple({k: float(v) for k, v in n["Resources"].items()} for n in alive_nodes())
        return ClusterResources(nodes=nodes)

    def available_resources(self) -> dict[str, float]:
        """Resources not reserved yet, cluster-wide (`ray.available_resources()`)."""
        import ray

        return {k: float(v) for k, v in ray.available_resources().items()}

    def is_single_node(self) -> bool:
        return is_single_node()

    @property
    def master_addr(self) -> str | None:
        """torch.distributed master address for worker groups.

        One node: `runtime.master_addr` (127.0.0.1 by default: a single-node gloo rendezvous
        belongs on loopback, and a `ray start` node on one box reports its routable address).
        Several nodes: None, meaning "the IP of the node hosting rank 0", which the worker group
        asks that node for (`WorkerGroup(master_addr=None)`).
        """
        return self.runtime.master_addr if self.is_single_node() else None

    def shutdown(self) -> None:
        """Stop the embedded cluster / disconnect; a no-op if Ray was not ours. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.owns_connection:
                import ray

                ray.shutdown()
        finally:
            stop_watchdog(self.watchdog)

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def start_or_connect(runtime: RuntimeConfig, accelerator: Accelerator) -> RayCluster:
    """Join the cluster `resolve_ray_target` names, or start an embedded one.

    If Ray is already initialised in this process (a test fixture, an outer launcher), that
    session is reused and left running on exit.
    """
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            return RayCluster(runtime, accelerator, embedded=False, owns_connection=False)
    target = resolve_ray_target(runtime)
    embedded = target.embedded
    if embedded and "ray" not in sys.modules:
        os.environ.update(LOOPBACK_ONLY_ENV)
    if not embedded:
        use_token_auth_for_address(target.address)  # before Ray reads its config
        check_reachable(target)
    import ray

    if target.note:
        logger.warning("%s", target.note)
    logger.info("ray: %s %s", target.verb, target.describe())
    resolved = dataclasses.replace(runtime, ray_address=target.address or "local")
    kwargs = ray_init_kwargs(resolved, accelerator)
    from mindrl import logs

    if logs.driver_logging_active():
        logs.route_ray_driver_logs()  # Ray's driver-side lines go to the run's log file
        kwargs["configure_logging"] = False
    try:
        ray.init(**kwargs)
    except (ConnectionError, TimeoutError) as exc:
        if embedded:
            raise
        raise connect_error(target, exc) from None
    except RuntimeError as exc:  # e.g. the GCS refused our auth token
        if embedded or not str(exc).startswith("Failed to connect"):
            raise
        raise connect_error(target, exc) from None
    cluster = RayCluster(
        resolved,
        accelerator,
        embedded=embedded,
        owns_connection=True,
        init_kwargs=kwargs,
        target=target,
    )
    if embedded:
        node_ip = ray.util.get_node_ip_address()
        if not is_loopback(node_ip):
            logger.warning(
                "the embedded Ray cluster's node IP is %s, so its processes listen on all "
                "interfaces: Ray was imported before start_or_connect could set %s (set it in "
                "the environment to keep them on 127.0.0.1)",
                node_ip,
                " ".join(f"{k}={v}" for k, v in LOOPBACK_ONLY_ENV.items()),
            )
        try:
            cluster.watchdog = start_watchdog()
        except BaseException:
            cluster.shutdown()
            raise
    return cluster
