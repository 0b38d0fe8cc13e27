"""Start an embedded Ray cluster or connect to a running one, and stop only what we started.

`start_or_connect(runtime, accelerator)` returns a `RayCluster` that is also a context manager:

    with start_or_connect(run.runtime, acc) as cluster:
        pgs = create_placement_groups(plan, timeout_s=...)
        ...

- `runtime.ray_address` None: an embedded single-node cluster (`ray.init(num_cpus=...)`), stopped
  on exit. The dashboard is off unless asked for, and then binds 127.0.0.1 unless configured.
- `runtime.ray_address` "auto" or host:port: connect to a cluster started with `ray start`; on exit
  the driver only disconnects (`ray.shutdown()` in a connected driver leaves the cluster up).
- Ray already initialised in this process by someone else: reuse it and touch nothing on exit.

Workers get the driver's mindrl-relevant environment (see `worker_env_vars`) through the job's
`runtime_env`, so a remote cluster's workers import this mindrl and see the same settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindrl.accelerator import Accelerator
from mindrl.cluster.placement import ClusterResources
from mindrl.config.run import RuntimeConfig

NAMESPACE = "mindrl"

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
    at an explicit HOST:PORT then rejects the driver. Use the local token when there is one."""
    if not address or address == "auto" or "RAY_AUTH_MODE" in os.environ:
        return
    if (Path.home() / ".ray" / "auth_token").is_file() or os.environ.get("RAY_AUTH_TOKEN"):
        os.environ["RAY_AUTH_MODE"] = "token"


def ray_init_kwargs(
    runtime: RuntimeConfig, accelerator: Accelerator, environ: dict[str, str] | None = None
) -> dict[str, Any]:
    """The keyword arguments for `ray.init` (pure; no Ray import, so it is unit-testable)."""
    kwargs: dict[str, Any] = {
        "namespace": NAMESPACE,
        "log_to_driver": True,
        "runtime_env": {"env_vars": worker_env_vars(accelerator, environ)},
    }
    if runtime.ray_address:
        kwargs["address"] = runtime.ray_address
        return kwargs
    kwargs["num_cpus"] = int(runtime.ray_num_cpus or os.cpu_count() or 1)
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
    init_kwargs: dict[str, Any] = field(default_factory=dict, repr=False)
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

        One node: `runtime.master_addr` (127.0.0.1 by default: Ray reports eth0's address even on
        a single box, and loopback is what a single-node gloo rendezvous should use). Several
        nodes: None, meaning "the IP of the node hosting rank 0", which the worker group asks
        that node for (`WorkerGroup(master_addr=None)`).
        """
        return self.runtime.master_addr if self.is_single_node() else None

    def shutdown(self) -> None:
        """Stop the embedded cluster / disconnect; a no-op if Ray was not ours. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.owns_connection:
            import ray

            ray.shutdown()

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def start_or_connect(runtime: RuntimeConfig, accelerator: Accelerator) -> RayCluster:
    """Start an embedded cluster (`ray_address` None) or connect to `ray_address`.

    If Ray is already initialised in this process (a test fixture, an outer launcher), that
    session is reused and left running on exit.
    """
    import ray

    if ray.is_initialized():
        return RayCluster(runtime, accelerator, embedded=False, owns_connection=False)
    kwargs = ray_init_kwargs(runtime, accelerator)
    use_token_auth_for_address(runtime.ray_address)
    ray.init(**kwargs)
    return RayCluster(
        runtime,
        accelerator,
        embedded=not runtime.ray_address,
        owns_connection=True,
        init_kwargs=kwargs,
    )
