"""What the cluster offers -- read from a running Ray cluster, or predicted for an embedded one --
and which accelerator a config targets, so a dry run can plan for a cluster it is not on."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from mindrl.accelerator import Accelerator
from mindrl.cluster.placement import ClusterResources

# MindSpeed's names for its Ascend fused kernels (megatron-core and TE have none of them): a
# config that switches them on was written for NPUs.
NPU_KERNEL_FLAGS = ("use_fused_rmsnorm", "use_fused_swiglu", "use_fused_rotary_pos_emb")
# A key named after Ascend's stack (npu_deterministic, use_ascend_coc, hccl_buffersize,
# ascend_scheduler_config_enabled, ...) is NPU-only whatever its value. `num_npus` is not: it
# is every mindrl config's device count, CPU configs included.
_NPU_WORDS = ("npu", "ascend", "hccl")
_NEUTRAL_KEYS = frozenset({"num_npus"})
_MAX_SHOWN = 3


def embedded_cluster_resources(acc: Accelerator, num_cpus: int | None = None) -> ClusterResources:
    """The single node an embedded `ray.init()` on this machine would offer."""
    node: dict[str, float] = {"CPU": float(num_cpus or os.cpu_count() or 1)}
    if not acc.is_cpu:
        node[acc.ray_resource] = float(acc.device_count())
    return ClusterResources(nodes=(node,))


def running_cluster_resources(
    address: str, source: str = "runtime.ray_address"
) -> ClusterResources:
    """Per-node resources of the Ray cluster at `address` (connects; starts nothing).

    Raises RayConnectError (one line naming `address` and `source`) when it does not answer."""
    from mindrl.cluster.ray_cluster import use_token_auth_for_address
    from mindrl.cluster.ray_target import RayTarget, check_reachable, connect_error

    target = RayTarget(address, source)
    check_reachable(target)  # one line at once, rather than Ray's long retries
    use_token_auth_for_address(address)  # before Ray is imported: it reads RAY_AUTH_MODE then
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except (ConnectionError, TimeoutError) as exc:
            raise connect_error(target, exc) from None
        except RuntimeError as exc:  # e.g. the GCS refused our auth token
            if not str(exc).startswith("Failed to connect"):
                raise
            raise connect_error(target, exc) from None
    try:
        nodes = tuple(
            {k: float(v) for k, v in n["Resources"].items()} for n in ray.nodes() if n["Alive"]
        )
    finally:
        if started_here:
            ray.shutdown()
    return ClusterResources(nodes=nodes)


def describe_resources(cluster: ClusterResources) -> str:
    """`2 node(s): NPU 16, CPU 384` -- the device-like totals a plan draws on."""
    names = ("NPU", "GPU", "CPU")
    totals = ", ".join(f"{n} {cluster.total(n):g}" for n in names if cluster.total(n))
    return f"{len(cluster.nodes)} node(s): {totals or 'no CPU/GPU/NPU'}"


# -- the accelerator a config targets -------------------------------------------------------------


def _leaves(tree: Mapping[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        here = (*path, str(key))
        if isinstance(value, Mapping):
            yield from _leaves(value, here)
        else:
            yield ".".join(here), value


def target_hints(raw: Mapping[str, Any]) -> dict[str, list[str]]:
    """The keys of a composed config that only make sense on one accelerator: {"npu": [...],
    "cuda": [...]} (key paths). `runtime` is left out: runtime.accelerator says it outright."""
    hints: dict[str, list[str]] = {"npu": [], "cuda": []}
    for section, tree in raw.items():
        if section == "runtime" or not isinstance(tree, Mapping):
            continue
        for path, value in _leaves(tree, (str(section),)):
            key = path.rsplit(".", 1)[-1].lower()
            if key in NPU_KERNEL_FLAGS and value is True:
                hints["npu"].append(path)
            elif key == "distributed_backend" and str(value).lower() == "hccl":
                hints["npu"].append(f"{path}: hccl")
            elif key not in _NEUTRAL_KEYS and any(w in key for w in _NPU_WORDS):
                hints["npu"].append(path)
            elif key == "num_gpus" and section == "rl_config":
                hints["cuda"].append(path)
    return hints


def declared_accelerator(raw: Mapping[str, Any]) -> tuple[str | None, str]:
    """The accelerator the config's own keys point at (None when they do not, or disagree),
    and the keys that say so."""
    hints = target_hints(raw)
    npu, cuda = hints["npu"], hints["cuda"]

    def shown(keys: list[str]) -> str:
        more = f", ... ({len(keys)} in all)" if len(keys) > _MAX_SHOWN else ""
        return ", ".join(keys[:_MAX_SHOWN]) + more

    if npu and cuda:
        return None, f"NPU-only settings ({shown(npu)}) and GPU resources ({shown(cuda)}) disagree"
    if npu:
        return "npu", f"NPU-only settings in the config ({shown(npu)})"
    if cuda:
        return "cuda", f"GPU resources in the config ({shown(cuda)})"
    return None, "no device-specific settings in the config"


def planning_target(
    requested: str, raw: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> tuple[str, str]:
    """The accelerator a dry run plans for, and why.

    1. `runtime.accelerator` npu / cuda / cpu: that one.
    2. auto + MINDRL_ACCELERATOR: that one (what auto obeys in a real run too).
    3. auto + device-specific keys (`declared_accelerator`): the config's target -- so a
       MindSpeed-RL config plans NPU bundles on a laptop.
    4. auto otherwise: what this machine has (npu, then cuda, then cpu).
    """
    env = os.environ if environ is None else environ
    if requested != "auto":
        return requested, f"runtime.accelerator: {requested}"
    chosen = env.get("MINDRL_ACCELERATOR")
    if chosen:
        if chosen not in ("npu", "cuda", "cpu"):
            from mindrl.accelerator import AcceleratorError

            raise AcceleratorError(f"MINDRL_ACCELERATOR={chosen!r} is not one of npu, cuda, cpu")
        return chosen, f"runtime.accelerator auto, MINDRL_ACCELERATOR={chosen}"
    name, why = declared_accelerator(raw)
    if name:
        return name, f"runtime.accelerator auto, the config's target: {why}"
    from mindrl.accelerator import detect_accelerator_name

    return detect_accelerator_name(), "runtime.accelerator auto, detected on this machine"
